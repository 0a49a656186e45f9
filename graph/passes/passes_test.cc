// Every pass preserves the interpreter's results on random inputs; recompute lowers the planned
// peak with identical gradients; the memory plan never overlaps two live buffers.
#include "graph/passes/passes.h"

#include <cmath>
#include <set>

#include "gmock/gmock.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "graph/models/llama.h"
#include "graph/ops.h"
#include "graph/passes/memory_plan.h"
#include "graph/text.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::graph {
namespace {

// Random values for every source of `g` (tokens < vocab, about a quarter of targets ignored).
Feeds RandomFeeds(const Graph& g, const Binding& binding, int64_t vocab, std::mt19937_64& rng) {
  Feeds feeds;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::kInput && n.op != OpKind::kParameter) continue;
    const Type& t = g.type(n.outputs[0]);
    HostTensor h = HostTensor::Random(Evaluate(t.shape, binding).value(), t.dtype, rng, 0.5, vocab);
    const std::string& name = AttrString(n, "name");
    if (name == "targets") {
      for (size_t i = 0; i < h.data.size(); i += 4) h.data[i] = -100;
    }
    if (name.find("norm") != std::string::npos) {
      for (double& v : h.data) v += 1.0;
    }
    feeds[name] = h;
  }
  return feeds;
}

void ExpectSameOutputs(const Feeds& want, const Feeds& got, double tol) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const HostTensor& g = got.at(name);
    ASSERT_EQ(w.shape, g.shape) << name;
    double norm = 0;
    for (double v : w.data) norm = std::max(norm, std::abs(v));
    EXPECT_GT(norm, 0) << name << " is all zeros: the comparison cannot fail";
    for (size_t i = 0; i < w.data.size(); ++i) {
      ASSERT_NEAR(g.data[i], w.data[i], tol * (1 + std::abs(w.data[i]))) << name << "[" << i << "]";
    }
  }
}

int Count(const Graph& g, OpKind op) {
  int c = 0;
  for (const Node& n : g.nodes()) c += n.op == op;
  return c;
}

const Binding kBinding = {{"batch", 2}, {"seq", 5}};

TEST(FusionTest, LlamaForwardFusesAndKeepsTheLoss) {
  LlamaConfig c = LlamaConfig::Tiny();
  Graph fwd = BuildLlamaForward(c).value();
  FusionStats stats;
  auto fused = FuseForKernels(fwd, &stats);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(stats.add_rmsnorm, 2 * c.n_layers) << stats.ToString();
  EXPECT_EQ(stats.swiglu, c.n_layers) << stats.ToString();
  EXPECT_EQ(stats.rmsnorm_prologue, 5 * c.n_layers + 1) << stats.ToString();
  EXPECT_EQ(Count(*fused, OpKind::kAdd), 0);
  EXPECT_EQ(Count(*fused, OpKind::kSilu), 0);
  EXPECT_EQ(Count(*fused, OpKind::kRmsNorm), 1);  // layer 0's norm reads the embedding
  auto& rng = testing::Rng();
  Feeds feeds = RandomFeeds(fwd, kBinding, c.vocab, rng);
  ExpectSameOutputs(Interpret(fwd, feeds).value(), Interpret(*fused, feeds).value(), 1e-12);
}

TEST(FusionTest, FullPipelinePreservesLossAndGradients) {
  LlamaConfig c = LlamaConfig::Tiny();
  Graph fwd = BuildLlamaForward(c).value();
  Graph plain = AppendBackward(fwd, {}).value().graph;
  Graph g = AppendBackward(FuseForKernels(fwd).value(), {}).value().graph;
  FusionStats bwd_stats;
  g = FuseForKernels(g, &bwd_stats).value();
  EXPECT_GT(bwd_stats.matmul_epilogue, 0) << "gradient accumulation should use GEMM epilogues";
  g = Cse(g).value();
  g = Dce(g).value();
  EXPECT_LT(g.nodes().size(), plain.nodes().size());
  auto& rng = testing::Rng();
  Feeds feeds = RandomFeeds(fwd, kBinding, c.vocab, rng);
  ExpectSameOutputs(Interpret(plain, feeds).value(), Interpret(g, feeds).value(), 1e-10);
  // And the optimized graph survives the text round trip unchanged.
  EXPECT_EQ(ToText(ParseText(ToText(g)).value()), ToText(g));
}

