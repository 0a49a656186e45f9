// f16 mixed precision with dynamic loss scaling (Precision::kF16Mixed) on a tiny Llama: gradients
// and a few training steps against the f32 step, the overflow skip (parameters, moments and step
// bitwise unchanged, scale backed off to its floor), growth after growth_interval good steps, the
// CUDA plan (every op on a kernel, attention included at head_dim 64), and (GPU) the CUDA f16 step
// against the CPU f16 step (an attention-free model and a Llama with head_dim 64) and CUDA-graph
// replay against eager.
#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "compiler/compile.h"
#include "compiler/testing/tiny_llama.h"
#include "graph/builder.h"
#include "graph/ops.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::compiler {
namespace {

using graph::Feeds;

constexpr int64_t kBatch = 2, kSeq = 8, kVocab = 32;

CompileOptions Options(Precision p, Device d = Device::Cpu()) {
  CompileOptions o;
  o.device = d;
  o.precision = p;
  o.binding = {{"batch", kBatch}, {"seq", kSeq}};
  o.adamw.max_grad_norm = 0.5;  // small enough that clipping is active
  o.loss_scale.initial_scale = 1024;
  return o;
}

graph::Graph Forward() {
  auto g = testing::TinyLlama({});
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : graph::Graph();
}

// Compiles, writes the parameters, poisons the arena (an unwritten value reads as NaN).
std::unique_ptr<CompiledStep> CompileWith(const graph::Graph& fwd, const Feeds& params, const CompileOptions& o) {
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

struct Batch {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, TensorView> Views() const {
    std::map<std::string, TensorView> v;
    for (const auto& [k, t] : tensors) v[k] = t.view();
    return v;
  }
};

Batch BatchOn(const Feeds& f, Device d) {
  Batch b;
  for (const auto& [k, h] : f) b.tensors[k] = sg::testing::FromHost(h.data, h.shape, h.dtype, d);
  return b;
}

std::vector<double> ReadValue(CompiledStep& s, const std::string& name) {
  EXPECT_TRUE(s.executor().Synchronize().ok());
  auto v = s.View(name);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? sg::testing::ToHost(*v) : std::vector<double>{};
}

float ReadScalar(CompiledStep& s, const std::string& name) {
  float v = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(s.Read(name, TensorView(&v, DType::kF32, {}, Device::Cpu())).ok()) << name;
  return v;
}

void WriteScalar(CompiledStep& s, const std::string& name, float v) {
  ASSERT_TRUE(s.Write(name, TensorView(&v, DType::kF32, {}, Device::Cpu())).ok()) << name;
}

// The document's consistency check, for f16: the gradients (read as the backward computed them,
// i.e. times the loss scale, then divided by it) within 5% (relative L2, per parameter) of the
// f32 step's; the reported loss unscaled and within 2%.
TEST(F16MixedPrecisionTest, GradientsMatchF32) {
  graph::Graph fwd = Forward();
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  Batch batch = BatchOn(testing::RandomBatch(kBatch, kSeq, kVocab, sg::testing::Rng()), Device::Cpu());
  auto f32 = CompileWith(fwd, params, Options(Precision::kF32));
  auto f16 = CompileWith(fwd, params, Options(Precision::kF16Mixed));
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(f16, nullptr);
  const float scale = ReadScalar(*f16, kLossScaleName);
  EXPECT_EQ(scale, 1024.f);
  ASSERT_TRUE(f32->Run(batch.Views()).ok());
  ASSERT_TRUE(f16->Run(batch.Views()).ok());
  auto m32 = f32->ReadMetrics();
  auto m16 = f16->ReadMetrics();
  ASSERT_TRUE(m32.ok() && m16.ok()) << m16.status();
  EXPECT_NEAR(m16->loss, m32->loss, 0.02 * m32->loss);
  EXPECT_NEAR(m16->grad_norm, m32->grad_norm, 0.05 * m32->grad_norm) << "the norm is reported unscaled";
  EXPECT_FALSE(m16->skipped);
  EXPECT_EQ(m16->loss_scale, 1024.f);
  EXPECT_EQ(m16->step, 1);
  for (const std::string& name : f32->parameter_names()) {
    auto g16 = f16->View("grad:" + name);
    ASSERT_TRUE(g16.ok());
    EXPECT_EQ(g16->dtype(), DType::kF32) << name << ": gradients stay f32";
    std::vector<double> g = ReadValue(*f16, "grad:" + name);
    for (double& x : g) x /= scale;
    EXPECT_LT(sg::testing::RelativeError(g, ReadValue(*f32, "grad:" + name)), 0.05) << name;
  }
  // Activations really are f16, and the parameters' f16 copies come from the AdamW pass.
  int f16_values = 0;
  const graph::Graph& g = f16->training_graph();
  for (const graph::Node& n : g.nodes()) {
    if (n.op == graph::OpKind::kMatmul) f16_values += g.type(n.outputs[0]).dtype == DType::kF16;
  }
  EXPECT_GT(f16_values, 0);
  EXPECT_EQ(f16->program().weight_copies.size(), f16->parameter_names().size());
  // Real kernels (attention aside: the CPU attention kernel is f32/bf16, the interpreter runs it),
  // the cross-entropy backward fused into the forward's launch, one scaler step.
  std::map<std::string, int> ops;
  for (const Step& st : f16->program().schedule.steps) {
    const std::string op = st.node >= 0 ? graph::OpName(g.nodes()[st.node].op) : st.name;
    ++ops[op];
    if (st.impl == "reference") {
      EXPECT_TRUE(absl::StartsWith(op, "attention")) << op;
    }
  }
  EXPECT_EQ(ops.count("softmax_cross_entropy_backward"), 0u);
  EXPECT_EQ(ops.count("cast"), 0u);
  int scaler_steps = 0;
  for (const Step& st : f16->program().schedule.steps) scaler_steps += absl::StrContains(st.name, "loss scale update");
  EXPECT_EQ(scaler_steps, 1);
}

// A step whose gradients overflow changes nothing but the scaler: parameters, their f16 copies,
// both moments and the step counter are bitwise unchanged, the scale halves, the step reports
// skipped, and the next step with a sane scale updates again.
TEST(F16MixedPrecisionTest, OverflowSkipsTheUpdateAndHalvesTheScale) {
  graph::Graph fwd = Forward();
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  Batch batch = BatchOn(testing::RandomBatch(kBatch, kSeq, kVocab, sg::testing::Rng()), Device::Cpu());
  auto step = CompileWith(fwd, params, Options(Precision::kF16Mixed));
  ASSERT_NE(step, nullptr);
  ASSERT_TRUE(step->SetLearningRate(1e-2f).ok());
  ASSERT_TRUE(step->Run(batch.Views()).ok());  // a good step first: the moments are not zero
  auto m = step->ReadMetrics();
  ASSERT_TRUE(m.ok());
  ASSERT_FALSE(m->skipped);
  ASSERT_EQ(m->step, 1);
  EXPECT_EQ(ReadScalar(*step, "loss_scale.good_steps"), 1.f);

  auto snapshot = [&] {
    std::map<std::string, std::vector<double>> s;
    for (const std::string& p : step->parameter_names()) {
      for (const std::string& name : {p, AdamMName(p), AdamVName(p)}) s[name] = ReadValue(*step, name);
    }
    for (size_t i = 0; i < step->program().weight_copies.size(); ++i) {
      s["copy " + std::to_string(i)] = sg::testing::ToHost(step->program().weight_copies[i].second);
    }
    return s;
  };
  const auto before = snapshot();
  WriteScalar(*step, kLossScaleName, 1e30f);  // dlogits overflow f16
  ASSERT_TRUE(step->Run(batch.Views()).ok());
  m = step->ReadMetrics();
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->skipped);
  EXPECT_FALSE(std::isfinite(m->grad_norm));
  EXPECT_TRUE(std::isfinite(m->loss)) << "the forward is unaffected by the scale";
  EXPECT_EQ(m->step, 1) << "the step counter is unchanged";
  EXPECT_EQ(m->loss_scale, 5e29f);
  EXPECT_EQ(ReadScalar(*step, "loss_scale.good_steps"), 0.f);
  const auto after = snapshot();
  for (const auto& [name, v] : before) {
    const std::vector<double>& w = after.at(name);
    ASSERT_EQ(v.size(), w.size());
    int changed = 0;
    for (size_t i = 0; i < v.size(); ++i) changed += v[i] != w[i];
    EXPECT_EQ(changed, 0) << name;
  }

  WriteScalar(*step, kLossScaleName, 1024.f);
  ASSERT_TRUE(step->Run(batch.Views()).ok());
  m = step->ReadMetrics();
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE(m->skipped);
  EXPECT_EQ(m->step, 2);
  const std::string p0 = step->parameter_names()[0];
  EXPECT_NE(ReadValue(*step, p0), before.at(p0)) << "the update runs again";
}

// An overflow in the forward (an f16 weight copy that is inf) backs the scale off, but never
// below min_scale.
TEST(F16MixedPrecisionTest, BackoffStopsAtTheFloor) {
  graph::Graph fwd = Forward();
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  for (double& v : params.at("output.weight").data) v *= 1e6;  // beyond f16's 65504
  Batch batch = BatchOn(testing::RandomBatch(kBatch, kSeq, kVocab, sg::testing::Rng()), Device::Cpu());
  CompileOptions o = Options(Precision::kF16Mixed);
  o.loss_scale.initial_scale = 3;
  o.loss_scale.min_scale = 2;
  auto step = CompileWith(fwd, params, o);
  ASSERT_NE(step, nullptr);
  for (float expected : {2.f, 2.f}) {
    ASSERT_TRUE(step->Run(batch.Views()).ok());
    auto m = step->ReadMetrics();
    ASSERT_TRUE(m.ok());
    EXPECT_TRUE(m->skipped);
    EXPECT_EQ(m->step, 0);
    EXPECT_EQ(m->loss_scale, expected);
  }
}

// With growth_interval 2 the scale doubles after every second good step, and the count of good
// steps restarts.
TEST(F16MixedPrecisionTest, ScaleGrowsAfterTheInterval) {
  graph::Graph fwd = Forward();
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  Batch batch = BatchOn(testing::RandomBatch(kBatch, kSeq, kVocab, sg::testing::Rng()), Device::Cpu());
  CompileOptions o = Options(Precision::kF16Mixed);
  o.loss_scale.growth_interval = 2;
  auto step = CompileWith(fwd, params, o);
  ASSERT_NE(step, nullptr);
  const float expected_scale[] = {1024, 2048, 2048, 4096};
  const float expected_good[] = {1, 0, 1, 0};
  for (int it = 0; it < 4; ++it) {
    ASSERT_TRUE(step->Run(batch.Views()).ok());
    auto m = step->ReadMetrics();
    ASSERT_TRUE(m.ok());
    EXPECT_FALSE(m->skipped) << it;
    EXPECT_EQ(m->step, it + 1);
    EXPECT_EQ(m->loss_scale, expected_scale[it]) << it;
    EXPECT_EQ(ReadScalar(*step, kLossScaleName), expected_scale[it]) << it;
    EXPECT_EQ(ReadScalar(*step, "loss_scale.good_steps"), expected_good[it]) << it;
  }
}

// Several f16 steps track the f32 steps' losses (the same batch: the loss falls in both), and the
// weights stay close.
TEST(F16MixedPrecisionTest, TrainingTracksF32) {
  graph::Graph fwd = Forward();
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  Batch batch = BatchOn(testing::RandomBatch(kBatch, kSeq, kVocab, sg::testing::Rng()), Device::Cpu());
  // AdamW's m / (sqrt(v) + eps) at eps 1e-8 is +-lr for any near-zero gradient entry, so f16's
  // rounding can flip such an update's sign, and six steps at lr 1e-2 (the loss falling from ~3.5 to
  // ~1.4 on one batch) amplified it: one seed of 300 reached a 3.6% loss gap and 2.5% in the weights
  // (SG_TEST_SEED=17614499983859976854), and at eps 1e-4 alone still 2.1%. eps 1e-4 smooths only
  // the near-zero entries (sqrt(v) still decides the rest) and lr 3e-3 keeps the six steps off the
  // batch-memorizing regime where any rounding difference grows.
  CompileOptions o32 = Options(Precision::kF32);
  o32.adamw.eps = 1e-4;
  auto f32 = CompileWith(fwd, params, o32);
  CompileOptions o = Options(Precision::kF16Mixed);
  o.adamw.eps = 1e-4;
  o.loss_scale.growth_interval = 3;  // growth happens within the run and must not change the math
  auto f16 = CompileWith(fwd, params, o);
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(f16, nullptr);
  ASSERT_TRUE(f32->SetLearningRate(3e-3f).ok());
  ASSERT_TRUE(f16->SetLearningRate(3e-3f).ok());
  std::vector<float> l32, l16;
  for (int it = 0; it < 6; ++it) {
    ASSERT_TRUE(f32->Run(batch.Views()).ok());
    ASSERT_TRUE(f16->Run(batch.Views()).ok());
    auto m32 = f32->ReadMetrics(), m16 = f16->ReadMetrics();
    ASSERT_TRUE(m32.ok() && m16.ok());
    EXPECT_FALSE(m16->skipped) << it;
    EXPECT_NEAR(m16->loss, m32->loss, 0.02 * m32->loss) << "step " << it;
    l32.push_back(m32->loss);
    l16.push_back(m16->loss);
  }
  EXPECT_LT(l16.back(), l16.front());
  EXPECT_EQ(f16->ReadMetrics()->loss_scale, 4096.f);
  for (const std::string& name : f32->parameter_names()) {
    EXPECT_LT(sg::testing::RelativeError(ReadValue(*f16, name), ReadValue(*f32, name)), 0.02) << name;
  }
}

// Recompute does not change the f16 step: the same loss, norm and gradients under every policy
// (the loss-scale seed is placed after the recompute pass).
TEST(F16MixedPrecisionTest, RecomputeGivesTheSameStep) {
  graph::Graph fwd = Forward();
  Feeds params = testing::RandomParameters(fwd, sg::testing::Rng());
  Batch batch = BatchOn(testing::RandomBatch(kBatch, kSeq, kVocab, sg::testing::Rng()), Device::Cpu());
  std::map<std::string, std::vector<double>> base;
  float base_loss = 0;
  for (RecomputePolicy p : {RecomputePolicy::kNone, RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
    SCOPED_TRACE(graph::RecomputePolicyName(p));
    CompileOptions o = Options(Precision::kF16Mixed);
    o.recompute = p;
    auto step = CompileWith(fwd, params, o);
    ASSERT_NE(step, nullptr);
    ASSERT_TRUE(step->Run(batch.Views()).ok());
    auto m = step->ReadMetrics();
    ASSERT_TRUE(m.ok());
    EXPECT_FALSE(m->skipped);
    if (p == RecomputePolicy::kNone) base_loss = m->loss;
    EXPECT_EQ(m->loss, base_loss);
    for (const std::string& name : step->parameter_names()) {
      std::vector<double> g = ReadValue(*step, "grad:" + name);
      if (p == RecomputePolicy::kNone) {
        base[name] = g;
      } else {
        EXPECT_LT(sg::testing::RelativeError(g, base[name]), 1e-6) << name;
      }
    }
  }
}

TEST(F16MixedPrecisionTest, BadOptionsAreClearErrors) {
  graph::Graph fwd = Forward();
  CompileOptions o = Options(Precision::kF16Mixed);
  o.loss_scale.backoff = 1.5;
  absl::Status s = Compile(fwd, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "backoff 1.5")) << s;
  o = Options(Precision::kF16Mixed);
  o.micro_batches = 2;
  s = Compile(fwd, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "one device")) << s;
}

