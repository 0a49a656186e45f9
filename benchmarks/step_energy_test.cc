// GroupSteps on the tiny Llama step compiled for the CPU: the groups partition the schedule, a
// layer's operation gathers one step per layer, and the matmul FLOPs the groups carry add up to
// 6 x tokens x the matmul weights' elements (forward, data and weight gradient of each), counted
// here from the model's shapes. WholeStep gathers every grouped step, or all but one group's.
// ProfileGroups refuses a CPU program; on a GPU with NVML it measures every group of the tiny CUDA
// step at a positive energy and time, and a ProgramSnapshot brings the state an AdamW group's
// replays moved back to its bytes before them.
#include "benchmarks/step_energy.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "compiler/compile.h"
#include "compiler/llama_step.h"
#include "graph/models/llama.h"
#include "graph/ops.h"
#include "gtest/gtest.h"
#include "kernels/core/device.h"
#include "kernels/core/tensor.h"

namespace sg::benchmarks {
namespace {

std::unique_ptr<compiler::CompiledStep> TinyStep(Device device) {
  auto c = compiler::LlamaBenchConfigNamed("tiny").value();
  graph::Graph fwd = graph::BuildLlamaForward(c.model).value();
  compiler::CompileOptions o = compiler::LlamaStepOptions(c, device, compiler::RecomputePolicy::kNone);
  auto step = compiler::Compile(fwd, o);
  EXPECT_TRUE(step.ok()) << step.status();
  return step.ok() ? *std::move(step) : nullptr;
}

TEST(StepEnergyTest, GroupsPartitionTheScheduleAndCarryTheMatmulFlops) {
  auto step = TinyStep(Device::Cpu());
  ASSERT_NE(step, nullptr);
  const compiler::Program& p = step->program();
  std::vector<int> skipped;
  const std::vector<StepGroup> groups = GroupSteps(p, &skipped);
  EXPECT_TRUE(skipped.empty());  // one CPU device: every step on the compute stream

  std::multiset<int> seen(skipped.begin(), skipped.end());
  std::set<std::string> keys;
  double flops = 0;
  for (const StepGroup& g : groups) {
    EXPECT_TRUE(keys.insert(g.key).second) << g.key;
    EXPECT_FALSE(g.steps.empty()) << g.key;
    for (size_t i = 1; i < g.steps.size(); ++i) EXPECT_LT(g.steps[i - 1], g.steps[i]) << g.key;
    seen.insert(g.steps.begin(), g.steps.end());
    flops += g.flops;
  }
  ASSERT_EQ(seen.size(), p.schedule.steps.size());
  for (int i = 0; i < int(p.schedule.steps.size()); ++i) EXPECT_EQ(seen.count(i), 1u) << i;

  const auto c = compiler::LlamaBenchConfigNamed("tiny").value();
  const int64_t d = c.model.dim, layers = c.model.n_layers, ffn = c.model.ffn_dim;
  const int64_t kv = c.model.head_dim() * c.model.n_kv_heads;
  bool found_w1 = false;
  for (const StepGroup& g : groups) {
    if (g.key == "matmul @layers.#.feed_forward.w1 fwd 0") {
      found_w1 = true;
      EXPECT_EQ(int64_t(g.steps.size()), layers);
      EXPECT_DOUBLE_EQ(g.flops, 2.0 * layers * c.batch * c.seq * d * ffn);
    }
    EXPECT_FALSE(absl::StrContains(g.key, "layers.0")) << g.key;
  }
  EXPECT_TRUE(found_w1);
  const double weights = double(layers) * (2 * d * d + 2 * d * kv + 3 * d * ffn) + double(c.model.vocab) * d;
  EXPECT_DOUBLE_EQ(flops, 6.0 * double(c.batch * c.seq) * weights);
}

TEST(StepEnergyTest, ProfileRefusesACpuProgram) {
  auto step = TinyStep(Device::Cpu());
  ASSERT_NE(step, nullptr);
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device: no NVML meter to hand the profile";
  auto meter = GpuEnergyMeter::Open(CudaDevicePciBusId(0).value());
  if (!meter.ok()) GTEST_SKIP() << "no NVML: " << meter.status();
  std::vector<StepGroup> groups = GroupSteps(step->program(), nullptr);
  auto rows = ProfileGroups(step->program(), groups, step->executor().compute_stream(), **meter, absl::Milliseconds(10));
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kFailedPrecondition) << rows.status();
}

TEST(StepEnergyTest, WholeStepGathersEveryGroupButTheOneLeftOut) {
  auto step = TinyStep(Device::Cpu());
  ASSERT_NE(step, nullptr);
  const std::vector<StepGroup> groups = GroupSteps(step->program(), nullptr);
  ASSERT_GT(groups.size(), 3u);
  const StepGroup all = WholeStep(groups);
  ASSERT_EQ(all.steps.size(), step->program().schedule.steps.size());
  for (size_t i = 0; i < all.steps.size(); ++i) EXPECT_EQ(all.steps[i], int(i));
  const StepGroup& out = groups[2];
  const StepGroup without = WholeStep(groups, &out);
  EXPECT_EQ(without.steps.size() + out.steps.size(), all.steps.size());
  EXPECT_TRUE(std::is_sorted(without.steps.begin(), without.steps.end()));
  for (int i : out.steps) EXPECT_FALSE(std::binary_search(without.steps.begin(), without.steps.end(), i)) << i;
  EXPECT_DOUBLE_EQ(without.flops + out.flops, all.flops);
  EXPECT_TRUE(absl::StrContains(without.key, out.key)) << without.key;
}

// SumByKind over the tiny CPU step's groups with made-up rows (group i: i + 1 J, 2 i + 1 ms): each
// kind's sums against the groups classified here by the op of their first step's graph node
// (runtime steps such as the step counter are the optimizer's), and joules a TFLOP from the groups
// that carry matmul FLOPs only.
TEST(StepEnergyTest, SumByKindAddsEachGroupToItsKindOnce) {
  auto step = TinyStep(Device::Cpu());
  ASSERT_NE(step, nullptr);
  const compiler::Program& p = step->program();
  const std::vector<StepGroup> groups = GroupSteps(p, nullptr);
  std::vector<GroupEnergy> rows(groups.size());
  std::map<std::string, double> joules, ms, flops, flop_joules;
  std::map<std::string, int> count;
  for (size_t i = 0; i < groups.size(); ++i) {
    rows[i].key = groups[i].key;
    rows[i].joules_per_step = double(i + 1);
    rows[i].ms_per_step = double(2 * i + 1);
    const compiler::Step& first = p.schedule.steps[size_t(groups[i].steps[0])];
    const std::string op = first.node >= 0 ? graph::OpName(step->training_graph().nodes()[first.node].op) : "";
    const std::string kind = op == "matmul" || absl::StartsWith(first.name, "matmul + ") ? "matmul"
                             : op == "attention" || op == "attention_backward"       ? "attention"
                             : op == "adamw" || op == "grad_norm" || op.empty()       ? "optimizer"
                                                                                      : "other";
    joules[kind] += rows[i].joules_per_step;
    ms[kind] += rows[i].ms_per_step;
    flops[kind] += groups[i].flops;
    if (groups[i].flops > 0) flop_joules[kind] += rows[i].joules_per_step;
    ++count[kind];
  }
  const std::vector<KindEnergy> kinds = SumByKind(groups, rows);
  ASSERT_EQ(kinds.size(), count.size());
  int total = 0;
  for (const KindEnergy& k : kinds) {
    SCOPED_TRACE(k.kind);
    EXPECT_EQ(k.groups, count[k.kind]);
    EXPECT_DOUBLE_EQ(k.joules_per_step, joules[k.kind]);
    EXPECT_DOUBLE_EQ(k.ms_per_step, ms[k.kind]);
    EXPECT_DOUBLE_EQ(k.flops, flops[k.kind]);
    EXPECT_DOUBLE_EQ(k.mean_watts(), joules[k.kind] / ms[k.kind] * 1e3);
    EXPECT_DOUBLE_EQ(k.joules_per_tflop, flops[k.kind] > 0 ? flop_joules[k.kind] / (flops[k.kind] / 1e12) : 0);
    total += k.groups;
  }
  EXPECT_EQ(total, int(groups.size()));
  EXPECT_EQ(kinds.front().kind, "matmul");
  EXPECT_GT(kinds.front().flops, 0);
}

// The state's bytes on the host, through a device-to-host copy.
std::vector<char> StateBytes(const compiler::Program& p, const Stream& s) {
  std::vector<char> host(size_t(p.state.bytes()));
  const int64_t n = p.state.bytes() / 4;
  EXPECT_TRUE(CopyTensor(TensorView(p.state.data(), DType::kF32, {n}, p.device),
                         TensorView(host.data(), DType::kF32, {n}, Device::Cpu()), s)
                  .ok());
  return host;
}

// The tiny CUDA step initialized from `seed` and run `runs` times on one random batch (Run copies
// the batch in), synchronized; null after a failure it reports.
std::unique_ptr<compiler::CompiledStep> TrainedTinyCudaStep(uint64_t seed, int runs) {
  auto step = TinyStep(Device::Cuda(0));
  if (step == nullptr) return nullptr;
  const auto c = compiler::LlamaBenchConfigNamed("tiny").value();
  absl::Status st = compiler::InitLlamaParameters(*step, graph::BuildLlamaForward(c.model).value(), seed);
  const auto batch = compiler::RandomTokenBatch(c, seed + 1).value();
  std::map<std::string, TensorView> views;
  for (const auto& [k, t] : batch) views[k] = t.view();
  for (int i = 0; i < runs && st.ok(); ++i) st = step->Run(views);
  if (st.ok()) st = step->executor().Synchronize();
  if (!st.ok()) ADD_FAILURE() << st;
  return st.ok() ? std::move(step) : nullptr;
}

TEST(StepEnergyTest, SnapshotRestoresWhatAnAdamWGroupsReplaysMoved) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  auto meter = GpuEnergyMeter::Open(CudaDevicePciBusId(0).value());
  if (!meter.ok()) GTEST_SKIP() << "no NVML: " << meter.status();
  auto step = TrainedTinyCudaStep(11, 2);
  ASSERT_NE(step, nullptr);
  const compiler::Program& p = step->program();
  const Stream& s = step->executor().compute_stream();
  ASSERT_EQ(p.state.bytes() % 4, 0);
  std::vector<StepGroup> adamw;
  for (const StepGroup& g : GroupSteps(p, nullptr)) {
    if (absl::StartsWith(g.key, "adamw")) adamw.push_back(g);
  }
  ASSERT_EQ(adamw.size(), 1u) << "the tiny step's AdamW as one multi-tensor group";
  const std::vector<char> before = StateBytes(p, s);
  auto snap = ProgramSnapshot::Take(p, s);
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_GE(snap->bytes(), p.state.bytes() + p.arena.bytes());
  ASSERT_TRUE(ProfileGroups(p, adamw, s, **meter, absl::Milliseconds(50)).ok());
  const std::vector<char> moved = StateBytes(p, s);
  EXPECT_NE(moved, before) << "the AdamW replays changed no byte of the state";
  ASSERT_TRUE(snap->Restore(s).ok());
  EXPECT_EQ(StateBytes(p, s), before);
  // Restored before each group's run: the state after a profile from the snapshot is the
  // snapshot's plus one group's replays, the same every time.
  ASSERT_TRUE(ProfileGroups(p, adamw, s, **meter, absl::Milliseconds(50), &*snap).ok());
  EXPECT_NE(StateBytes(p, s), before);
}

