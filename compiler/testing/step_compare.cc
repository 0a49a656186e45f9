#include "compiler/testing/step_compare.h"

#include <cmath>
#include <iostream>
#include <random>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::compiler::testing {

float LrFor(const Device& device) { return device.is_cuda() ? kCudaLr : kCpuLr; }

TinyLlamaConfig WithCudaKernelShapes(TinyLlamaConfig c) {
  c.vocab = 64;
  c.dim = 128;
  c.heads = 2;
  c.kv_heads = 1;
  c.ffn = 256;
  return c;
}

StepData MakeStepData(graph::Graph forward, uint64_t seed, const StepDataOptions& o) {
  std::mt19937_64 rng(seed);
  StepData d;
  d.forward = std::move(forward);
  d.params = RandomParameters(d.forward, rng);
  if (o.small_matrices) {
    for (auto& [name, h] : d.params) {
      if (h.shape.size() == 2) {
        for (double& v : h.data) v *= 0.1;
      }
    }
  }
  for (int s = 0; s < o.steps; ++s) {
    graph::Feeds b = RandomBatch(o.batch, o.seq, o.vocab, rng);
    for (size_t i : o.ignored_targets) b["targets"].data.at(i) = -100;
    d.batches.push_back(std::move(b));
  }
  return d;
}

std::map<std::string, Tensor> Rows(const graph::Feeds& batch, int part, int parts, int64_t rows) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, h] : batch) {
    const int64_t b = (rows < 0 ? h.shape[0] : rows) / parts, row = h.numel() / h.shape[0];
    std::vector<double> v(h.data.begin() + part * b * row, h.data.begin() + (part + 1) * b * row);
    Shape s = h.shape;
    s[0] = b;
    out[name] = sg::testing::FromHost(v, s, h.dtype, Device::Cpu());
  }
  return out;
}

std::map<std::string, TensorView> Views(const std::map<std::string, Tensor>& t) {
  std::map<std::string, TensorView> v;
  for (const auto& [k, x] : t) v[k] = x.view();
  return v;
}

std::vector<double> ReadFull(CompiledStep& step, const std::string& name, int64_t numel) {
  std::vector<float> host(size_t(numel), std::nanf(""));
  absl::Status st = step.Read(name, TensorView(host.data(), DType::kF32, {numel}, Device::Cpu()));
  EXPECT_TRUE(st.ok()) << name << ": " << st;
  return std::vector<double>(host.begin(), host.end());
}

std::unique_ptr<CompiledStep> CompileAndInit(const StepData& d, CompileOptions o, float lr) {
  o.adamw.max_grad_norm = kMaxGradNorm;
  if (o.device.is_cpu()) o.adamw.eps = kCompareAdamWEps;
  auto step = Compile(d.forward, o);
  EXPECT_TRUE(step.ok()) << step.status();
  if (!step.ok()) return nullptr;
  for (const auto& [name, h] : d.params) {
    Tensor t = sg::testing::FromHost(h.data, h.shape, h.dtype, Device::Cpu());
    absl::Status st = (*step)->Write(name, t.view());
    EXPECT_TRUE(st.ok()) << name << ": " << st;
  }
  EXPECT_TRUE((*step)->SetLearningRate(lr).ok());
  return *std::move(step);
}

StepTolerances Bf16StepTolerances() {
  StepTolerances t;
  t.scalar = 2e-3;
  t.grad = 2e-2;
  t.param = 1e-2;
  t.trained = 1e-4;
  return t;
}

namespace {

// The first step's gradients, every one gathered to full shape.
void CompareGradients(const StepData& d, CompiledStep& ref, CompiledStep& dist, const StepCompare& c) {
  for (const std::string& name : ref.parameter_names()) {
    const int64_t n = d.params.at(name).numel();
    std::vector<double> want = ReadFull(ref, "grad:" + name, n), got = ReadFull(dist, "grad:" + name, n);
    if (c.expect_nonzero_grads) {
      EXPECT_GT(sg::testing::MaxAbsError(want, std::vector<double>(size_t(n), 0.0)), 0) << "grad:" << name;
    }
    const double err = sg::testing::RelativeError(got, want);
    if (c.print_errors) std::cout << "rank " << c.rank << " grad:" << name << " relative error " << err << "\n";
    EXPECT_LT(err, c.tol.grad) << "grad:" << name << " on rank " << c.rank;
  }
}

// ASSERTs return from here; `completed` tells the caller whether they did.
void CompareStepsOrStop(const StepData& d, CompiledStep& ref, CompiledStep& dist, const StepCompare& c,
                        bool& completed) {
  const int steps = int(d.batches.size());
  for (int s = 0; s < steps; ++s) {
    ASSERT_TRUE(ref.Run(Views(Rows(d.batches[size_t(s)], 0, 1, c.rows))).ok());
    absl::Status st = dist.Run(Views(Rows(d.batches[size_t(s)], c.part, c.parts, c.rows)));
    ASSERT_TRUE(st.ok()) << st;
    auto rm = ref.ReadMetrics();
    auto dm = dist.ReadMetrics();
    ASSERT_TRUE(rm.ok() && dm.ok()) << rm.status() << dm.status();
    EXPECT_NEAR(dm->loss, rm->loss, c.tol.scalar * std::abs(rm->loss)) << "step " << s;
    EXPECT_NEAR(dm->grad_norm, rm->grad_norm, c.tol.scalar * rm->grad_norm) << "step " << s;
    EXPECT_EQ(dm->step, s + 1) << c.step_count_note;
    EXPECT_GT(rm->loss, 1.0);
    if (c.after_step) c.after_step(s);
    if (s == 0) {
      EXPECT_GT(rm->grad_norm, kMaxGradNorm) << "clipping should be active";
      CompareGradients(d, ref, dist, c);
    }
  }
  for (const std::string& name : ref.parameter_names()) {
    const int64_t n = d.params.at(name).numel();
    std::vector<double> want = ReadFull(ref, name, n), got = ReadFull(dist, name, n);
    const double err = sg::testing::RelativeError(got, want);
    if (c.print_errors) {
      std::cout << "rank " << c.rank << " " << name << " relative error " << err << " after " << steps << " steps\n";
    }
    EXPECT_LT(err, c.tol.param) << name << " after " << steps << " steps";
    EXPECT_GT(sg::testing::MaxAbsError(want, d.params.at(name).data), c.tol.trained) << name << " did not train";
  }
  completed = true;
}

}  // namespace

bool CompareSteps(const StepData& d, CompiledStep& ref, CompiledStep& dist, const StepCompare& c) {
  bool completed = false;
  CompareStepsOrStop(d, ref, dist, c, completed);
  return completed;
}

comm::testing::WorkerRun ExpectWorkersPass(int world, const std::string& test,
                                           const std::vector<std::string>& env, absl::Duration timeout) {
  comm::testing::WorkerRun run = comm::testing::RunWorkers(world, test, env, timeout);
  EXPECT_TRUE(run.AllPassed()) << test << " on " << world << " workers:\n" << run.Summary();
  std::cout << run.outputs[0];
  return run;
}

}  // namespace sg::compiler::testing