// An attention-free language model (embedding, RMSNorm, SwiGLU MLP, residual add + final RMSNorm,
// LM head, cross-entropy): every op of the Llama step but attention and RoPE (kernels/rope's own
// test covers f16), on their f16 kernels.
graph::Graph MlpLm(int64_t vocab, int64_t dim, int64_t ffn) {
  graph::Builder b;
  const graph::Dim batch = b.Symbol("batch"), seq = b.Symbol("seq");
  graph::Value tokens = b.Input("tokens", DType::kI32, {batch, seq});
  graph::Value targets = b.Input("targets", DType::kI32, {batch, seq});
  auto param = [&](const std::string& name, graph::SymShape shape) {
    return b.Parameter(name, DType::kF32, std::move(shape));
  };
  graph::Value x = b.Embedding(param("tok_embeddings.weight", {vocab, dim}), tokens);
  graph::Value hn = b.RmsNorm(x, param("ffn_norm.weight", {dim}), 1e-5);
  graph::Value gate = b.Matmul(hn, param("w1.weight", {ffn, dim}), graph::MatmulOptions::TransB());
  graph::Value up = b.Matmul(hn, param("w3.weight", {ffn, dim}), graph::MatmulOptions::TransB());
  graph::Value h = b.Matmul(b.SwiGLU(gate, up), param("w2.weight", {dim, ffn}), graph::MatmulOptions::TransB());
  graph::Value xn = b.AddRmsNorm(h, x, param("norm.weight", {dim}), 1e-5).first;
  graph::Value logits = b.Matmul(xn, param("output.weight", {vocab, dim}), graph::MatmulOptions::TransB());
  b.Output("loss", b.SoftmaxCrossEntropy(logits, targets));
  auto g = b.Finish();
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : graph::Graph();
}