TEST(FusionTest, CrossEntropyAndBiasEpilogue) {
  Builder b;
  Value x = b.Input("x", DType::kF32, {3, 4});
  Value w = b.Input("w", DType::kF32, {4, 6});
  Value bias = b.Input("bias", DType::kF32, {6});
  Value logits = b.Add(b.Matmul(x, w), bias);
  b.Output("loss", b.NllLoss(b.LogSoftmax(logits), b.Input("t", DType::kI32, {3}), 2));
  Graph g = b.Finish().value();
  FusionStats stats;
  Graph f = FuseForKernels(g, &stats).value();
  EXPECT_EQ(stats.cross_entropy, 1);
  EXPECT_EQ(stats.matmul_epilogue, 1);
  EXPECT_EQ(Count(f, OpKind::kSoftmaxCrossEntropy), 1);
  EXPECT_EQ(Count(f, OpKind::kAdd), 0);
  auto& rng = testing::Rng();
  Feeds feeds = RandomFeeds(g, {}, 6, rng);
  // Random targets are all the ignore index (2) once in 216 draws, and the loss is then 0: keep
  // one row counted so the comparison can fail.
  feeds["t"].data[0] = double(std::uniform_int_distribution<int>(0, 1)(rng));
  ExpectSameOutputs(Interpret(g, feeds).value(), Interpret(f, feeds).value(), 1e-12);
}

TEST(FusionTest, DoesNotFoldAProducerWithOtherUses) {
  Builder b;
  Value g1 = b.Input("g", DType::kF32, {3, 4});
  Value s = b.Silu(g1);
  b.Output("y", b.Mul(s, b.Input("u", DType::kF32, {3, 4})));
  b.Output("s", s);  // silu's output is needed on its own
  FusionStats stats;
  Graph f = FuseForKernels(b.Finish().value(), &stats).value();
  EXPECT_EQ(stats.swiglu, 0);
  EXPECT_EQ(Count(f, OpKind::kSilu), 1);
}

TEST(CseDceTest, MergeDuplicatesAndDropDeadCode) {
  Builder b;
  Value x = b.Input("x", DType::kF32, {4});
  Value a1 = b.Exp(x), a2 = b.Exp(x);
  Value dead = b.Neg(b.Log(x));
  (void)dead;
  b.Output("y", b.Add(b.Mul(a1, x), b.Mul(a2, x)));
  Graph g = b.Finish().value();
  Graph c = Cse(g).value();
  EXPECT_EQ(Count(c, OpKind::kExp), 1);
  EXPECT_EQ(Count(c, OpKind::kMul), 1);
  Graph d = Dce(c).value();
  EXPECT_EQ(Count(d, OpKind::kNeg), 0);
  EXPECT_EQ(Count(d, OpKind::kLog), 0);
  EXPECT_EQ(Count(d, OpKind::kInput), 1);
  auto& rng = testing::Rng();
  Feeds feeds = {{"x", HostTensor::Random({4}, DType::kF32, rng)}};
  ExpectSameOutputs(Interpret(g, feeds).value(), Interpret(d, feeds).value(), 0);
}

