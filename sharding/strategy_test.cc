// Strategies on the real Llama training step (graph/models): which sources get which placements,
// and which collectives propagation derives for each strategy.
#include "sharding/strategy.h"

#include <iostream>

#include "absl/strings/match.h"
#include "graph/models/llama.h"
#include "graph/ops.h"
#include "gtest/gtest.h"

namespace sg::sharding {
namespace {

graph::Graph Step(graph::LlamaConfig c = graph::LlamaConfig::Tiny()) {
  absl::StatusOr<graph::Graph> g = graph::BuildLlamaTrainStep(c, {});
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

std::string SourceText(const graph::Graph& g, const ShardingPlan& p, const char* name) {
  const int v = g.FindSource(name);
  EXPECT_GE(v, 0) << name;
  return v < 0 ? "" : PlacementsToString(p.placements[v]);
}

int CountSteps(const ShardingPlan& p, StepKind kind, int mesh_dim) {
  int n = 0;
  for (const ValueRedistribution& r : p.redistributions) {
    for (const RedistributeStep& s : r.plan.steps) n += s.kind == kind && s.mesh_dim == mesh_dim;
  }
  return n;
}

TEST(Strategy, ParsesNames) {
  for (StrategyKind k : kAllStrategies) EXPECT_EQ(ParseStrategy(StrategyName(k)).value(), k);
  EXPECT_EQ(ParseStrategy("ddp").value(), StrategyKind::kReplicate);
  EXPECT_FALSE(ParseStrategy("zero2").ok());
  EXPECT_EQ(TpRoleOf("layers.3.attention.wq.weight"), TpRole::kColumn);
  EXPECT_EQ(TpRoleOf("opt.m.layers.3.feed_forward.w2.weight"), TpRole::kRow);
  EXPECT_EQ(TpRoleOf("tok_embeddings.weight"), TpRole::kVocab);
  EXPECT_EQ(TpRoleOf("layers.0.ffn_norm.weight"), TpRole::kReplicated);
}

TEST(Strategy, ReplicateAllReducesEveryGradient) {
  graph::Graph g = Step();
  DeviceMesh mesh = DeviceMesh::Parse("dp=4").value();
  ShardingPlan p = BuildShardingPlan(g, mesh, {StrategyKind::kReplicate}).value();
  EXPECT_EQ(SourceText(g, p, "tokens"), "[S(0)]");
  EXPECT_EQ(SourceText(g, p, "layers.0.attention.wq.weight"), "[R]");
  EXPECT_EQ(CountSteps(p, StepKind::kAllGather, 0), 0);
  EXPECT_EQ(CountSteps(p, StepKind::kReduceScatter, 0), 0);
  int params = 0;
  for (const graph::Node& n : g.nodes()) params += n.op == graph::OpKind::kAdamW;
  // One all-reduce per gradient (into adamw), none elsewhere except where noted by propagation.
  EXPECT_GE(CountSteps(p, StepKind::kAllReduce, 0), params) << p.Summary();
}

TEST(Strategy, FsdpGathersParametersAndReduceScattersGradients) {
  graph::Graph g = Step();
  DeviceMesh mesh = DeviceMesh::Parse("dp=4").value();
  ShardingPlan p = BuildShardingPlan(g, mesh, {StrategyKind::kFsdp}).value();
  EXPECT_EQ(SourceText(g, p, "layers.0.attention.wq.weight"), "[S(0)]");
  EXPECT_EQ(SourceText(g, p, "opt.m.layers.0.attention.wq.weight"), "[S(0)]");
  int params = 0;
  for (const graph::Node& n : g.nodes()) params += n.op == graph::OpKind::kAdamW;
  EXPECT_EQ(CountSteps(p, StepKind::kReduceScatter, 0), params) << p.Summary();
  EXPECT_EQ(CountSteps(p, StepKind::kAllReduce, 0), 0) << p.Summary();
  // Each matmul weight is gathered for the forward and again for the backward (ZeRO-3).
  int wq_gathers = 0;
  for (const ValueRedistribution& r : p.redistributions) {
    wq_gathers += absl::StrContains(r.where, "(layers.0.attention.wq.weight)");
  }
  EXPECT_EQ(wq_gathers, 2) << p.Summary();
  // Updated parameters come back sharded: no redistribution at the end.
  for (const ValueRedistribution& r : p.redistributions) EXPECT_GE(r.node, 0) << r.where;
}

TEST(Strategy, HybridShardReplicatesAcrossShardsWithin) {
  graph::Graph g = Step();
  DeviceMesh mesh = DeviceMesh::Parse("replica=2,shard=2").value();
  ShardingPlan p = BuildShardingPlan(g, mesh, {StrategyKind::kHybridShard}).value();
  EXPECT_EQ(SourceText(g, p, "layers.1.feed_forward.w2.weight"), "[R,S(0)]");
  EXPECT_EQ(SourceText(g, p, "tokens"), "[S(0),S(0)]");
  EXPECT_GT(CountSteps(p, StepKind::kAllReduce, 0), 0) << p.Summary();
  EXPECT_GT(CountSteps(p, StepKind::kReduceScatter, 1), 0) << p.Summary();
  EXPECT_EQ(CountSteps(p, StepKind::kAllGather, 0), 0) << p.Summary();
  EXPECT_FALSE(BuildShardingPlan(g, DeviceMesh::Parse("dp=4").value(), {StrategyKind::kHybridShard}).ok());
}

TEST(Strategy, TensorParallelIsMegatronWithSequenceParallel) {
  graph::LlamaConfig c = graph::LlamaConfig::Tiny();
  graph::Graph g = Step(c);
  DeviceMesh mesh = DeviceMesh::Parse("tp=2").value();
  ShardingPlan p = BuildShardingPlan(g, mesh, {StrategyKind::kTensorParallel}).value();
  EXPECT_EQ(SourceText(g, p, "layers.0.attention.wq.weight"), "[S(0)]");   // column: out features
  EXPECT_EQ(SourceText(g, p, "layers.0.attention.wo.weight"), "[S(1)]");   // row: in features
  EXPECT_EQ(SourceText(g, p, "layers.0.feed_forward.w2.weight"), "[S(1)]");
  EXPECT_EQ(SourceText(g, p, "tok_embeddings.weight"), "[S(0)]");
  EXPECT_EQ(SourceText(g, p, "layers.0.attention_norm.weight"), "[R]");
  EXPECT_EQ(SourceText(g, p, "tokens"), "[R]");
  // No weight is ever gathered: only activations move.
  for (const ValueRedistribution& r : p.redistributions) {
    EXPECT_FALSE(absl::StrContains(r.where, ".weight)") &&
                 !r.plan.steps.empty() && r.plan.steps[0].kind == StepKind::kAllGather)
        << r.where << ": " << r.plan.ToString();
  }
  // Attention runs split by heads, and the vocab-parallel loss needs its in-kernel all-reduces.
  bool heads = false;
  for (const graph::Node& n : g.nodes()) {
    if (n.op == graph::OpKind::kAttention) heads = p.placements[n.outputs[0]][0].is_shard(2);
  }
  EXPECT_TRUE(heads);
  EXPECT_FALSE(p.internal.empty());
  std::cout << "tp: " << p.Summary() << "\n";
}

TEST(Strategy, FsdpTpGathersOnlyOverDp) {
  graph::Graph g = Step();
  DeviceMesh mesh = DeviceMesh::Parse("dp=2,tp=2").value();
  ShardingPlan p = BuildShardingPlan(g, mesh, {StrategyKind::kFsdpTp}).value();
  EXPECT_EQ(SourceText(g, p, "layers.0.attention.wq.weight"), "[S(1),S(0)]");
  EXPECT_EQ(SourceText(g, p, "layers.0.attention.wo.weight"), "[S(0),S(1)]");
  EXPECT_EQ(SourceText(g, p, "tokens"), "[S(0),R]");
  for (const ValueRedistribution& r : p.redistributions) {
    for (const RedistributeStep& s : r.plan.steps) {
      if (absl::StrContains(r.where, ".weight)") && s.kind == StepKind::kAllGather) {
        EXPECT_EQ(s.mesh_dim, 0) << r.where << ": " << r.plan.ToString();
      }
    }
  }
  std::cout << "fsdp_tp: " << p.Summary() << "\n";
  absl::StatusOr<TensorSpec> spec =
      p.Spec(g, g.FindSource("layers.0.attention.wq.weight"), {{"batch", 2}, {"seq", 8}});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->LocalShape(0)[0] * 2, spec->global_shape()[0]);
}

}  // namespace
}  // namespace sg::sharding