// A Llama the CUDA f16 attention kernels cover: head_dim 128 / 2 = 64, grouped-query (2 heads, 1 kv
// head).
graph::Graph Llama64() {
  testing::TinyLlamaConfig c;
  c.vocab = 512;
  c.dim = 128;
  c.ffn = 256;
  auto g = testing::TinyLlama(c);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : graph::Graph();
}

// Planning only (runs without a GPU): the attention-free model and the Llama step (attention
// forward and backward on the f16 CUDA kernels) lower fully onto CUDA kernels in f16, and so does
// the tiny Llama's head_dim 8 (the generic attention kernels); a head wider than the kernels take
// (264 > kAttentionMaxHeadDim) is Unimplemented naming attention.
TEST(F16MixedPrecisionTest, CudaPlan) {
  CompileOptions o = Options(Precision::kF16Mixed, Device::Cuda(0));
  o.binding = {{"batch", 4}, {"seq", 64}};
  auto plan = PlanMemory(MlpLm(512, 128, 256), o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->impls.count("reference"), 0u);
  EXPECT_GT(plan->impls.at("kernel"), 10);
  auto llama = PlanMemory(Llama64(), o);
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->impls.count("reference"), 0u);
  EXPECT_GT(llama->impls.at("kernel"), plan->impls.at("kernel"));
  auto tiny = PlanMemory(Forward(), o);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->impls.count("reference"), 0u);
  testing::TinyLlamaConfig wide;
  wide.dim = 528;  // 2 heads of 264
  wide.ffn = 64;
  auto g = testing::TinyLlama(wide);
  ASSERT_TRUE(g.ok()) << g.status();
  absl::Status s = PlanMemory(*g, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "attention on cuda:0: head_dim 264 is wider than the CUDA kernels take (256)"))
      << s;
}

