// The compiled graph/models/llama training step: every op on a real kernel (no reference
// fallback), the lowering's cross-node fusions (fused cross-entropy, f32 weight gradients, bf16
// weight copies from AdamW), loss and gradients against the f64 interpreter, the memory plan at
// the benchmark shapes, and (GPU) the CUDA step against the CPU step and graph replay.
#include <array>
#include <cmath>
#include <set>
#include <iostream>

#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "compiler/compile.h"
#include "compiler/distributed.h"
#include "compiler/llama_step.h"
#include "compiler/testing/tiny_llama.h"
#include "graph/autodiff.h"
#include "graph/interpreter.h"
#include "graph/models/llama.h"
#include "graph/ops.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"
#include "kernels/wgmma_gemm/wgmma_gemm_swiglu.h"

namespace sg::compiler {
namespace {

using graph::Feeds;
using graph::HostTensor;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

graph::Graph LlamaForward(const graph::LlamaConfig& c) {
  auto g = graph::BuildLlamaForward(c);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : graph::Graph();
}

// Tiny Llama (f32 parameters) with some ignored targets.
Feeds TinyBatch(int64_t batch, int64_t seq, int64_t vocab) {
  Feeds b = testing::RandomBatch(batch, seq, vocab, sg::testing::Rng());
  b["targets"].data[1] = -100;
  b["targets"].data[seq + 2] = -100;
  return b;
}

std::map<std::string, Tensor> OnDevice(const Feeds& f, Device d) {
  std::map<std::string, Tensor> t;
  for (const auto& [k, h] : f) t[k] = sg::testing::FromHost(h.data, h.shape, h.dtype, d);
  return t;
}

std::map<std::string, TensorView> Views(const std::map<std::string, Tensor>& t) {
  std::map<std::string, TensorView> v;
  for (const auto& [k, x] : t) v[k] = x.view();
  return v;
}

std::unique_ptr<CompiledStep> CompileWithParams(const graph::Graph& fwd, const CompileOptions& o, const Feeds& params) {
  auto step = Compile(fwd, o);
  EXPECT_TRUE(step.ok()) << step.status();
  if (!step.ok()) return nullptr;
  for (const auto& [name, h] : params) {
    Tensor t = sg::testing::FromHost(h.data, h.shape, h.dtype, Device::Cpu());
    EXPECT_TRUE((*step)->Write(name, t).ok()) << name;
  }
  const DeviceMemory& arena = (*step)->program().arena;
  if (arena.bytes() > 0) sg::testing::Poison(TensorView(arena.data(), DType::kF32, {arena.bytes() / 4}, o.device));
  return *std::move(step);
}

// Synchronizes first: the step writes View's memory on its non-blocking compute stream.
std::vector<double> Read(CompiledStep& s, const std::string& name) {
  EXPECT_TRUE(s.executor().Synchronize().ok());
  auto v = s.View(name);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? sg::testing::ToHost(*v) : std::vector<double>{};
}

// Steps per op name (graph node ops; runtime steps under their own names) and impl.
std::map<std::string, int> StepsByOp(const CompiledStep& s, const std::string& impl = "") {
  std::map<std::string, int> m;
  for (const Step& st : s.program().schedule.steps) {
    if (!impl.empty() && st.impl != impl) continue;
    ++m[st.node >= 0 ? graph::OpName(s.training_graph().nodes()[st.node].op) : st.name];
  }
  return m;
}

TEST(LlamaStepTest, EveryOpHasAKernelAndTheLoweringFuses) {
  graph::Graph fwd = LlamaForward(graph::LlamaConfig::Tiny());
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  for (Precision prec : {Precision::kF32, Precision::kBF16Mixed}) {
    for (RecomputePolicy rp : {RecomputePolicy::kNone, RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
      SCOPED_TRACE(absl::StrFormat("precision %d recompute %d", int(prec), int(rp)));
      CompileOptions o;
      o.binding = {{"batch", 2}, {"seq", 8}};
      o.precision = prec;
      o.recompute = rp;
      auto step = CompileWithParams(fwd, o, params);
      ASSERT_NE(step, nullptr);
      for (const auto& [op, n] : StepsByOp(*step, "reference")) ADD_FAILURE() << "reference fallback: " << op << " x" << n;
      std::map<std::string, int> ops = StepsByOp(*step);
      EXPECT_EQ(ops["softmax_cross_entropy"], 1);
      EXPECT_EQ(ops.count("softmax_cross_entropy_backward"), 0u) << "fused into the forward's launch";
      EXPECT_GT(ops["add_rmsnorm"], 0);
      EXPECT_GT(ops["add_rmsnorm_backward"], 0);
      EXPECT_EQ(ops.count("adamw"), 1u);
      EXPECT_EQ(ops.count("cast"), 0u) << "weight copies come from AdamW, gradients are written in f32";
      const size_t nparams = step->parameter_names().size();
      EXPECT_EQ(step->program().weight_copies.size(), prec == Precision::kBF16Mixed ? nparams : 0u);
      for (const std::string& name : step->parameter_names()) {
        auto g = step->View("grad:" + name);
        ASSERT_TRUE(g.ok());
        EXPECT_EQ(g->dtype(), DType::kF32) << name;
      }
      ASSERT_TRUE(step->Run(Views(OnDevice(TinyBatch(2, 8, 11), Device::Cpu()))).ok());
      auto m = step->ReadMetrics();
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_TRUE(std::isfinite(m->loss) && m->loss > 0.5) << m->loss;
    }
  }
}

TEST(LlamaStepTest, LossAndGradientsMatchTheInterpreter) {
  graph::Graph fwd = LlamaForward(graph::LlamaConfig::Tiny());
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  Feeds batch = TinyBatch(2, 8, 11);
  CompileOptions o;
  o.binding = {{"batch", 2}, {"seq", 8}};
  o.adamw.max_grad_norm = 0.5;
  auto step = CompileWithParams(fwd, o, params);
  ASSERT_NE(step, nullptr);
  ASSERT_TRUE(step->Run(Views(OnDevice(batch, Device::Cpu()))).ok());
  auto bwd = graph::AppendBackward(fwd, {});
  ASSERT_TRUE(bwd.ok()) << bwd.status();
  Feeds feeds = params;
  feeds.insert(batch.begin(), batch.end());
  auto ref = graph::Interpret(bwd->graph, feeds);
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto m = step->ReadMetrics();
  ASSERT_TRUE(m.ok());
  EXPECT_NEAR(m->loss, ref->at("loss").data[0], 1e-5 * std::abs(ref->at("loss").data[0]));
  for (const std::string& name : step->parameter_names()) {
    EXPECT_LT(sg::testing::RelativeError(Read(*step, "grad:" + name), ref->at("grad:" + name).data), 1e-4) << name;
  }
}

// The bf16 copies the AdamW pass writes are exactly the rounded master weights, after Write and
// after every step; the step reads them (a second step's loss matches a fresh compile fed the
// updated master weights).
TEST(LlamaStepTest, Bf16WeightCopiesFollowTheMasterWeights) {
  graph::Graph fwd = LlamaForward(graph::LlamaConfig::Tiny());
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  CompileOptions o;
  o.binding = {{"batch", 2}, {"seq", 8}};
  o.precision = Precision::kBF16Mixed;
  auto step = CompileWithParams(fwd, o, params);
  ASSERT_NE(step, nullptr);
  ASSERT_TRUE(step->SetLearningRate(1e-2f).ok());
  auto check_copies = [&](const char* when) {
    for (const auto& [master, copy] : step->program().weight_copies) {
      std::vector<double> m = sg::testing::ToHost(master), c = sg::testing::ToHost(copy);
      ASSERT_EQ(m.size(), c.size());
      int wrong = 0;
      for (size_t i = 0; i < m.size(); ++i) wrong += BFloat16::FromFloat(float(m[i])).ToFloat() != float(c[i]);
      EXPECT_EQ(wrong, 0) << when;
    }
  };
  check_copies("after Write");
  Feeds batch = TinyBatch(2, 8, 11);
  auto dev = OnDevice(batch, Device::Cpu());
  for (int it = 0; it < 2; ++it) {
    ASSERT_TRUE(step->Run(Views(dev)).ok());
    check_copies("after a step");
  }
  Feeds updated;
  for (const std::string& name : step->parameter_names()) {
    updated[name] = params.at(name);
    updated[name].data = Read(*step, name);
  }
  auto fresh = CompileWithParams(fwd, o, updated);
  ASSERT_NE(fresh, nullptr);
  ASSERT_TRUE(step->Run(Views(dev)).ok());
  ASSERT_TRUE(fresh->Run(Views(dev)).ok());
  EXPECT_EQ(step->ReadMetrics()->loss, fresh->ReadMetrics()->loss);
}

// CompileOptions::bf16_gradients against the f32-gradient step from the same weights and batch:
// the matmul weights' "grad:" outputs are bf16 and are the f32 step's gradients rounded once (the
// same GEMM, rounded to bf16 instead of written in f32); the norm weights and the embedding keep
// f32 gradients equal to the f32 step's; the gradient norm matches; AdamW's first update (about
// lr * sign(g), so a misread gradient would show) matches; and the losses of the next steps agree.
void ExpectBf16GradientsMatchF32(const graph::LlamaConfig& model, int64_t batch, int64_t seq, Device device) {
  graph::Graph fwd = LlamaForward(model);
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  for (auto& [k, h] : params) {
    if (h.shape.size() == 2) {
      for (double& v : h.data) v *= 0.1;  // keep activations in a sane range at the tiny bench's dim 128
    }
  }
  std::unique_ptr<CompiledStep> steps[2];  // 0: f32 gradients, 1: bf16 gradients
  for (int b = 0; b < 2; ++b) {
    CompileOptions o;
    o.device = device;
    o.binding = {{"batch", batch}, {"seq", seq}};
    o.precision = Precision::kBF16Mixed;
    o.recompute = RecomputePolicy::kSelective;
    o.cuda_graph = false;
    o.bf16_gradients = b == 1;
    steps[b] = CompileWithParams(fwd, o, params);
    ASSERT_NE(steps[b], nullptr);
    ASSERT_TRUE(steps[b]->SetLearningRate(1e-3f).ok());
  }
  Feeds first = TinyBatch(batch, seq, model.vocab);
  auto host = OnDevice(first, Device::Cpu());
  for (auto& s : steps) ASSERT_TRUE(s->Run(Views(host)).ok());
  auto m0 = steps[0]->ReadMetrics(), m1 = steps[1]->ReadMetrics();
  ASSERT_TRUE(m0.ok() && m1.ok());
  EXPECT_EQ(m1->loss, m0->loss) << "the forward does not change";
  EXPECT_NEAR(m1->grad_norm, m0->grad_norm, 1e-2 * m0->grad_norm);
  int bf16 = 0, matrices = 0;
  for (const std::string& name : steps[0]->parameter_names()) {
    SCOPED_TRACE(name);
    const bool matmul_weight = params.at(name).shape.size() == 2 && name != "tok_embeddings.weight";
    matrices += matmul_weight;
    auto g = steps[1]->View("grad:" + name);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->dtype(), matmul_weight ? DType::kBF16 : DType::kF32);
    bf16 += g->dtype() == DType::kBF16;
    const std::vector<double> f32 = Read(*steps[0], "grad:" + name), mixed = Read(*steps[1], "grad:" + name);
    ASSERT_EQ(f32.size(), mixed.size());
    int off = 0, rounded_differently = 0;
    for (size_t i = 0; i < f32.size(); ++i) {
      if (!matmul_weight) {
        off += mixed[i] != f32[i];
        continue;
      }
      // One rounding of the same f32 accumulator: the nearest bf16, or (a GEMM summing in another
      // order) a neighbour of it.
      const double r = BFloat16::FromFloat(float(f32[i])).ToFloat();
      rounded_differently += mixed[i] != r;
      off += std::abs(mixed[i] - f32[i]) > std::ldexp(std::abs(f32[i]), -7) + 1e-30;
    }
    EXPECT_EQ(off, 0) << "of " << f32.size();
    EXPECT_LE(rounded_differently, int(f32.size()) / 100 + 1) << "of " << f32.size();
    // The first AdamW update: each step's change of the master weights.
    const std::vector<double> p0 = params.at(name).data, pa = Read(*steps[0], name), pb = Read(*steps[1], name);
    std::vector<double> da(p0.size()), db(p0.size());
    for (size_t i = 0; i < p0.size(); ++i) {
      da[i] = pa[i] - p0[i];
      db[i] = pb[i] - p0[i];
    }
    EXPECT_LT(sg::testing::RelativeError(db, da), 5e-2);
  }
  EXPECT_EQ(bf16, matrices);
  EXPECT_GT(bf16, 0);
  for (int it = 0; it < 2; ++it) {
    auto next = OnDevice(TinyBatch(batch, seq, model.vocab), Device::Cpu());
    for (auto& s : steps) ASSERT_TRUE(s->Run(Views(next)).ok());
    const float a = steps[0]->ReadMetrics()->loss, b = steps[1]->ReadMetrics()->loss;
    EXPECT_NEAR(b, a, 1e-3 * a) << "step " << it + 2;
  }
}

TEST(LlamaStepTest, Bf16GradientsAreTheF32GradientsRounded) {
  ExpectBf16GradientsMatchF32(graph::LlamaConfig::Tiny(), 2, 8, Device::Cpu());
}

// With the LM head in blocks (lm_head_chunks), whose dW sums the blocks in f32, the output
// weight's gradient stays f32 while the other matmul weights' turn bf16, and the step computes the
// same loss and gradients as the unblocked bf16-gradient step.
TEST(LlamaStepTest, Bf16GradientsKeepTheBlockedHeadsGradientF32) {
  graph::Graph fwd = LlamaForward(graph::LlamaConfig::Tiny());
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  std::unique_ptr<CompiledStep> steps[2];  // 0: whole head, 1: the head in 3 blocks
  for (int b = 0; b < 2; ++b) {
    CompileOptions o;
    o.binding = {{"batch", 2}, {"seq", 8}};
    o.precision = Precision::kBF16Mixed;
    o.bf16_gradients = true;
    o.lm_head_chunks = b == 0 ? 1 : 3;
    steps[b] = CompileWithParams(fwd, o, params);
    ASSERT_NE(steps[b], nullptr);
  }
  int head = 0;
  for (const Step& st : steps[1]->program().schedule.steps) head += absl::StartsWith(st.name, "lm head in 3 blocks");
  EXPECT_EQ(head, 1);
  auto dev = OnDevice(TinyBatch(2, 8, 11), Device::Cpu());
  for (auto& s : steps) ASSERT_TRUE(s->Run(Views(dev)).ok());
  EXPECT_NEAR(steps[1]->ReadMetrics()->loss, steps[0]->ReadMetrics()->loss, 1e-6 * steps[0]->ReadMetrics()->loss);
  for (const std::string& name : steps[0]->parameter_names()) {
    SCOPED_TRACE(name);
    const bool matmul_weight = params.at(name).shape.size() == 2 && name != "tok_embeddings.weight";
    EXPECT_EQ(steps[0]->View("grad:" + name)->dtype(), matmul_weight ? DType::kBF16 : DType::kF32);
    EXPECT_EQ(steps[1]->View("grad:" + name)->dtype(),
              matmul_weight && name != "output.weight" ? DType::kBF16 : DType::kF32);
    // The blocked head's dW is summed in f32 and the whole head's rounded to bf16 once.
    EXPECT_LT(sg::testing::RelativeError(Read(*steps[1], "grad:" + name), Read(*steps[0], "grad:" + name)), 1e-2);
  }
}

// A tied LM head: the table's gradient sums the embedding's (f32) and the head's dW, so the dW is
// read by that sum, not by the optimizer alone, and stays f32 (folded); the other matmul weights
// turn bf16. The step computes the f32-gradient step's loss and the table's gradient to f32 rounding.
TEST(LlamaStepTest, Bf16GradientsKeepATiedTablesGradientF32) {
  testing::TinyLlamaConfig tc;
  tc.tied = true;
  auto fwd = testing::TinyLlama(tc);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  Feeds params = testing::RandomParameters(*fwd, sg::testing::Rng());
  std::unique_ptr<CompiledStep> steps[2];  // 0: f32 gradients, 1: bf16 gradients
  for (int b = 0; b < 2; ++b) {
    CompileOptions o;
    o.binding = {{"batch", 2}, {"seq", 8}};
    o.precision = Precision::kBF16Mixed;
    o.bf16_gradients = b == 1;
    steps[b] = CompileWithParams(*fwd, o, params);
    ASSERT_NE(steps[b], nullptr);
  }
  auto dev = OnDevice(TinyBatch(2, 8, tc.vocab), Device::Cpu());
  for (auto& s : steps) ASSERT_TRUE(s->Run(Views(dev)).ok());
  EXPECT_EQ(steps[1]->ReadMetrics()->loss, steps[0]->ReadMetrics()->loss);
  int bf16 = 0;
  for (const std::string& name : steps[0]->parameter_names()) {
    SCOPED_TRACE(name);
    const DType t = steps[1]->View("grad:" + name)->dtype();
    bf16 += t == DType::kBF16;
    if (name == "tok_embeddings.weight") {
      EXPECT_EQ(t, DType::kF32);
      EXPECT_LT(sg::testing::RelativeError(Read(*steps[1], "grad:" + name), Read(*steps[0], "grad:" + name)), 1e-6);
    }
  }
  EXPECT_EQ(bf16, 7 * tc.layers) << "wq, wk, wv, wo, w1, w2, w3 of every layer";
}

// CompileOptions::bf16_gradients is refused where another runtime reads the gradients in f32.
TEST(LlamaStepTest, Bf16GradientsOnlyForOneDeviceAndOneMicroBatch) {
  graph::Graph fwd = LlamaForward(graph::LlamaConfig::Tiny());
  CompileOptions o;
  o.binding = {{"batch", 2}, {"seq", 8}};
  o.precision = Precision::kBF16Mixed;
  o.bf16_gradients = true;
  o.micro_batches = 2;
  auto step = Compile(fwd, o);
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(step.status().message(), "bf16_gradients is for a single device, FSDP or HYBRID_SHARD with one micro-batch"))
      << step.status();
  EXPECT_TRUE(absl::StrContains(step.status().message(), "2 micro-batches")) << step.status();
  o.micro_batches = 1;
  o.precision = Precision::kF32;
  step = Compile(fwd, o);
  ASSERT_FALSE(step.ok());
  EXPECT_TRUE(absl::StrContains(step.status().message(), "bf16_gradients needs bf16 mixed precision")) << step.status();
  EXPECT_TRUE(absl::StrContains(step.status().message(), "found precision 'f32'")) << step.status();
}

// The plan at the 1b shapes: bf16 gradients are 2 bytes less per matmul weight (every weight but
// the embedding and the norms), but the step's peak is the start of the backward, where few
// gradients exist yet: the peak drops by far less than the 1.93 GiB all of them would save (0.12
// GiB), which is still one layer of SwiGLU recompute fewer under the 32 GiB default (2 against 3).
TEST(LlamaStepTest, Bf16GradientsPlanAtThe1b) {
  auto c = LlamaBenchConfigNamed("1b");
  ASSERT_TRUE(c.ok());
  graph::Graph fwd = LlamaForward(c->model);
  const graph::LlamaConfig& m = c->model;
  const int64_t kv_dim = m.dim / m.n_heads * m.n_kv_heads;
  const int64_t matmul_weights =
      m.n_layers * (2 * m.dim * m.dim + 2 * m.dim * kv_dim + 3 * m.dim * m.ffn_dim) + m.vocab * m.dim;
  int64_t total[2] = {0, 0};
  int swiglu[2] = {0, 0};
  for (int b = 0; b < 2; ++b) {
    CompileOptions o = LlamaStepOptions(*c, Device::Cuda(0), RecomputePolicy::kSelective);
    o.bf16_gradients = b == 1;
    PlannedMemory p = PlanMemory(fwd, o).value();
    total[b] = p.arena_bytes + p.state_bytes;
    CompileOptions a = LlamaStepOptions(*c, Device::Cuda(0), RecomputePolicy::kNone);
    a.bf16_gradients = b == 1;
    auto bytes = ChooseRecompute(fwd, int64_t((32.0 - 0.25) * kGiB), 1, &a);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(a.recompute, RecomputePolicy::kSelective);
    swiglu[b] = a.recompute_swiglu_layers;
  }
  const int64_t saved = total[0] - total[1];
  std::cout << absl::StrFormat("1b selective: %.2f GiB with f32 gradients, %.2f with bf16 (%.3f GiB less; all %lld "
                               "matmul weights' gradients: %.2f GiB); auto under 31.75 GiB: SwiGLU recomputed in %d / %d "
                               "layers\n",
                               total[0] / kGiB, total[1] / kGiB, saved / kGiB, (long long)matmul_weights,
                               2.0 * matmul_weights / kGiB, swiglu[0], swiglu[1]);
  EXPECT_GT(saved, 0);
  EXPECT_LT(saved, 2 * matmul_weights);
  EXPECT_LT(swiglu[1], swiglu[0]);
}

// The full-size steps lower onto CUDA kernels (planning only: nothing is allocated or run), and
// the planned memory at the benchmark shapes, printed for the record (PyTorch torch.compile peak:
// 124m 12.55 GiB, 1b 40.04 GiB).
TEST(LlamaStepTest, BenchmarkShapesLowerOntoCudaKernels) {
  for (const char* name : {"124m", "1b"}) {
    auto c = LlamaBenchConfigNamed(name);
    ASSERT_TRUE(c.ok());
    graph::Graph fwd = LlamaForward(c->model);
    for (RecomputePolicy rp : {RecomputePolicy::kNone, RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
      auto plan = PlanMemory(fwd, LlamaStepOptions(*c, Device::Cuda(0), rp));
      ASSERT_TRUE(plan.ok()) << name << ": " << plan.status();
      EXPECT_EQ(plan->impls.count("reference"), 0u);
      EXPECT_GT(plan->impls.at("kernel"), 100);
      EXPECT_LT(plan->arena_bytes, plan->arena_without_reuse_bytes);
      std::cout << absl::StrFormat(
          "planned %s recompute=%s: arena %.2f GiB (%.2f GiB without reuse), state %.2f GiB, total %.2f GiB\n", name,
          std::string(graph::RecomputePolicyName(rp)), plan->arena_bytes / kGiB, plan->arena_without_reuse_bytes / kGiB,
          plan->state_bytes / kGiB, (plan->arena_bytes + plan->state_bytes) / kGiB);
    }
  }
}

// ChooseRecompute at the 1b shapes: a budget between the selective and the no-recompute plans
// takes selective with SwiGLU recomputed in only some layers, and that plan fits while one layer
// fewer would not; a roomy budget takes none; an impossible one falls back to full.
TEST(LlamaStepTest, ChooseRecomputeTakesTheLeastThatFits) {
  auto c = LlamaBenchConfigNamed("1b");
  ASSERT_TRUE(c.ok());
  graph::Graph fwd = LlamaForward(c->model);
  auto total = [&](RecomputePolicy rp, int swiglu_layers) {
    CompileOptions o = LlamaStepOptions(*c, Device::Cuda(0), rp);
    o.recompute_swiglu_layers = swiglu_layers;
    PlannedMemory m = PlanMemory(fwd, o).value();
    return m.arena_bytes + m.state_bytes;
  };
  const int64_t none = total(RecomputePolicy::kNone, -1), selective = total(RecomputePolicy::kSelective, -1);
  ASSERT_LT(selective, none);
  const int64_t budget = (none + selective) / 2;
  CompileOptions o = LlamaStepOptions(*c, Device::Cuda(0), RecomputePolicy::kNone);
  auto planned = ChooseRecompute(fwd, budget, 1, &o);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(o.recompute, RecomputePolicy::kSelective);
  ASSERT_GE(o.recompute_swiglu_layers, 0);
  EXPECT_LT(o.recompute_swiglu_layers, c->model.n_layers);
  EXPECT_LE(*planned, budget);
  EXPECT_EQ(*planned, total(RecomputePolicy::kSelective, o.recompute_swiglu_layers));
  if (o.recompute_swiglu_layers > 0) {
    EXPECT_GT(total(RecomputePolicy::kSelective, o.recompute_swiglu_layers - 1), budget);
  }
  std::cout << absl::StrFormat("1b under %.2f GiB: selective with SwiGLU recomputed in %d of %d layers, %.2f GiB\n",
                               budget / kGiB, o.recompute_swiglu_layers, int(c->model.n_layers), *planned / kGiB);

  CompileOptions roomy = LlamaStepOptions(*c, Device::Cuda(0), RecomputePolicy::kFull);
  ASSERT_TRUE(ChooseRecompute(fwd, none, 1, &roomy).ok());
  EXPECT_EQ(roomy.recompute, RecomputePolicy::kNone);
  CompileOptions tight = LlamaStepOptions(*c, Device::Cuda(0), RecomputePolicy::kNone);
  ASSERT_TRUE(ChooseRecompute(fwd, 1 << 20, 1, &tight).ok());
  EXPECT_EQ(tight.recompute, RecomputePolicy::kFull);
}

// CompileOptions::lm_head_chunks at the 1b shapes: the step's peak is the start of the backward,
// where the 1000 MiB of bf16 logits (dlogits in place) sit on every kept activation. In 4 blocks of
// tokens they are 250 MiB, and only during the head's launch, so --recompute=auto under the 32 GiB
// default (31.75 planned) needs no SwiGLU recompute instead of 3 layers' (the plan of a 32.8 GiB
// budget; the 3 recomputes are ~0.55 ms of the step in the H200 trace).
TEST(LlamaStepTest, LmHeadInBlocksPlanAtThe1b) {
  auto c = LlamaBenchConfigNamed("1b");
  ASSERT_TRUE(c.ok());
  graph::Graph fwd = LlamaForward(c->model);
  const int64_t budget = int64_t((32.0 - 0.25) * kGiB);
  int64_t planned[2] = {0, 0};
  int swiglu[2] = {0, 0};
  for (const int chunks : {1, 4}) {
    CompileOptions o = LlamaStepOptions(*c, Device::Cuda(0), RecomputePolicy::kNone);
    o.lm_head_chunks = chunks;
    auto bytes = ChooseRecompute(fwd, budget, 1, &o);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(o.recompute, RecomputePolicy::kSelective);
    planned[chunks > 1] = *bytes;
    swiglu[chunks > 1] = o.recompute_swiglu_layers;
    std::cout << absl::StrFormat("1b, lm_head_chunks %d: auto under 31.75 GiB picks SwiGLU recompute in %d layers (%.2f GiB)\n",
                                 chunks, o.recompute_swiglu_layers, *bytes / kGiB);
  }
  EXPECT_EQ(swiglu[0], 3);
  EXPECT_EQ(swiglu[1], 0) << "no SwiGLU recompute once the logits are one block";
  EXPECT_LE(planned[1], budget);
}

// LowerOptions::swiglu_backward_gemm at the 1b shapes (planned for a Hopper GPU, no GPU asked):
// every layer's dh = dy @ W2 matmul and its swiglu_backward become one step, dh gets no buffer and
// the step a W2^T scratch; off, or on the CPU, or at shapes the kernel does not take (the test's
// tiny Llama: ffn 24), the two steps stay.
TEST(LlamaStepTest, SwiGluBackwardGemmPlanAtThe1b) {
  auto lower = [](const graph::LlamaConfig& model, const graph::Binding& binding, Device device, bool fuse) {
    graph::Graph fwd = LlamaForward(model);
    CompileOptions o;
    o.device = device;
    o.precision = Precision::kBF16Mixed;
    o.recompute = RecomputePolicy::kSelective;
    o.binding = binding;
    graph::Graph train = PrepareTrainingGraph(fwd, o).value();
    LowerOptions lo;
    lo.plan_only = true;
    lo.swiglu_backward_gemm = fuse;
    auto p = Lower(std::move(train), o.binding, o.device, lo);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  };
  // (fused steps, matmul steps, swiglu_backward steps) of a program.
  auto count = [](const Program& p) {
    std::array<int, 3> c = {0, 0, 0};
    for (const Step& st : p.schedule.steps) {
      if (st.node < 0) continue;
      c[0] += absl::StartsWith(st.name, "matmul + swiglu_backward @layers.");
      const graph::OpKind op = p.graph.nodes()[st.node].op;
      c[1] += op == graph::OpKind::kMatmul;
      c[2] += op == graph::OpKind::kSwiGLUBackward;
    }
    return c;
  };
  auto c = LlamaBenchConfigNamed("1b");
  ASSERT_TRUE(c.ok());
  const graph::Binding b = {{"batch", c->batch}, {"seq", c->seq}};
  auto fused = lower(c->model, b, Device::Cuda(0), true), plain = lower(c->model, b, Device::Cuda(0), false);
  ASSERT_NE(fused, nullptr);
  ASSERT_NE(plain, nullptr);
  const std::array<int, 3> f = count(*fused), u = count(*plain);
  const int layers = int(c->model.n_layers);
  EXPECT_EQ(f[0], layers);
  EXPECT_EQ(u[0], 0);
  EXPECT_EQ(f[1], u[1] - layers) << "one dh matmul fewer per layer";
  EXPECT_EQ(f[2], u[2]);
  // No slot holds a swiglu_backward's dh; each fused step has its [ffn, dim] bf16 scratch.
  std::set<int> dh;
  for (const graph::Node& n : fused->graph.nodes()) {
    if (n.op == graph::OpKind::kSwiGLUBackward) dh.insert(n.inputs[0]);
  }
  ASSERT_EQ(int(dh.size()), layers);
  for (int v : fused->slot_values) EXPECT_EQ(dh.count(v), 0u) << "value " << v;
  int dh_slots = 0;
  for (int v : plain->slot_values) dh_slots += dh.count(v) > 0;
  EXPECT_EQ(dh_slots, layers);
  // The arena's peak lies outside the MLP backward at this size (the dh it no longer holds is off-peak), so
  // the fused plan may cost at most its one new buffer, the [ffn, dim] W2 transpose.
  const int64_t w2t_bytes = c->model.ffn_dim * c->model.dim * 2;
  EXPECT_LE(fused->plan.arena_bytes, plain->plan.arena_bytes + w2t_bytes);
  std::cout << absl::StrFormat("1b selective: arena %.3f GiB fused, %.3f GiB unfused\n", fused->plan.arena_bytes / kGiB,
                               plain->plan.arena_bytes / kGiB);
  // The CPU, and shapes outside the kernel: unfused.
  auto cpu = lower(c->model, b, Device::Cpu(), true);
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(count(*cpu)[0], 0);
  graph::LlamaConfig tiny = graph::LlamaConfig::Tiny();
  tiny.dtype = DType::kF32;
  auto small = lower(tiny, {{"batch", 16}, {"seq", 8}}, Device::Cuda(0), true);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(count(*small)[0], 0) << "ffn 24 is not a multiple of 256";
}

// ChooseRecompute with micro-batches plans the data-parallel runtime's step (PlanFsdpMemory on a
// group of one: the accumulated f32 gradients, one micro-batch's activations): the 1b as 2
// micro-batches needs no recompute under the 32 GiB default (28.8 GiB), where one pass needs it.
TEST(LlamaStepTest, MicroBatchesPlanAtThe1b) {
  auto c = LlamaBenchConfigNamed("1b");
  ASSERT_TRUE(c.ok());
  graph::Graph fwd = LlamaForward(c->model);
  const int64_t budget = int64_t((32.0 - 0.25) * kGiB);
  CompileOptions one = LlamaStepOptions(*c, Device::Cuda(0), RecomputePolicy::kNone);
  ASSERT_TRUE(ChooseRecompute(fwd, budget, 1, &one).ok());
  EXPECT_NE(one.recompute, RecomputePolicy::kNone);
  CompileOptions two = LlamaStepOptions(*c, Device::Cuda(0), RecomputePolicy::kFull);
  two.micro_batches = 2;
  auto bytes = ChooseRecompute(fwd, budget, 1, &two);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(two.recompute, RecomputePolicy::kNone);
  EXPECT_LE(*bytes, budget);
  std::cout << absl::StrFormat("1b, 2 micro-batches: no recompute, %.2f GiB planned\n", *bytes / kGiB);
}

// CompileOptions::wgrad_stream at the 1b shapes: the weight-gradient matmuls' inputs live until
// their join, which the plan counts; what --recompute=auto then picks under the default budget.
TEST(LlamaStepTest, WgradStreamPlanAtThe1b) {
  auto c = LlamaBenchConfigNamed("1b");
  ASSERT_TRUE(c.ok());
  graph::Graph fwd = LlamaForward(c->model);
  int64_t planned[2] = {0, 0};
  for (const bool wgrad : {false, true}) {
    CompileOptions o = LlamaStepOptions(*c, Device::Cuda(0), RecomputePolicy::kNone);
    o.wgrad_stream = wgrad;
    auto bytes = ChooseRecompute(fwd, int64_t((32.0 - 0.25) * kGiB), 1, &o);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    planned[wgrad] = *bytes;
    CompileOptions none = o;
    none.recompute = RecomputePolicy::kNone;
    const PlannedMemory m = PlanMemory(fwd, none).value();
    std::cout << absl::StrFormat("1b, wgrad_stream %d: auto under 31.75 GiB picks policy %d with SwiGLU in %d layers "
                                 "(%.2f GiB); no recompute %.2f GiB\n",
                                 int(wgrad), int(o.recompute), o.recompute_swiglu_layers, *bytes / kGiB,
                                 (m.arena_bytes + m.state_bytes) / kGiB);
  }
  EXPECT_LE(planned[1], int64_t((32.0 - 0.25) * kGiB));
}

// CompileOptions::offload_before_recompute (llama_step_benchmark --offload_first) at the 1b
// shapes: a budget between the selective and the no-recompute plans takes no recompute with the
// fewest kept activations offloaded (one fewer does not fit), and so does --memory_budget_gib=32.8
// (0.8x the peer's peak, less the benchmark's 0.25). The offloads are the first layers' (their backward readers are the last
// nodes); at the plan's peak, the start of the backward, they are on the host.
TEST(LlamaStepTest, OffloadBeforeRecomputeTakesNoRecomputeWithTheFewestOffloads) {
  auto c = LlamaBenchConfigNamed("1b");
  ASSERT_TRUE(c.ok());
  graph::Graph fwd = LlamaForward(c->model);
  auto total = [&](RecomputePolicy rp, int swiglu_layers, int offload) {
    CompileOptions o = LlamaStepOptions(*c, Device::Cuda(0), rp);
    o.recompute_swiglu_layers = swiglu_layers;
    o.offload_activations = offload;
    PlannedMemory m = PlanMemory(fwd, o).value();
    return m.arena_bytes + m.state_bytes;
  };
  const int64_t none = total(RecomputePolicy::kNone, -1, 0), selective = total(RecomputePolicy::kSelective, 0, 0);
  ASSERT_LT(selective, none);
  for (const int64_t budget : {(none + selective) / 2, int64_t((32.8 - 0.25) * kGiB)}) {
    CompileOptions o = LlamaStepOptions(*c, Device::Cuda(0), RecomputePolicy::kSelective);
    o.offload_before_recompute = true;
    auto planned = ChooseRecompute(fwd, budget, 1, &o);
    ASSERT_TRUE(planned.ok()) << planned.status();
    EXPECT_EQ(o.recompute, RecomputePolicy::kNone);
    ASSERT_GT(o.offload_activations, 0);
    EXPECT_LE(*planned, budget);
    EXPECT_EQ(*planned, total(RecomputePolicy::kNone, -1, o.offload_activations));
    EXPECT_GT(total(RecomputePolicy::kNone, -1, o.offload_activations - 1), budget);

    graph::Graph train = PrepareTrainingGraph(fwd, o).value();
    LowerOptions lo;
    lo.plan_only = true;
    lo.offload_activations = o.offload_activations;
    auto p = Lower(std::move(train), o.binding, o.device, lo);
    ASSERT_TRUE(p.ok()) << p.status();
    const ArenaPeak peak = FindArenaPeak(**p);
    int first_layers = 0;  // offloads from layers 0 and 1 (and the embedding's output)
    for (const Step& st : (*p)->schedule.steps) {
      if (!absl::StartsWith(st.name, "offload ")) continue;
      first_layers += absl::StrContains(st.name, "@layers.0.") || absl::StrContains(st.name, "@layers.1.") ||
                      absl::StrContains(st.name, "@tok_embeddings");
    }
    EXPECT_EQ(first_layers, o.offload_activations);
    // Every wait for a copy to the host comes before the peak, every copy back after it.
    for (const Step& st : (*p)->schedule.steps) {
      if (absl::StartsWith(st.name, "wait offload ")) {
        EXPECT_LE(st.node, peak.node) << st.name;
      }
      if (absl::StartsWith(st.name, "reload ")) {
        EXPECT_GT(st.node, peak.node) << st.name;
      }
    }
    std::cout << absl::StrFormat(
        "1b under %.2f GiB, offload before recompute: no recompute, %d activations offloaded (%.2f GiB host), "
        "%.2f GiB planned (arena %.2f), against %.2f GiB without offloads\n%s",
        budget / kGiB, o.offload_activations, (*p)->offload_host_bytes / kGiB, *planned / kGiB,
        (*p)->plan.arena_bytes / kGiB, none / kGiB, peak.ToString(16));
  }
  // The default budget (32 GiB less 0.25): the copies past the 17th are not modeled through
  // before the peak (kOffloadForwardBytesPerNode), so no count fits and the order goes on to
  // selective recompute.
  CompileOptions o = LlamaStepOptions(*c, Device::Cuda(0), RecomputePolicy::kNone);
  o.offload_before_recompute = true;
  auto planned = ChooseRecompute(fwd, int64_t((32.0 - 0.25) * kGiB), 1, &o);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(o.recompute, RecomputePolicy::kSelective);
  EXPECT_EQ(o.offload_activations, 0);
}

// ---- GPU ----------------------------------------------------------------------------------------

// The CUDA step (bf16 kernels, cuBLASLt, fused CE, multi-tensor AdamW) against the CPU step with
// the same bf16 mixed precision: loss, every gradient, and the weights after three steps; with the
// MLP's dh matmul fused into the SwiGLU backward (on sm_90: the tiny shape is the kernel's) and
// without, and the two CUDA steps' gradients against each other.
TEST(LlamaStepTest, CudaStepMatchesTheCpuStep) {
  SG_SKIP_WITHOUT_CUDA();
  auto c = LlamaBenchConfigNamed("tiny");  // head_dim 64: the CUDA attention kernels apply
  ASSERT_TRUE(c.ok());
  graph::Graph fwd = LlamaForward(c->model);
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  for (auto& [k, h] : params) {
    if (h.shape.size() == 2) {
      for (double& v : h.data) v *= 0.1;  // keep activations in a sane range at dim 128
    }
  }
  // 0: CPU, 1: CUDA with the fused SwiGLU backward where it runs, 2: CUDA without.
  std::unique_ptr<CompiledStep> steps[3];
  for (int d = 0; d < 3; ++d) {
    CompileOptions o = LlamaStepOptions(*c, d == 0 ? Device::Cpu() : Device::Cuda(0), RecomputePolicy::kNone);
    o.cuda_graph = false;
    o.swiglu_backward_gemm = d != 2;
    steps[d] = CompileWithParams(fwd, o, params);
    ASSERT_NE(steps[d], nullptr);
    ASSERT_TRUE(steps[d]->SetLearningRate(1e-3f).ok());
    for (const auto& [op, n] : StepsByOp(*steps[d], "reference")) ADD_FAILURE() << "reference on " << d << ": " << op;
  }
  int fused = 0;
  for (const Step& st : steps[1]->program().schedule.steps) fused += absl::StartsWith(st.name, "matmul + swiglu_backward");
  const bool hopper = kernels::WgmmaGemmSwiGluBackwardSupports(128, 64, 256, DType::kBF16, Device::Cuda(0)).ok();
  EXPECT_EQ(fused, hopper ? int(c->model.n_layers) : 0);
  std::cout << "fused SwiGLU backward steps: " << fused << (hopper ? " (sm_90)" : " (not sm_90: unfused)") << "\n";
  for (int it = 0; it < 3; ++it) {
    Feeds batch = TinyBatch(c->batch, c->seq, c->model.vocab);
    auto host = OnDevice(batch, Device::Cpu());
    ASSERT_TRUE(steps[0]->Run(Views(host)).ok());
    auto m0 = steps[0]->ReadMetrics();
    ASSERT_TRUE(m0.ok()) << m0.status();
    for (int d = 1; d < 3; ++d) {
      SCOPED_TRACE(d == 1 ? "fused" : "unfused");
      ASSERT_TRUE(steps[d]->Run(Views(host)).ok());  // host batch: the pinned staging path
      auto m1 = steps[d]->ReadMetrics();
      ASSERT_TRUE(m1.ok()) << m1.status();
      EXPECT_NEAR(m1->loss, m0->loss, 1e-2 * m0->loss) << "step " << it;
      EXPECT_NEAR(m1->grad_norm, m0->grad_norm, 3e-2 * m0->grad_norm) << "step " << it;
      EXPECT_EQ(m1->step, it + 1);
    }
    if (it == 0) {
      for (const std::string& name : steps[0]->parameter_names()) {
        const std::vector<double> cpu = Read(*steps[0], "grad:" + name), f = Read(*steps[1], "grad:" + name),
                                  u = Read(*steps[2], "grad:" + name);
        EXPECT_LT(sg::testing::RelativeError(f, cpu), 5e-2) << name;
        EXPECT_LT(sg::testing::RelativeError(u, cpu), 5e-2) << name;
        // The fused and unfused CUDA steps differ only in how dh's GEMM rounds (ours vs cuBLASLt).
        EXPECT_LT(sg::testing::RelativeError(f, u), 1e-2) << name;
      }
    }
  }
  for (const std::string& name : steps[0]->parameter_names()) {
    for (int d = 1; d < 3; ++d) {
      EXPECT_LT(sg::testing::RelativeError(Read(*steps[d], name), Read(*steps[0], name)), 1e-2) << d << " " << name;
    }
  }
}

TEST(LlamaStepTest, CudaBf16GradientsAreTheF32GradientsRounded) {
  SG_SKIP_WITHOUT_CUDA();
  auto c = LlamaBenchConfigNamed("tiny");  // head_dim 64: the CUDA attention kernels apply
  ASSERT_TRUE(c.ok());
  ExpectBf16GradientsMatchF32(c->model, c->batch, c->seq, Device::Cuda(0));
}

// Replaying the captured step equals running it eagerly, with device-resident batches, and the
// loss of a freshly initialized 124m model at the benchmark shape starts near ln(vocab) and falls.
TEST(LlamaStepTest, CudaGraphReplayAt124mShapes) {
  SG_SKIP_WITHOUT_CUDA();
  auto c = LlamaBenchConfigNamed("124m");
  ASSERT_TRUE(c.ok());
  graph::Graph fwd = LlamaForward(c->model);
  auto host = RandomTokenBatch(*c, 7);
  ASSERT_TRUE(host.ok());
  std::map<std::string, Tensor> dev;
  for (const auto& [k, t] : *host) {
    dev[k] = Tensor::Empty(t.shape(), t.dtype(), Device::Cuda(0)).value();
    ASSERT_TRUE(CopyTensor(t, dev[k], Stream::Cpu()).ok());
  }
  // Runs 0 and 1 eager, run 2 captured: the two eager runs measure the run-to-run spread the
  // nondeterministic kernels (atomic / bulk-reduced dq, embedding gradients) leave after five AdamW
  // steps, and replay must stay within a small multiple of it.
  std::vector<float> losses[3];
  std::vector<std::vector<double>> weights[3];
  for (int run = 0; run < 3; ++run) {
    const int captured = run == 2;
    CompileOptions o = LlamaStepOptions(*c, Device::Cuda(0));
    o.cuda_graph = captured == 1;
    auto step = Compile(fwd, o);
    ASSERT_TRUE(step.ok()) << step.status();
    ASSERT_TRUE(InitLlamaParameters(**step, fwd, 3).ok());
    ASSERT_TRUE((*step)->SetLearningRate(3e-4f).ok());
    for (int it = 0; it < 5; ++it) {
      ASSERT_TRUE((*step)->Run(Views(dev)).ok());
      auto m = (*step)->ReadMetrics();
      ASSERT_TRUE(m.ok()) << m.status();
      losses[run].push_back(m->loss);
    }
    EXPECT_EQ((*step)->executor().replaying_graph(), captured == 1);
    for (const char* name : {"output.weight", "layers.0.attention.wq.weight", "layers.11.ffn_norm.weight"}) {
      weights[run].push_back(Read(**step, name));
    }
  }
  EXPECT_NEAR(losses[0][0], std::log(32000.0), 0.3);
  EXPECT_LT(losses[0].back(), losses[0][0]);  // the same batch five times: it must be learned
  for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_NEAR(losses[2][i], losses[0][i], 1e-3 * losses[0][i]) << i;
  for (size_t i = 0; i < weights[0].size(); ++i) {
    const double spread = sg::testing::RelativeError(weights[1][i], weights[0][i]);
    const double replay = sg::testing::RelativeError(weights[2][i], weights[0][i]);
    std::cout << "weights " << i << ": eager vs eager " << spread << ", replay vs eager " << replay << "\n";
    EXPECT_LT(replay, 3 * spread + 1e-4) << i;
  }
}

}  // namespace
}  // namespace sg::compiler
