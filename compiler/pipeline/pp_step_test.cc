// Pipeline parallelism through Compile on real processes (localhost, CPU, UCX) against the
// single-process step on the whole batch: loss, gradient norm and every gradient after one step,
// every parameter after 3 steps, for 2 stages x 4 micro-batches and 4 stages x 3 micro-batches
// (an ignored target makes the micro-batch losses unequally weighted). Also the graph split: the
// stages' forwards chained through the interpreter give the whole graph's loss.
#include <random>

#include "absl/strings/str_cat.h"
#include "comm/multiprocess_testing.h"
#include "compiler/compile.h"
#include "compiler/dist_context.h"
#include "compiler/llama_step.h"
#include "compiler/training_graph.h"
#include "compiler/pipeline/graph_split.h"
#include "compiler/pipeline/pp_step.h"
#include "compiler/testing/tiny_llama.h"
#include "graph/interpreter.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::compiler {
namespace {

using graph::Feeds;

constexpr int64_t kSteps = 3, kSeq = 7;
constexpr float kLr = 1e-2f;

std::string SeedEnv() { return absl::StrCat("SG_PP_SEED=", sg::testing::Rng()()); }

// cuda: head_dim 64 and a vocabulary that is a multiple of 8 (the CUDA kernels' bf16 cases).
testing::TinyLlamaConfig Config(bool cuda = false) {
  testing::TinyLlamaConfig c;
  c.layers = 4;
  if (cuda) {
    c.vocab = 64;
    c.dim = 128;
    c.heads = 2;
    c.kv_heads = 1;
    c.ffn = 256;
  }
  return c;
}

struct Data {
  graph::Graph forward;
  Feeds params;
  std::vector<Feeds> batches;
};

Data MakeData(int64_t batch, bool cuda = false) {
  std::mt19937_64 rng(uint64_t(comm::testing::EnvInt("SG_PP_SEED", 1)));
  Data d;
  d.forward = *testing::TinyLlama(Config(cuda));
  d.params = testing::RandomParameters(d.forward, rng);
  if (cuda) {  // matrices scaled down so bf16 logits stay moderate
    for (auto& [name, h] : d.params) {
      if (h.shape.size() == 2) {
        for (double& v : h.data) v *= 0.1;
      }
    }
  }
  for (int s = 0; s < kSteps; ++s) {
    Feeds b = testing::RandomBatch(batch, kSeq, Config(cuda).vocab, rng);
    for (int k = 0; k < 3; ++k) b["targets"].data[size_t(k)] = -100;  // micro-batch 0 has fewer tokens
    d.batches.push_back(b);
  }
  return d;
}

// Rows [r*b, (r+1)*b) of every batch tensor (replica r of n).
std::map<std::string, Tensor> ToTensors(const Feeds& batch, int r = 0, int n = 1) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, h] : batch) {
    const int64_t b = h.shape[0] / n, row = h.numel() / h.shape[0];
    std::vector<double> v(h.data.begin() + r * b * row, h.data.begin() + (r + 1) * b * row);
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

std::vector<double> ReadFull(CompiledStep& s, const std::string& name, int64_t numel) {
  std::vector<float> host(size_t(numel), std::nanf(""));
  absl::Status st = s.Read(name, TensorView(host.data(), DType::kF32, {numel}, Device::Cpu()));
  EXPECT_TRUE(st.ok()) << name << ": " << st;
  return std::vector<double>(host.begin(), host.end());
}

std::unique_ptr<CompiledStep> CompileAndInit(const Data& d, CompileOptions o) {
  o.adamw.max_grad_norm = 0.5;
  auto step = Compile(d.forward, o);
  EXPECT_TRUE(step.ok()) << step.status();
  if (!step.ok()) return nullptr;
  for (const auto& [name, h] : d.params) {
    Tensor t = sg::testing::FromHost(h.data, h.shape, h.dtype, Device::Cpu());
    absl::Status st = (*step)->Write(name, t.view());
    EXPECT_TRUE(st.ok()) << name << ": " << st;
  }
  EXPECT_TRUE((*step)->SetLearningRate(kLr).ok());
  return *std::move(step);
}

// `batch` is the global batch; mesh {dp, pp} gives each replica batch/dp of it.
// cuda: each rank uses GPU `rank` for its stage and the single-GPU reference, bf16 mixed precision.
void CompareWithSingleProcess(int64_t batch, int micro, std::vector<int64_t> mesh = {}, bool cuda = false) {
  const int rank = int(comm::testing::EnvInt("RANK", 0)), world = int(comm::testing::EnvInt("WORLD_SIZE", 1));
  const int dp = mesh.size() == 2 ? int(mesh[0]) : 1, pp_size = world / dp;
  const Device device = cuda ? Device::Cuda(rank) : Device::Cpu();
  const Precision precision = cuda ? Precision::kBF16Mixed : Precision::kF32;
  const double tol = cuda ? 2e-2 : 1e-4, param_tol = cuda ? 1e-2 : 1e-4, scalar_tol = cuda ? 2e-3 : 2e-5;
  Data d = MakeData(batch, cuda);
  CompileOptions ref_opt;
  ref_opt.device = device;
  ref_opt.precision = precision;
  ref_opt.binding = {{"batch", batch}, {"seq", kSeq}};
  std::unique_ptr<CompiledStep> ref = CompileAndInit(d, ref_opt);
  CompileOptions o;
  o.strategy = Strategy::kPipeline;
  o.device = device;
  o.precision = precision;
  o.micro_batches = micro;
  o.mesh = mesh;
  o.comm_timeout_s = 30;
  o.binding = {{"batch", batch / dp}, {"seq", kSeq}};
  std::unique_ptr<CompiledStep> dist = CompileAndInit(d, o);
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(dist, nullptr);
  std::cout << dist->explanation() << "\n";
  auto* pp = dynamic_cast<PipelineStep*>(dist.get());
  ASSERT_NE(pp, nullptr);
  EXPECT_EQ(pp->stage(), rank % pp_size);
  EXPECT_LT(dist->parameter_names().size(), ref->parameter_names().size()) << "each stage holds a slice";

  for (int s = 0; s < kSteps; ++s) {
    auto batch_tensors = ToTensors(d.batches[size_t(s)]);
    ASSERT_TRUE(ref->Run(Views(batch_tensors)).ok());
    absl::Status st = dist->Run(Views(ToTensors(d.batches[size_t(s)], rank / pp_size, dp)));
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(pp->last_actions().size(), size_t(2 * micro));
    auto rm = ref->ReadMetrics();
    auto dm = dist->ReadMetrics();
    ASSERT_TRUE(rm.ok() && dm.ok()) << rm.status() << dm.status();
    EXPECT_NEAR(dm->loss, rm->loss, scalar_tol * std::abs(rm->loss)) << "step " << s;
    EXPECT_NEAR(dm->grad_norm, rm->grad_norm, scalar_tol * rm->grad_norm) << "step " << s;
    EXPECT_EQ(dm->step, s + 1);
    EXPECT_GT(rm->loss, 1.0);
    if (s == 0) {
      EXPECT_GT(rm->grad_norm, 0.5) << "clipping should be active";
      for (const std::string& name : ref->parameter_names()) {
        const int64_t n = d.params.at(name).numel();
        std::vector<double> want = ReadFull(*ref, "grad:" + name, n), got = ReadFull(*dist, "grad:" + name, n);
        EXPECT_LT(sg::testing::RelativeError(got, want), tol) << "grad:" << name;
      }
    }
  }
  for (const std::string& name : ref->parameter_names()) {
    const int64_t n = d.params.at(name).numel();
    std::vector<double> want = ReadFull(*ref, name, n), got = ReadFull(*dist, name, n);
    EXPECT_LT(sg::testing::RelativeError(got, want), param_tol) << name << " after " << kSteps << " steps";
    EXPECT_GT(sg::testing::MaxAbsError(want, d.params.at(name).data), 1e-3) << name << " did not train";
  }
  // Rank 0 hosts the store: it waits for every rank before exiting.
  auto ctx = DistContext::FromEnv(device, {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_TRUE((*ctx)->Finalize(absl::Now() + absl::Seconds(30)).ok());
}

TEST(Workers, DISABLED_Pp2) { CompareWithSingleProcess(4, 4); }
TEST(Workers, DISABLED_Pp4) { CompareWithSingleProcess(6, 3); }
TEST(Workers, DISABLED_DpPp) { CompareWithSingleProcess(4, 2, {2, 2}); }
TEST(Workers, DISABLED_Pp2Cuda) { CompareWithSingleProcess(4, 4, {}, /*cuda=*/true); }

TEST(PpStepTest, TwoStagesFourMicroBatchesEqualOneProcess) {
  auto run = comm::testing::RunWorkers(2, "Workers.DISABLED_Pp2", {SeedEnv()}, absl::Seconds(100));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
  std::cout << run.outputs[0];
}

TEST(PpStepTest, FourStagesThreeMicroBatchesEqualOneProcess) {
  auto run = comm::testing::RunWorkers(4, "Workers.DISABLED_Pp4", {SeedEnv()}, absl::Seconds(100));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
  std::cout << run.outputs[0];
}

// 2 replicas of a 2-stage pipeline (4 processes): gradients all-reduced per stage, the micro-batch
// weights counting both replicas' tokens (replica 0 has the ignored targets).
TEST(PpStepTest, TwoReplicasOfTwoStagesEqualOneProcess) {
  auto run = comm::testing::RunWorkers(4, "Workers.DISABLED_DpPp", {SeedEnv()}, absl::Seconds(100));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
  std::cout << run.outputs[0];
}

// GPU: 2 stages on 2 GPUs (bf16 mixed, activations through host buffers) vs 1 GPU. Skips without
// 2 GPUs.
TEST(PpStepTest, TwoGpuStagesEqualOneGpu) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  auto run = comm::testing::RunWorkers(2, "Workers.DISABLED_Pp2Cuda", {SeedEnv()}, absl::Seconds(200));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
  std::cout << run.outputs[0];
}

// The split alone: chaining the stages' forwards reproduces the whole graph's loss.
TEST(GraphSplitTest, ChainedStagesGiveTheWholeLoss) {
  std::mt19937_64 rng(sg::testing::Rng()());
  auto g = testing::TinyLlama(Config());
  ASSERT_TRUE(g.ok());
  Feeds params = testing::RandomParameters(*g, rng);
  Feeds batch = testing::RandomBatch(2, 5, Config().vocab, rng);
  Feeds all = params;
  for (auto& [k, v] : batch) all[k] = v;
  auto whole = graph::Interpret(*g, all);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (int stages : {1, 2, 3, 4}) {
    auto split = SplitIntoStages(*g, stages);
    ASSERT_TRUE(split.ok()) << split.status();
    ASSERT_EQ(split->size(), size_t(stages));
    graph::HostTensor h;
    size_t params_seen = 0;
    for (const StageGraph& s : *split) {
      params_seen += s.parameters.size();
      Feeds f = all;
      if (!s.spec.first()) f[kStageInput] = h;
      auto out = graph::Interpret(s.forward, f);
      ASSERT_TRUE(out.ok()) << out.status();
      if (!s.spec.last()) {
        h = out->at(kStageOutput);
      } else {
        EXPECT_NEAR(out->at("loss").data[0], whole->at("loss").data[0], 1e-12) << stages << " stages";
      }
    }
    EXPECT_EQ(params_seen, params.size()) << "every parameter on exactly one stage";
  }
  EXPECT_FALSE(SplitIntoStages(*g, 5).ok()) << "more stages than layers";
}

// The 124m model's stage programs in bf16 mixed precision lower onto CUDA kernels only (planning:
// nothing allocated), with no helper op left from the cotangent seeding.
TEST(GraphSplitTest, StageProgramsOf124mLowerOntoCudaKernels) {
  auto c = LlamaBenchConfigNamed("124m");
  ASSERT_TRUE(c.ok());
  auto fwd = graph::BuildLlamaForward(c->model);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  auto mixed = ToMixedPrecision(*fwd);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  auto split = SplitIntoStages(*mixed, 4);
  ASSERT_TRUE(split.ok()) << split.status();
  for (const StageGraph& s : *split) {
    auto step = PrepareStageStep(s, /*fuse=*/true);
    ASSERT_TRUE(step.ok()) << step.status();
    for (const graph::Node& n : step->nodes()) {
      EXPECT_NE(n.op, graph::OpKind::kReduceSum) << "stage " << s.spec.stage << ": helper vjp node left";
    }
    EXPECT_GE(step->FindOutput("grad:" + s.parameters[0]), 0);
    EXPECT_EQ(step->FindOutput("grad:h_in") >= 0, !s.spec.first());
    auto plan = PlanStepMemory(*step, {{"batch", 1}, {"seq", 1024}}, Device::Cuda(0));
    ASSERT_TRUE(plan.ok()) << "stage " << s.spec.stage << ": " << plan.status();
    EXPECT_EQ(plan->impls.count("reference"), 0u) << "stage " << s.spec.stage;
  }
}

}  // namespace
}  // namespace sg::compiler
