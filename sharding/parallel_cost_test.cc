// Context- and pipeline-parallel cost formulas against hand-computed volumes from the model's
// shapes, and their place in the planner (opt-in candidates listed in the report).
#include "sharding/parallel_cost.h"

#include "graph/models/llama.h"
#include "gtest/gtest.h"
#include "sharding/models.h"
#include "sharding/planner.h"

namespace sg::sharding {
namespace {

graph::LlamaConfig SmallConfig() {
  graph::LlamaConfig c = LlamaConfigByName("124m").value();
  c.n_layers = 4;
  return c;
}

graph::Graph Step(const graph::LlamaConfig& c) {
  absl::StatusOr<graph::Graph> g = graph::BuildLlamaTrainStep(c, {});
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

TEST(ParallelCost, ContextParallelDividesActivationsAndMovesKeyValueBlocks) {
  const graph::LlamaConfig c = SmallConfig();
  const graph::Graph g = Step(c);
  const graph::Binding b = {{"batch", 2}, {"seq", 4096}};
  const PlanCost one = SingleDeviceCost(g, b, {}).value();
  ASSERT_GT(one.memory.activations, 0);
  const PlanCost cp = EstimateContextParallelCost(g, b, {4, 2}, one, {}).value();
  EXPECT_EQ(cp.memory.parameters, one.memory.parameters);
  EXPECT_EQ(cp.memory.activations, one.memory.activations / 8);
  // Per layer: 3*cp-2 blocks of K and V for one sequence (batch 2 / dp 2) of seq/cp rows, bf16.
  const int64_t block = 2 * 1 * (4096 / 4) * c.n_kv_heads * c.head_dim() * 2;
  EXPECT_EQ(cp.comm.at("ring p2p(cp)").bytes, c.n_layers * (3 * 4 - 2) * block);
  EXPECT_EQ(cp.comm.at("all-reduce(cp x dp)").bytes, one.memory.gradients);
  EXPECT_NEAR(cp.compute_s * 8, one.compute_s, 1e-12 * one.compute_s);
  EXPECT_EQ(EstimateContextParallelCost(g, {{"batch", 2}, {"seq", 7}}, {4, 1}, one, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ParallelCost, PipelineDividesParametersAndPaysTheBubble) {
  const graph::LlamaConfig c = SmallConfig();
  const graph::Graph g = Step(c);
  EXPECT_EQ(CountLayers(g), 4);
  const graph::Binding b = {{"batch", 8}, {"seq", 512}};
  const PlanCost one = SingleDeviceCost(g, b, {}).value();
  const PlanCost pp = EstimatePipelineCost(g, b, {4, 1}, one, {}).value();
  EXPECT_EQ(pp.memory.parameters, one.memory.parameters / 4);
  EXPECT_EQ(pp.memory.optimizer, one.memory.optimizer / 4);
  // m = 8 micro-batches of one sequence: one activation and one gradient of seq x dim bf16 each.
  EXPECT_EQ(pp.comm.at("stage p2p(pp)").bytes, 2 * 8 * 512 * c.dim * 2);
  EXPECT_NEAR(pp.compute_s, one.compute_s / 4 * (8 + 3) / 8.0, 1e-9 * one.compute_s);
  EXPECT_EQ(EstimatePipelineCost(g, b, {8, 1}, one, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParallelCost, PlannerListsCpAndPpOnlyWhenAsked) {
  const graph::Graph g = Step(SmallConfig());
  const DeviceMesh mesh = DeviceMesh::Parse("dp=2,tp=2").value();
  const graph::Binding b = {{"batch", 4}, {"seq", 1024}};
  PlannerOptions opt;
  PlannerResult plain = ChooseStrategy(g, mesh, b, opt).value();
  for (const Candidate& c : plain.candidates) EXPECT_TRUE(c.label.empty()) << c.label;
  opt.context_parallel = opt.pipeline = true;
  PlannerResult all = ChooseStrategy(g, mesh, b, opt).value();
  ASSERT_EQ(all.candidates.size(), plain.candidates.size() + 2);
  EXPECT_EQ(all.candidates[all.candidates.size() - 2].Name(), "cp=2 x dp=2");
  EXPECT_EQ(all.candidates.back().Name(), "pp=2 x dp=2");
  EXPECT_NE(all.explanation.find("cp=2 x dp=2"), std::string::npos) << all.explanation;
  opt.placement = false;
  opt.pipeline = false;
  PlannerResult only_cp = ChooseStrategy(g, mesh, b, opt).value();
  ASSERT_EQ(only_cp.candidates.size(), 1u);
  EXPECT_EQ(only_cp.candidates[size_t(only_cp.chosen)].Name(), "cp=2 x dp=2");
  EXPECT_GT(only_cp.candidates[0].cost.comm.at("ring p2p(cp)").bytes, 0);
}

}  // namespace
}  // namespace sg::sharding