TEST(StepEnergyTest, ProfilesEveryGroupOfTheCudaStep) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  auto meter = GpuEnergyMeter::Open(CudaDevicePciBusId(0).value());
  if (!meter.ok()) GTEST_SKIP() << "no NVML: " << meter.status();
  auto step = TrainedTinyCudaStep(7, 3);  // warm-up, then the captured step
  ASSERT_NE(step, nullptr);
  std::vector<int> skipped;
  std::vector<StepGroup> groups = GroupSteps(step->program(), &skipped);
  auto rows = ProfileGroups(step->program(), groups, step->executor().compute_stream(), **meter, absl::Milliseconds(250));
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), groups.size());
  for (size_t i = 0; i < rows->size(); ++i) {
    const GroupEnergy& r = (*rows)[i];
    SCOPED_TRACE(r.key);
    EXPECT_EQ(r.key, groups[i].key);
    EXPECT_GE(r.replays, 3);
    EXPECT_GE(r.window_ms, 250 / 2) << r.replays << " replays";
    EXPECT_GT(r.ms_per_step, 0);
    EXPECT_GT(r.joules_per_step, 0);
    EXPECT_EQ(r.tflops > 0, groups[i].flops > 0);
  }
}

}  // namespace
}  // namespace sg::benchmarks