// ---- GPU ----------------------------------------------------------------------------------------

// Random parameters with the matrices scaled down (activations in a sane range at dim 128).
Feeds ScaledParams(const graph::Graph& g) {
  Feeds p = testing::RandomParameters(g, sg::testing::Rng());
  for (auto& [k, h] : p) {
    if (h.shape.size() == 2) {
      for (double& v : h.data) v *= 0.1;  // keep activations in a sane range at dim 128
    }
  }
  return p;
}

// The CUDA f16 step (cuBLASLt f16 GEMMs, f16 kernels, fused CE reading the device loss scale,
// multi-tensor AdamW and the scaler) against the CPU f16 step of `fwd` (vocabulary 512, batch 4 x
// 64): loss, norm, scale, every gradient and the weights after three steps, with growth every
// second step. steps[0] is the CPU step, steps[1] the CUDA one.
void ExpectCudaStepMatchesTheCpuStep(const graph::Graph& fwd, std::unique_ptr<CompiledStep> (&steps)[2]) {
  Feeds params = ScaledParams(fwd);
  for (int d = 0; d < 2; ++d) {
    CompileOptions o = Options(Precision::kF16Mixed, d == 0 ? Device::Cpu() : Device::Cuda(0));
    o.binding = {{"batch", 4}, {"seq", 64}};
    o.cuda_graph = false;
    o.loss_scale.growth_interval = 2;
    steps[d] = CompileWith(fwd, params, o);
    ASSERT_NE(steps[d], nullptr);
    ASSERT_TRUE(steps[d]->SetLearningRate(1e-3f).ok());
  }
  for (int it = 0; it < 3; ++it) {
    Batch host = BatchOn(testing::RandomBatch(4, 64, 512, sg::testing::Rng()), Device::Cpu());
    for (auto& step : steps) {
      const absl::Status st = step->Run(host.Views());
      ASSERT_TRUE(st.ok()) << st;
    }
    auto m0 = steps[0]->ReadMetrics(), m1 = steps[1]->ReadMetrics();
    ASSERT_TRUE(m0.ok() && m1.ok()) << m1.status();
    EXPECT_NEAR(m1->loss, m0->loss, 1e-2 * m0->loss) << "step " << it;
    EXPECT_NEAR(m1->grad_norm, m0->grad_norm, 3e-2 * m0->grad_norm) << "step " << it;
    EXPECT_EQ(m1->loss_scale, m0->loss_scale) << "step " << it;
    EXPECT_EQ(m1->skipped, m0->skipped) << "step " << it;
    EXPECT_EQ(m1->step, it + 1);
    if (it == 0) {
      for (const std::string& name : steps[0]->parameter_names()) {
        EXPECT_LT(sg::testing::RelativeError(ReadValue(*steps[1], "grad:" + name), ReadValue(*steps[0], "grad:" + name)),
                  5e-2)
            << name;
      }
    }
  }
  for (const std::string& name : steps[0]->parameter_names()) {
    EXPECT_LT(sg::testing::RelativeError(ReadValue(*steps[1], name), ReadValue(*steps[0], name)), 1e-2) << name;
  }
}

