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

// Known settings where each wins once every candidate is on the table (the pre-flight report's
// --strategy=auto): the model's own shapes, H200-like defaults unless stated.
PlannerResult Auto(const std::string& model, const std::string& mesh, graph::Binding b, PlannerOptions opt = {}) {
  const graph::Graph g = Step(LlamaConfigByName(model).value());
  opt.context_parallel = opt.pipeline = true;
  return ChooseStrategy(g, DeviceMesh::Parse(mesh).value(), b, opt).value();
}

std::string Chosen(const PlannerResult& r) { return r.candidates[size_t(r.chosen)].Name(); }

const Candidate& Named(const PlannerResult& r, const std::string& name) {
  for (const Candidate& c : r.candidates) {
    if (c.Name() == name) return c;
  }
  ADD_FAILURE() << "no candidate " << name;
  return r.candidates[0];
}

// One 32k-token sequence on 2 GPUs: the batch cannot split over data-parallel ranks, and the
// ring's key/value blocks hide under attention while tensor parallelism's activations do not.
TEST(ParallelCost, LongSequenceWithBatchOneChoosesContextParallel) {
  PlannerResult r = Auto("1b", "dp=2", {{"batch", 1}, {"seq", 32768}});
  EXPECT_EQ(Chosen(r), "cp=2") << r.explanation;
  EXPECT_FALSE(Named(r, "fsdp").skipped.empty());
  EXPECT_LT(Named(r, "cp=2").cost.step_s, Named(r, "tp").cost.step_s);
}

// Slow collectives (2 GB/s, e.g. PCIe or Ethernet between the GPUs) and a 40 GB budget: FSDP fits
// but cannot hide its parameter traffic, replication does not fit, and the pipeline sends only
// one activation per micro-batch with a bubble of 3/35.
TEST(ParallelCost, SlowCollectivesWithManyMicroBatchesChoosePipeline) {
  PlannerOptions opt;
  opt.cost.allreduce_busbw = opt.cost.allgather_busbw = 2e9;
  opt.memory_budget_bytes = 40e9;
  PlannerResult r = Auto("1b", "dp=4", {{"batch", 32}, {"seq", 2048}}, opt);
  EXPECT_EQ(Chosen(r), "pp=4") << r.explanation;
  EXPECT_TRUE(Named(r, "fsdp").fits);
  EXPECT_LT(2 * Named(r, "pp=4").cost.step_s, Named(r, "fsdp").cost.step_s);
}

// A small model with a large batch stays data parallel: neither cut pays off.
TEST(ParallelCost, SmallModelLargeBatchStaysDataParallel) {
  PlannerResult r = Auto("124m", "dp=2", {{"batch", 16}, {"seq", 1024}});
  EXPECT_TRUE(Chosen(r) == "fsdp" || Chosen(r) == "replicate") << r.explanation;
  EXPECT_GT(Named(r, "cp=2").cost.step_s, r.candidates[size_t(r.chosen)].cost.step_s);
  EXPECT_GT(Named(r, "pp=2").cost.step_s, r.candidates[size_t(r.chosen)].cost.step_s);
}

}  // namespace
}  // namespace sg::sharding