TEST(RecomputeTest, LowersPlannedPeakWithIdenticalGradients) {
  LlamaConfig c = LlamaConfig::Tiny();
  c.n_layers = 3;
  Graph fwd = FuseForKernels(BuildLlamaForward(c).value()).value();
  Graph base = AppendBackward(fwd, {}).value().graph;
  const Binding big = {{"batch", 4}, {"seq", 64}};
  auto& rng = testing::Rng();
  Feeds feeds = RandomFeeds(fwd, kBinding, c.vocab, rng);
  Feeds want = Interpret(base, feeds).value();
  int64_t last_peak = 0;
  for (RecomputePolicy p : {RecomputePolicy::kNone, RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
    int clones = -1;
    auto g = ApplyRecompute(base, p, &clones);
    ASSERT_TRUE(g.ok()) << g.status();
    Feeds got = Interpret(*g, feeds).value();
    ExpectSameOutputs(want, got, 0);  // bit-identical: the same ops on the same values
    MemoryPlan plan = PlanMemory(*g, big).value();
    std::cout << RecomputePolicyName(p) << ": " << clones << " recomputed nodes, "
              << plan.ToString() << "\n";
    if (p == RecomputePolicy::kNone) {
      EXPECT_EQ(clones, 0);
    } else {
      EXPECT_GT(clones, 0);
      EXPECT_LT(plan.arena_bytes, last_peak) << RecomputePolicyName(p);
    }
    last_peak = plan.arena_bytes;
  }
}

// Full recompute keeps the residual stream once per layer: the forward values of the model's
// [batch, seq, dim] type that a backward node reads are the embedding, the sum entering each layer
// after the first (the residual add fused into its attention norm) and the final norm's sum. The
// add's two inputs (attention sum, FFN output) are rebuilt; keeping them was 2 per layer.
TEST(RecomputeTest, FullKeepsOneResidualTensorPerLayer) {
  LlamaConfig c = LlamaConfig::Tiny();
  c.n_layers = 4;
  Graph fwd = FuseForKernels(BuildLlamaForward(c).value()).value();
  Graph base = AppendBackward(fwd, {}).value().graph;
  auto kept_residuals = [](const Graph& g) {
    int embedding = -1;
    for (const Node& n : g.nodes()) {
      if (n.op == OpKind::kEmbedding && n.phase == Phase::kForward) embedding = n.outputs[0];
    }
    std::set<int> kept;
    for (const Node& n : g.nodes()) {
      if (n.phase != Phase::kBackward) continue;
      for (int in : n.inputs) {
        if (g.nodes()[g.value(in).producer].phase == Phase::kForward && g.type(in) == g.type(embedding)) {
          kept.insert(in);
        }
      }
    }
    return int(kept.size());
  };
  int clones = 0;
  Graph full = ApplyRecompute(base, RecomputePolicy::kFull, &clones).value();
  EXPECT_EQ(kept_residuals(full), c.n_layers + 1);
  EXPECT_GT(kept_residuals(base), 2 * c.n_layers);  // no recompute: the norm outputs too
  auto& rng = testing::Rng();
  Feeds feeds = RandomFeeds(fwd, kBinding, c.vocab, rng);
  ExpectSameOutputs(Interpret(base, feeds).value(), Interpret(full, feeds).value(), 0);
}

TEST(MemoryPlanTest, LiveBuffersNeverOverlapAndReuseHappens) {
  LlamaConfig c = LlamaConfig::Tiny();
  Graph g = AppendBackward(FuseForKernels(BuildLlamaForward(c).value()).value(), {}).value().graph;
  MemoryPlan p = PlanMemory(g, {{"batch", 3}, {"seq", 7}}).value();
  int64_t total = 0;
  std::vector<const BufferAssignment*> arena;
  for (const BufferAssignment& b : p.buffers) {
    if (b.offset >= 0) {
      arena.push_back(&b);
      total += b.bytes;
    }
  }
  ASSERT_GT(arena.size(), 10u);
  for (size_t i = 0; i < arena.size(); ++i) {
    for (size_t j = i + 1; j < arena.size(); ++j) {
      const auto *a = arena[i], *b = arena[j];
      const bool time = a->first_node <= b->last_node && b->first_node <= a->last_node;
      const bool space = a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
      ASSERT_FALSE(time && space) << "%" << a->value << " and %" << b->value << " overlap";
    }
  }
  EXPECT_GE(p.arena_bytes, p.live_lower_bound);
  EXPECT_LT(p.arena_bytes, total / 2) << "buffers should be reused";
  EXPECT_GT(p.persistent_bytes, 0);
  EXPECT_THAT(std::string(PlanMemory(g, {{"batch", 3}}).status().message()),
              ::testing::HasSubstr("symbol 'seq' is not bound"));
}

}  // namespace
}  // namespace sg::graph