TEST(F16MixedPrecisionTest, CudaStepMatchesTheCpuStep) {
  SG_SKIP_WITHOUT_CUDA();
  std::unique_ptr<CompiledStep> steps[2];
  ExpectCudaStepMatchesTheCpuStep(MlpLm(512, 128, 256), steps);
  ASSERT_FALSE(HasFatalFailure());
  // The overflow path on the device: skipped, nothing updated, scale halved.
  const std::vector<double> w = ReadValue(*steps[1], "w1.weight");
  WriteScalar(*steps[1], kLossScaleName, 1e30f);
  Batch host = BatchOn(testing::RandomBatch(4, 64, 512, sg::testing::Rng()), Device::Cpu());
  ASSERT_TRUE(steps[1]->Run(host.Views()).ok());
  auto m = steps[1]->ReadMetrics();
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->skipped);
  EXPECT_EQ(m->step, 3);
  EXPECT_EQ(m->loss_scale, 5e29f);
  EXPECT_EQ(ReadValue(*steps[1], "w1.weight"), w);
}

// The Llama step: attention forward and backward on the f16 CUDA kernels (the CPU step runs the
// graph interpreter's f16 attention), RoPE and the rest as above.
TEST(F16MixedPrecisionTest, CudaLlamaStepMatchesTheCpuStep) {
  SG_SKIP_WITHOUT_CUDA();
  std::unique_ptr<CompiledStep> steps[2];
  ExpectCudaStepMatchesTheCpuStep(Llama64(), steps);
}

