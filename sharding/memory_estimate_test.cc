// Issue 7: the cost model's per-rank memory estimate against the measured peak of a real CPU
// training step (compiler/compile.h), whose state and arena come from AllocatorFor(Cpu()).
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "graph/models/llama.h"
#include "gtest/gtest.h"
#include "kernels/core/allocator.h"
#include "kernels/core/testing.h"
#include "sharding/cost_model.h"
#include "sharding/mesh.h"
#include "sharding/strategy.h"

namespace sg::sharding {
namespace {

TEST(MemoryEstimateTest, SingleRankEstimateWithinTenPercentOfMeasuredCpuPeak) {
  graph::LlamaConfig c;
  c.dim = 128;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 384;
  c.vocab = 512;
  c.dtype = DType::kF32;
  const int64_t batch = 4, seq = 64;
  const graph::Binding binding = {{"batch", batch}, {"seq", seq}};

  // The estimate: the training step graph, replicated on a one-device mesh.
  graph::Graph train = graph::BuildLlamaTrainStep(c, {}).value();
  DeviceMesh mesh = DeviceMesh::Parse("dp=1").value();
  ShardingPlan plan = BuildShardingPlan(train, mesh, {StrategyKind::kReplicate}).value();
  PlanCost cost = EstimateCost(train, plan, binding, {}).value();

  // The measurement: compile that same step for the CPU and run two real steps.
  std::mt19937_64& rng = sg::testing::Rng();
  std::uniform_int_distribution<int> tok(0, int(c.vocab) - 1);
  std::vector<double> tokens(batch * seq), targets(batch * seq);
  for (double& t : tokens) t = tok(rng);
  for (double& t : targets) t = tok(rng);
  Tensor tk = sg::testing::FromHost(tokens, {batch, seq}, DType::kI32, Device::Cpu());
  Tensor tg = sg::testing::FromHost(targets, {batch, seq}, DType::kI32, Device::Cpu());
  // Everything allocated before Compile (the batch above) is the test's, not the step's.
  Allocator* cpu = AllocatorFor(Device::Cpu()).value();
  const int64_t before = cpu->CurrentBytes();
  compiler::CompileOptions o;
  o.device = Device::Cpu();
  o.precision = compiler::Precision::kF32;
  o.binding = binding;
  auto step = compiler::Compile(train, o);
  ASSERT_TRUE(step.ok()) << step.status();
  for (const std::string& name : (*step)->parameter_names()) {
    TensorView v = (*step)->View(name).value();
    Tensor w = sg::testing::RandomTensor(v.shape(), DType::kF32, Device::Cpu(), rng, 0.05);
    ASSERT_TRUE((*step)->Write(name, w).ok()) << name;
  }
  ASSERT_TRUE((*step)->SetLearningRate(1e-3f).ok());
  // The step's memory is all allocated now (state + arena); the peak of the steps themselves
  // adds any kernel scratch and staging.
  cpu->ResetPeak();
  float first_loss = 0;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE((*step)->Run({{"tokens", tk.view()}, {"targets", tg.view()}}).ok());
    compiler::StepMetrics m = (*step)->ReadMetrics().value();
    ASSERT_TRUE(std::isfinite(m.loss));
    if (i == 0) first_loss = m.loss;
    EXPECT_EQ(m.step, i + 1);
  }
  EXPECT_GT(first_loss, 0.0f);
  const int64_t measured = cpu->PeakBytes() - before;

  const int64_t estimate = cost.memory.Total();
  const double rel = std::abs(double(estimate - measured)) / double(measured);
  std::cout << "estimate " << estimate << " B (" << HumanBytes(double(estimate))
            << "), measured peak " << measured << " B (" << HumanBytes(double(measured))
            << "), relative error " << rel << "\n"
            << "  parameters " << cost.memory.parameters << ", gradients " << cost.memory.gradients
            << ", optimizer " << cost.memory.optimizer << ", activations " << cost.memory.activations
            << ", transient " << cost.memory.transient << "\n";
  compiler::PlannedMemory pm = compiler::PlanMemory(train, o).value();
  std::cout << "  compiler plan: state " << pm.state_bytes << ", arena " << pm.arena_bytes << "\n";
  // The measurement saw the step's real buffers: its state and arena came from this allocator.
  EXPECT_GE(measured, pm.state_bytes + pm.arena_bytes);
  EXPECT_LT(rel, 0.10);
}

}  // namespace
}  // namespace sg::sharding
