// Cost model formulas and memory accounting, and the planner's choices on settings whose answer is
// known: a tiny model with a large batch on many devices is data parallel (replicate or FSDP); a
// huge layer with a batch of one is tensor parallel.
#include "sharding/planner.h"

#include <cmath>

#include "absl/strings/match.h"
#include "graph/models/llama.h"
#include "graph/ops.h"
#include "gtest/gtest.h"
#include "sharding/cost_model.h"
#include "sharding/models.h"

namespace sg::sharding {
namespace {

graph::Graph Step(const graph::LlamaConfig& c) {
  absl::StatusOr<graph::Graph> g = graph::BuildLlamaTrainStep(c, {});
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

TEST(CostModel, RingFormulas) {
  CostParams p;
  const double n = 1e9;
  EXPECT_NEAR(CollectiveSeconds(StepKind::kAllReduce, int64_t(n), 8, p),
              2.0 * 7 / 8 * n / 316e9 + 14 * 10e-6, 1e-12);
  EXPECT_NEAR(CollectiveSeconds(StepKind::kAllGather, int64_t(n), 4, p),
              3.0 / 4 * n / 316e9 + 3 * 10e-6, 1e-12);
  EXPECT_NEAR(CollectiveSeconds(StepKind::kAllToAll, int64_t(n), 2, p), 0.5 * n / 357e9 + 10e-6,
              1e-12);
  EXPECT_EQ(CollectiveSeconds(StepKind::kAllReduce, int64_t(n), 1, p), 0);
  EXPECT_EQ(CollectiveSeconds(StepKind::kLocalSlice, int64_t(n), 8, p), 0);
}

TEST(CostModel, MemoryByCategoryFollowsPlacements) {
  graph::LlamaConfig c = LlamaConfigByName("124m").value();
  c.n_layers = 2;
  graph::Graph g = Step(c);
  int64_t param_elems = 0;
  for (const graph::Node& n : g.nodes()) {
    if (n.op == graph::OpKind::kParameter &&
        !absl::StartsWith(graph::AttrString(n, "name"), "opt.")) {
      param_elems += graph::Evaluate(graph::NumElements(g.type(n.outputs[0]).shape), {}).value();
    }
  }
  const graph::Binding b = {{"batch", 8}, {"seq", 256}};
  const DeviceMesh mesh = DeviceMesh::Parse("dp=8").value();
  PlanCost ddp = EstimateCost(g, BuildShardingPlan(g, mesh, {StrategyKind::kReplicate}).value(), b, {})
                     .value();
  PlanCost fsdp = EstimateCost(g, BuildShardingPlan(g, mesh, {StrategyKind::kFsdp}).value(), b, {})
                      .value();
  EXPECT_EQ(ddp.memory.parameters, param_elems * 2);          // bf16
  EXPECT_EQ(ddp.memory.gradients, param_elems * 2);
  EXPECT_EQ(ddp.memory.optimizer, param_elems * (4 + 4 + 4));  // m, v, f32 master
  // Every dim of these shapes divides by 8, so FSDP holds exactly an eighth.
  EXPECT_EQ(fsdp.memory.parameters * 8, ddp.memory.parameters);
  EXPECT_EQ(fsdp.memory.optimizer * 8, ddp.memory.optimizer);
  EXPECT_GT(fsdp.memory.transient, 0);
  EXPECT_EQ(ddp.memory.transient, 0);
  EXPECT_GT(ddp.memory.activations, 0);
  // DDP all-reduces every gradient once: the bytes are the parameter bytes.
  EXPECT_EQ(ddp.comm["all-reduce(dp)"].bytes, param_elems * 2) << ddp.ToString();
  // FSDP: reduce-scatters the same bytes, gathers each weight twice (forward and backward).
  EXPECT_EQ(fsdp.comm["reduce-scatter(dp)"].bytes, param_elems * 2) << fsdp.ToString();
  EXPECT_GT(fsdp.comm["all-gather(dp)"].bytes, param_elems * 2) << fsdp.ToString();
  // 6 * params * tokens is the usual estimate; attention adds to it.
  EXPECT_GT(ddp.flops, 6.0 * double(param_elems - 2 * 32000 * 768) * 8 * 256 * 0.99);
}

TEST(Planner, TinyModelOnManyDevicesIsDataParallel) {
  graph::Graph g = Step(LlamaConfigByName("tiny").value());
  const DeviceMesh mesh = DeviceMesh::Parse("dp=8").value();
  PlannerResult r = ChooseStrategy(g, mesh, {{"batch", 64}, {"seq", 256}}, {}).value();
  const StrategyKind k = r.candidates[r.chosen].strategy.kind;
  EXPECT_TRUE(k == StrategyKind::kReplicate || k == StrategyKind::kFsdp) << r.explanation;
  EXPECT_TRUE(r.fits);
  EXPECT_TRUE(absl::StartsWith(r.explanation, absl::StrCat("chose ", StrategyName(k))))
      << r.explanation;
  std::cout << r.explanation << "\n";
}

TEST(Planner, HugeLayerWithSmallBatchIsTensorParallel) {
  graph::LlamaConfig c = LlamaConfigByName("7b").value();
  c.dim = 8192, c.n_layers = 1, c.n_heads = 64, c.n_kv_heads = 8, c.ffn_dim = 28672;
  graph::Graph g = Step(c);
  const DeviceMesh mesh = DeviceMesh::Parse("tp=8").value();
  PlannerResult r = ChooseStrategy(g, mesh, {{"batch", 8}, {"seq", 32}}, {}).value();
  EXPECT_EQ(r.candidates[r.chosen].strategy.kind, StrategyKind::kTensorParallel) << r.explanation;
  for (const Candidate& c : r.candidates) {  // data parallel was a real option, just slower
    if (c.strategy.kind == StrategyKind::kReplicate || c.strategy.kind == StrategyKind::kFsdp) {
      EXPECT_TRUE(c.skipped.empty() && c.fits) << r.explanation;
    }
  }
  std::cout << r.explanation << "\n";
}

TEST(Planner, MemoryBudgetRulesOutReplication) {
  graph::LlamaConfig c = LlamaConfigByName("1b").value();
  c.n_layers = 4;
  graph::Graph g = Step(c);
  const DeviceMesh mesh = DeviceMesh::Parse("dp=8").value();
  PlannerOptions o;
  o.candidates = {StrategyKind::kReplicate, StrategyKind::kFsdp};
  PlannerResult loose = ChooseStrategy(g, mesh, {{"batch", 8}, {"seq", 1024}}, o).value();
  const double ddp_memory = double(loose.candidates[0].cost.memory.Total());
  const double fsdp_memory = double(loose.candidates[1].cost.memory.Total());
  ASSERT_LT(fsdp_memory, ddp_memory);
  o.memory_budget_bytes = (ddp_memory + fsdp_memory) / 2;
  PlannerResult tight = ChooseStrategy(g, mesh, {{"batch", 8}, {"seq", 1024}}, o).value();
  EXPECT_EQ(tight.candidates[tight.chosen].strategy.kind, StrategyKind::kFsdp) << tight.explanation;
  EXPECT_TRUE(absl::StrContains(tight.explanation, "replicate: does not fit")) << tight.explanation;
  o.memory_budget_bytes = 1;
  PlannerResult none = ChooseStrategy(g, mesh, {{"batch", 8}, {"seq", 1024}}, o).value();
  EXPECT_FALSE(none.fits);
  EXPECT_TRUE(absl::StartsWith(none.explanation, "nothing fits")) << none.explanation;
}

TEST(Planner, SkipsStrategiesTheMeshCannotRun) {
  graph::Graph g = Step(LlamaConfigByName("tiny").value());
  PlannerResult r =
      ChooseStrategy(g, DeviceMesh::Parse("dp=4").value(), {{"batch", 6}, {"seq", 16}}, {}).value();
  for (const Candidate& c : r.candidates) {
    if (c.strategy.kind == StrategyKind::kHybridShard) {
      EXPECT_TRUE(absl::StrContains(c.skipped, "2-D mesh")) << c.skipped;
    }
    if (c.strategy.kind == StrategyKind::kFsdp) {
      EXPECT_TRUE(absl::StrContains(c.skipped, "batch 6 does not split over 4")) << c.skipped;
    }
  }
  EXPECT_EQ(r.candidates[r.chosen].strategy.kind, StrategyKind::kTensorParallel) << r.explanation;
}

}  // namespace
}  // namespace sg::sharding