// Replaying the captured f16 step equals running it eagerly, including the scaler's decisions
// (growth every second step, and a forced overflow written between replays).
TEST(F16MixedPrecisionTest, CudaGraphReplayMatchesEager) {
  SG_SKIP_WITHOUT_CUDA();
  graph::Graph fwd = MlpLm(512, 128, 256);
  Feeds params = ScaledParams(fwd);
  Batch dev = BatchOn(testing::RandomBatch(4, 64, 512, sg::testing::Rng()), Device::Cuda(0));
  std::vector<float> losses[2], scales[2];
  std::vector<bool> skipped[2];
  std::vector<double> weights[2];
  for (int captured = 0; captured < 2; ++captured) {
    CompileOptions o = Options(Precision::kF16Mixed, Device::Cuda(0));
    o.binding = {{"batch", 4}, {"seq", 64}};
    o.cuda_graph = captured == 1;
    o.loss_scale.growth_interval = 2;
    auto step = CompileWith(fwd, params, o);
    ASSERT_NE(step, nullptr);
    ASSERT_TRUE(step->SetLearningRate(1e-3f).ok());
    for (int it = 0; it < 6; ++it) {
      if (it == 4) WriteScalar(*step, kLossScaleName, 1e30f);
      ASSERT_TRUE(step->Run(dev.Views()).ok());
      auto m = step->ReadMetrics();
      ASSERT_TRUE(m.ok()) << m.status();
      losses[captured].push_back(m->loss);
      scales[captured].push_back(m->loss_scale);
      skipped[captured].push_back(m->skipped);
    }
    EXPECT_EQ(step->executor().replaying_graph(), captured == 1);
    EXPECT_EQ(step->ReadMetrics()->step, 4) << "steps 4 and 5 overflow";
    weights[captured] = ReadValue(*step, "w2.weight");
  }
  EXPECT_EQ(scales[0], (std::vector<float>{1024, 2048, 2048, 4096, 5e29f, 2.5e29f}));
  EXPECT_EQ(scales[1], scales[0]);
  EXPECT_EQ(skipped[1], skipped[0]);
  for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-3 * losses[0][i]) << i;
  EXPECT_LT(sg::testing::RelativeError(weights[1], weights[0]), 1e-3);
}

}  // namespace
}  // namespace sg::compiler
