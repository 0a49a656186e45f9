// The fused MLP up-projection in the lowering (LowerOptions::MlpFusion, CompileOptions::fuse_mlp):
// which groups it fuses under each recompute policy (CPU, through the composed forward, which
// has the fused layout, backward and memory plan without the Hopper kernel), that the kernel mode
// falls back to the exact unfused lowering where WgmmaGemmSwiGlu does not apply, the plan at the
// 1b shapes, and (GPU) the fused step against the unfused step.
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "compiler/compile.h"
#include "compiler/llama_step.h"
#include "compiler/testing/tiny_llama.h"
#include "graph/models/llama.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::compiler {
namespace {

using graph::Feeds;
using MlpFusion = LowerOptions::MlpFusion;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// F = 128: one interleave block of gate and of up per row.
graph::LlamaConfig SmallConfig() {
  graph::LlamaConfig c = graph::LlamaConfig::Tiny();
  c.dim = 32;
  c.ffn_dim = 128;
  return c;
}

graph::Graph Forward(const graph::LlamaConfig& c) {
  auto g = graph::BuildLlamaForward(c);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : graph::Graph();
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

std::vector<double> Read(CompiledStep& s, const std::string& name) {
  EXPECT_TRUE(s.executor().Synchronize().ok());
  auto v = s.View(name);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? sg::testing::ToHost(*v) : std::vector<double>{};
}

// Schedule steps whose name starts with `prefix`.
int Count(const CompiledStep& s, absl::string_view prefix) {
  int n = 0;
  for (const Step& st : s.program().schedule.steps) n += absl::StartsWith(st.name, prefix);
  return n;
}

std::vector<std::string> StepNames(const CompiledStep& s) {
  std::vector<std::string> names;
  for (const Step& st : s.program().schedule.steps) names.push_back(st.name);
  return names;
}

// One training step of `fwd` with and without the fusion from the same parameters and batch.
struct Pair {
  std::unique_ptr<CompiledStep> off, on;
};

Pair CompilePair(const graph::Graph& fwd, CompileOptions o, MlpFusion mode, const Feeds& params) {
  Pair p;
  o.fuse_mlp = MlpFusion::kOff;
  p.off = CompileWithParams(fwd, o, params);
  o.fuse_mlp = mode;
  p.on = CompileWithParams(fwd, o, params);
  return p;
}

Feeds Batch(int64_t batch, int64_t seq, int64_t vocab) {
  return testing::RandomBatch(batch, seq, vocab, sg::testing::Rng());
}

// Every layer's MLP is one group under each policy: the forward launch (twice under full
// recompute: the recomputed projection reruns it), one W13 interleave per layer, the recomputed
// swiglu on the kept gate_up under selective recompute, and the packed backward; no unfused
// swiglu step is left. The composed forward's step equals the unfused one within rounding: f32
// to 1e-5 (only summation order differs), bf16 mixed to bf16 tolerance.
TEST(MlpFusionTest, ComposedFusesEveryLayerAndMatchesTheUnfusedStep) {
  const graph::LlamaConfig c = SmallConfig();
  graph::Graph fwd = Forward(c);
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  Feeds batch = Batch(2, 8, c.vocab);
  const int layers = int(c.n_layers);
  for (Precision prec : {Precision::kF32, Precision::kBF16Mixed}) {
    for (RecomputePolicy rp : {RecomputePolicy::kNone, RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
      SCOPED_TRACE(absl::StrFormat("precision %s recompute %s", PrecisionName(prec),
                                   std::string(graph::RecomputePolicyName(rp))));
      CompileOptions o;
      o.binding = {{"batch", 2}, {"seq", 8}};
      o.precision = prec;
      o.recompute = rp;
      Pair p = CompilePair(fwd, o, MlpFusion::kComposed, params);
      ASSERT_NE(p.off, nullptr);
      ASSERT_NE(p.on, nullptr);
      EXPECT_EQ(Count(*p.off, "mlp "), 0);
      EXPECT_EQ(Count(*p.on, "mlp w13 interleave"), layers);
      EXPECT_EQ(Count(*p.on, "mlp gemm(w13) + swiglu_packed"), rp == RecomputePolicy::kFull ? 2 * layers : layers);
      EXPECT_EQ(Count(*p.on, "mlp swiglu_packed (recompute)"), rp == RecomputePolicy::kSelective ? layers : 0);
      EXPECT_EQ(Count(*p.on, "mlp swiglu_packed_backward"), layers);
      EXPECT_EQ(Count(*p.on, "mlp dx gemm"), layers);
      EXPECT_EQ(Count(*p.on, "mlp dw13 gemm"), layers);
      EXPECT_EQ(Count(*p.on, "swiglu"), 0) << "no unfused swiglu / swiglu_backward step left";
      EXPECT_GT(Count(*p.off, "swiglu"), 0);
      EXPECT_EQ(p.on->program().schedule.steps.size() + (rp == RecomputePolicy::kFull ? 5 : 3) * layers,
                p.off->program().schedule.steps.size())
          << "per layer: the two projections and the swiglu become one launch (twice under full recompute) after "
             "one interleave, the swiglu backward stays one, the partial dx and one dW matmul go";
      auto dev = OnDevice(batch, Device::Cpu());
      ASSERT_TRUE(p.off->Run(Views(dev)).ok());
      absl::Status s = p.on->Run(Views(dev));
      ASSERT_TRUE(s.ok()) << s;
      auto m0 = p.off->ReadMetrics(), m1 = p.on->ReadMetrics();
      ASSERT_TRUE(m0.ok() && m1.ok());
      const double tol = prec == Precision::kF32 ? 1e-5 : 2e-2;
      EXPECT_NEAR(m1->loss, m0->loss, tol * m0->loss);
      EXPECT_NEAR(m1->grad_norm, m0->grad_norm, tol * m0->grad_norm);
      for (const std::string& name : p.off->parameter_names()) {
        EXPECT_LT(sg::testing::RelativeError(Read(*p.on, "grad:" + name), Read(*p.off, "grad:" + name)), tol) << name;
      }
    }
  }
}

// Where WgmmaGemmSwiGlu does not apply (here: the CPU) the kernel mode is the unfused lowering
// exactly: the same schedule, the same memory plan, bitwise the same loss and gradients.
TEST(MlpFusionTest, KernelModeFallsBackToTheExactUnfusedStep) {
  const graph::LlamaConfig c = SmallConfig();
  graph::Graph fwd = Forward(c);
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  CompileOptions o;
  o.binding = {{"batch", 2}, {"seq", 8}};
  o.precision = Precision::kBF16Mixed;
  o.recompute = RecomputePolicy::kSelective;
  Pair p = CompilePair(fwd, o, MlpFusion::kKernel, params);
  ASSERT_NE(p.off, nullptr);
  ASSERT_NE(p.on, nullptr);
  EXPECT_EQ(StepNames(*p.on), StepNames(*p.off));
  EXPECT_EQ(p.on->program().plan.arena_bytes, p.off->program().plan.arena_bytes);
  auto dev = OnDevice(Batch(2, 8, c.vocab), Device::Cpu());
  ASSERT_TRUE(p.off->Run(Views(dev)).ok());
  ASSERT_TRUE(p.on->Run(Views(dev)).ok());
  EXPECT_EQ(p.on->ReadMetrics()->loss, p.off->ReadMetrics()->loss);
  for (const std::string& name : p.off->parameter_names()) {
    EXPECT_EQ(Read(*p.on, "grad:" + name), Read(*p.off, "grad:" + name)) << name;
  }
}

// Shapes outside the interleave (F = 24, not a multiple of 128) stay unfused even when composed.
TEST(MlpFusionTest, ShapesOutsideTheLayoutStayUnfused) {
  graph::Graph fwd = Forward(graph::LlamaConfig::Tiny());
  CompileOptions o;
  o.binding = {{"batch", 2}, {"seq", 8}};
  o.precision = Precision::kBF16Mixed;
  o.fuse_mlp = MlpFusion::kComposed;
  auto step = Compile(fwd, o);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(Count(**step, "mlp "), 0);
  EXPECT_GT(Count(**step, "swiglu"), 0);
}

// At the 1b shapes on an sm_90 device (planning only) the kernel mode fuses every layer: three
// steps fewer per layer (five under full recompute: the recomputed projections fuse too), every op
// on a kernel.
TEST(MlpFusionTest, PlansTheFusedLayoutAt1bShapes) {
  auto c = LlamaBenchConfigNamed("1b");
  ASSERT_TRUE(c.ok());
  graph::Graph fwd = Forward(c->model);
  for (RecomputePolicy rp : {RecomputePolicy::kNone, RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
    CompileOptions o = LlamaStepOptions(*c, Device::Cuda(0), rp);
    auto off = PlanMemory(fwd, o);
    o.fuse_mlp = MlpFusion::kKernel;
    auto on = PlanMemory(fwd, o);
    ASSERT_TRUE(off.ok() && on.ok()) << off.status() << " " << on.status();
    EXPECT_EQ(on->impls.count("reference"), 0u);
    const int fewer = rp == RecomputePolicy::kFull ? 5 : 3;
    EXPECT_EQ(off->impls.at("kernel") - on->impls.at("kernel"), fewer * int(c->model.n_layers))
        << graph::RecomputePolicyName(rp);
    EXPECT_EQ(on->state_bytes, off->state_bytes);
    std::cout << absl::StrFormat("1b recompute=%s: arena %.2f GiB unfused, %.2f GiB fused\n",
                                 std::string(graph::RecomputePolicyName(rp)), off->arena_bytes / kGiB,
                                 on->arena_bytes / kGiB);
  }
}

TEST(MlpFusionTest, EnvironmentOverridesTheOption) {
  ASSERT_EQ(unsetenv("SG_FUSE_MLP"), 0);
  EXPECT_EQ(MlpFusionFromEnv(MlpFusion::kComposed).value(), MlpFusion::kComposed);
  ASSERT_EQ(setenv("SG_FUSE_MLP", "1", 1), 0);
  EXPECT_EQ(MlpFusionFromEnv(MlpFusion::kOff).value(), MlpFusion::kKernel);
  ASSERT_EQ(setenv("SG_FUSE_MLP", "0", 1), 0);
  EXPECT_EQ(MlpFusionFromEnv(MlpFusion::kKernel).value(), MlpFusion::kOff);
  ASSERT_EQ(setenv("SG_FUSE_MLP", "composed", 1), 0);
  EXPECT_EQ(MlpFusionFromEnv(MlpFusion::kOff).value(), MlpFusion::kComposed);
  ASSERT_EQ(setenv("SG_FUSE_MLP", "yes", 1), 0);
  auto bad = MlpFusionFromEnv(MlpFusion::kOff);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'yes'"), absl::string_view::npos) << bad.status();
  ASSERT_EQ(unsetenv("SG_FUSE_MLP"), 0);
}

// ---- GPU ----------------------------------------------------------------------------------------

// The fused step (WgmmaGemmSwiGlu on the H200, the packed backward) against the unfused step on the
// "tiny" benchmark model (M = 128 tokens, K = 128, F = 256): loss, gradient norm and every gradient
// of the first step, and the weights after three steps, under each recompute policy; the fused
// step replayed as a CUDA graph after its warm-up step. The composed forward runs too (the same
// layout with cuBLASLt and SwiGluPackedForward), to tell a kernel fault from a layout fault.
TEST(MlpFusionTest, CudaFusedStepMatchesTheUnfusedStep) {
  SG_SKIP_WITHOUT_CUDA();
  auto c = LlamaBenchConfigNamed("tiny");
  ASSERT_TRUE(c.ok());
  graph::Graph fwd = Forward(c->model);
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  for (auto& [k, h] : params) {
    if (h.shape.size() == 2) {
      for (double& v : h.data) v *= 0.1;  // keep activations in a sane range at dim 128
    }
  }
  const int layers = int(c->model.n_layers);
  for (MlpFusion mode : {MlpFusion::kKernel, MlpFusion::kComposed}) {
    for (RecomputePolicy rp : {RecomputePolicy::kNone, RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
      SCOPED_TRACE(absl::StrFormat("%s recompute %s", mode == MlpFusion::kKernel ? "kernel" : "composed",
                                   std::string(graph::RecomputePolicyName(rp))));
      CompileOptions o = LlamaStepOptions(*c, Device::Cuda(0), rp);
      o.cuda_graph = false;
      o.fuse_mlp = MlpFusion::kOff;
      std::unique_ptr<CompiledStep> off = CompileWithParams(fwd, o, params);
      o.cuda_graph = true;
      o.fuse_mlp = mode;
      std::unique_ptr<CompiledStep> on = CompileWithParams(fwd, o, params);
      ASSERT_NE(off, nullptr);
      ASSERT_NE(on, nullptr);
      const int launches = rp == RecomputePolicy::kFull ? 2 * layers : layers;
      EXPECT_EQ(Count(*on, mode == MlpFusion::kKernel ? "mlp wgmma_gemm_swiglu" : "mlp gemm(w13)"), launches)
          << "the H200 takes WgmmaGemmSwiGlu at these shapes";
      EXPECT_EQ(Count(*on, "mlp dw13 gemm"), layers);
      for (auto* s : {off.get(), on.get()}) ASSERT_TRUE(s->SetLearningRate(1e-3f).ok());
      for (int it = 0; it < 3; ++it) {
        auto host = OnDevice(Batch(c->batch, c->seq, c->model.vocab), Device::Cpu());
        ASSERT_TRUE(off->Run(Views(host)).ok());
        absl::Status s = on->Run(Views(host));
        ASSERT_TRUE(s.ok()) << s;
        auto m0 = off->ReadMetrics(), m1 = on->ReadMetrics();
        ASSERT_TRUE(m0.ok() && m1.ok()) << m1.status();
        EXPECT_NEAR(m1->loss, m0->loss, 1e-2 * m0->loss) << "step " << it;
        EXPECT_NEAR(m1->grad_norm, m0->grad_norm, 3e-2 * m0->grad_norm) << "step " << it;
        if (it == 0) {
          for (const std::string& name : off->parameter_names()) {
            EXPECT_LT(sg::testing::RelativeError(Read(*on, "grad:" + name), Read(*off, "grad:" + name)), 3e-2) << name;
          }
        }
      }
      EXPECT_TRUE(on->executor().replaying_graph());
      for (const std::string& name : off->parameter_names()) {
        EXPECT_LT(sg::testing::RelativeError(Read(*on, name), Read(*off, name)), 1e-2) << name;
      }
    }
  }
}

}  // namespace
}  // namespace sg::compiler
