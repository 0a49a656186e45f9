// The FSDP step's memory on each of 2 ranks (real processes, CPU, UCX): every buffer the step
// allocates from AllocatorFor(Cpu()) against ShardedDataParallelStep::PlanMemory / PlanFsdpMemory,
// and the measured peak of two real steps against the plan. Also prints the plan at the 1b shapes
// on 2 ranks (planning only) next to the single-device plan ChooseRecompute used to assume, and the
// 7b plan (full recompute, planning only) against the 16 bytes per parameter the math needs.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>

#include "absl/strings/str_format.h"
#include "comm/multiprocess_testing.h"
#include "compiler/compile.h"
#include "compiler/distributed.h"
#include "compiler/fsdp.h"
#include "compiler/llama_step.h"
#include "gtest/gtest.h"
#include "kernels/core/allocator.h"
#include "kernels/core/testing.h"

namespace sg::compiler {
namespace {

// A scaled-down 1b: the 1b's ffn/dim and heads/kv ratios, 3 layers, seq 256.
LlamaBenchConfig Small() {
  LlamaBenchConfig c = LlamaBenchConfigNamed("tiny").value();
  c.name = "small";
  c.model.dim = 256;
  c.model.n_layers = 3;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 1;
  c.model.ffn_dim = 1024;
  c.model.vocab = 4096;
  c.seq = 256;
  c.batch = 1;
  return c;
}

// A bound on the gathered parameters live at once under bf16 mixed precision: the unit computing
// and the one prefetched, each at most the largest unit (a transformer layer or a vocab x dim
// table), at 2 bytes per parameter (4 while the runtime gathered f32), plus the layers' norm
// weights, which a recomputed backward may read from the forward's gather (2 per layer).
int64_t GatheredBf16Bound(const LlamaBenchConfig& c) {
  const graph::LlamaConfig& m = c.model;
  const int64_t hd = m.head_dim();
  const int64_t layer = m.dim * m.n_heads * hd * 2 + m.dim * m.n_kv_heads * hd * 2 + 3 * m.dim * m.ffn_dim + 2 * m.dim;
  return 2 * (2 * std::max(layer, m.vocab * m.dim) + m.n_layers * 2 * m.dim);
}

std::string Row(const char* item, int64_t bytes) {
  return absl::StrFormat("  %-34s %14d B  %9.3f MiB\n", item, bytes, bytes / 1048576.0);
}

std::string Table(const ShardedStepMemory& m) {
  return Row("arena (activations, gathered", m.arena_bytes) + Row("  params, unit grads, scratch)", 0) +
         Row("  of it: gathered params (max)", m.gathered_peak_bytes) +
         Row("  of it: full unit grads (max)", m.unit_grads_peak_bytes) +
         Row("state (inputs)", m.state_bytes) + Row("shards (param, grad, m, v f32)", m.shard_bytes) +
         Row("buckets (collective staging)", m.bucket_bytes) + Row("other (scalars)", m.other_bytes) + Row("comm scratch (reduce-scatter work)", m.comm_scratch_bytes) +
         Row("total", m.Total()) + Row("host: gradient shards (pinned)", m.host_gradient_bytes);
}

// The 7b step on 2 ranks as llama_step_benchmark --config=7b --strategy=fsdp --recompute=auto
// --memory_budget_gib=42 runs it (full recompute, batch 2 x seq 4096), planned on the CPU only
// (nothing of the 7b's size is allocated), against the floor of the same math: f32 master shard,
// f32 gradient shard, AdamW m and v, 16 bytes per parameter over the 2 ranks.
TEST(FsdpMemoryTest, Plan7bTwoRanks) {
  const LlamaBenchConfig c = LlamaBenchConfigNamed("7b").value();
  graph::Graph fwd = graph::BuildLlamaForward(c.model).value();
  CompileOptions o = LlamaStepOptions(c, Device::Cpu(), RecomputePolicy::kNone);
  o.strategy = Strategy::kFsdp;
  // What --recompute=auto picks under the benchmark's 42 GiB budget (less its 0.25 GiB for library
  // workspaces): nothing fits, so the least memory there is: full recompute, per-parameter
  // collectives and every kept activation that qualifies offloaded to host memory.
  constexpr double kGiB = 1073741824.0;
  ASSERT_TRUE(ChooseRecompute(fwd, int64_t(41.75 * kGiB), 2, &o).ok());
  EXPECT_EQ(o.recompute, RecomputePolicy::kFull);
  EXPECT_TRUE(o.fsdp_per_parameter_collectives);
  EXPECT_GT(o.offload_activations, 0);
  // Since 2026-12-01 that is followed by gradient shards in host memory (below); first the plan
  // without them, all on the device.
  EXPECT_GT(o.fsdp_host_gradient_units, 0);
  o.fsdp_host_gradient_units = 0;
  auto m = PlanFsdpMemory(fwd, o, 2);
  ASSERT_TRUE(m.ok()) << m.status();
  const int64_t floor = c.Parameters() * 16 / 2;
  std::cout << "7b, 2 ranks, full recompute, batch " << c.batch << " x seq " << c.seq << " (planned on the CPU):\n"
            << Table(*m) << Row("floor: 16 B/param / 2 ranks", floor) << Row("  total - floor", m->Total() - floor)
            << "arena " << m->arena_peak.ToString(40);
  // The shards are the floor (uneven chunks pad nothing at 2 ranks but alignment).
  EXPECT_GE(m->shard_bytes, floor);
  EXPECT_LT(m->shard_bytes - floor, int64_t(1) << 20);
  // The arena was 8.87 GiB while full recompute also kept each layer's ffn_norm output and a
  // layer's f32 gradients lived until the next layer's reduce-scatter; 6.37 GiB without those,
  // 5.88 GiB gathered in bf16. Then 3.89 GiB: one kept residual tensor per layer instead of two
  // (-1.63), swiglu_backward in place (-0.17), the backward prefetch issued once half the layer's
  // weights are released (-0.20). Buckets: 1.13 GiB while the reduce-scatter went through a block
  // staging buffer; 0.75 GiB while a layer's gradients went through the f32 rank-major bucket of
  // one layer. Now each weight's gradient is reduce-scattered on its own, in place, as soon as it
  // exists (fsdp_per_parameter_collectives): no bucket, and the FFN's f32 gradients no longer wait
  // through the attention backward.
  EXPECT_LE(m->gathered_peak_bytes, GatheredBf16Bound(c)) << m->ToString();
  // Then (2026-11-30 evening) the residual sums kept for the backward (64 MiB a layer, 2 GiB in
  // all, the arena's largest part at every peak: end of the forward, the loss, layer 31's backward)
  // leave for host memory between their forward and backward uses: -64 MiB planned per offloaded
  // layer (3.82 -> 1.95 GiB with all 32 that qualify).
  EXPECT_LT(m->arena_bytes, int64_t(2.0 * kGiB)) << m->ToString() << "\n" << m->arena_peak.ToString();
  EXPECT_LT(m->bucket_bytes, int64_t(1) << 20) << m->ToString();
  // On the GPU the comm scratch is 0 at 2 ranks (the device ring needs none): 52.15 GiB planned
  // (54.03 without offloading), 1.95 GiB above the floor (7.01 GiB at 57.39 GiB measured, then
  // 4.64 at 55.02 and 4.0 at 54.20 measured), against the peer's 53.4 GiB measured.
  const int64_t device_total = m->Total() - m->comm_scratch_bytes;
  EXPECT_LE(device_total, int64_t(52.9 * kGiB)) << m->ToString();
  EXPECT_LT(device_total - floor, int64_t(2.0 * kGiB)) << m->ToString();
  std::cout << absl::StrFormat("planned on the GPU: %.3f GiB with %d activations offloaded\n", device_total / kGiB,
                               o.offload_activations);
  // A budget between: the fewest offloads that fit it (52.9 GiB: 18 or more of the 64 MiB sums).
  CompileOptions b = LlamaStepOptions(c, Device::Cpu(), RecomputePolicy::kNone);
  b.strategy = Strategy::kFsdp;
  auto fit = ChooseRecompute(fwd, int64_t(52.9 * kGiB) + m->comm_scratch_bytes, 2, &b);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_LE(*fit, int64_t(52.9 * kGiB) + m->comm_scratch_bytes);
  EXPECT_GT(b.offload_activations, 0);
  EXPECT_LT(b.offload_activations, o.offload_activations);
  EXPECT_EQ(b.fsdp_host_gradient_units, 0);
  std::cout << absl::StrFormat("budget 52.9 GiB: %d activations offloaded, planned %.3f GiB\n",
                               b.offload_activations, (*fit - m->comm_scratch_bytes) / kGiB);

  // Under the 42 GiB target (the benchmark's 41.75 on the GPU: the CPU's comm scratch added) every
  // byte over it is optimizer state. The fewest units' gradient shards go to host memory, AdamW
  // deferred into the next forward: 12.55 GiB of gradient shards on the device become two slots.
  CompileOptions h = LlamaStepOptions(c, Device::Cpu(), RecomputePolicy::kNone);
  h.strategy = Strategy::kFsdp;
  const int64_t budget = int64_t(41.75 * kGiB) + m->comm_scratch_bytes;
  auto host_fit = ChooseRecompute(fwd, budget, 2, &h);
  ASSERT_TRUE(host_fit.ok()) << host_fit.status();
  EXPECT_LE(*host_fit, budget);
  EXPECT_EQ(h.offload_activations, o.offload_activations);
  EXPECT_GT(h.fsdp_host_gradient_units, 0);
  auto mh = PlanFsdpMemory(fwd, h, 2);
  ASSERT_TRUE(mh.ok()) << mh.status();
  EXPECT_EQ(mh->arena_bytes, m->arena_bytes);  // the lowering is the same
  // The shards less the host units' gradients, plus two slots of the largest unit (a layer, 404 MB).
  const graph::LlamaConfig& mc = c.model;
  const int64_t layer_shard =
      (mc.dim * mc.n_heads * mc.head_dim() * 2 + mc.dim * mc.n_kv_heads * mc.head_dim() * 2 + 3 * mc.dim * mc.ffn_dim) * 4 / 2;
  const int64_t saved = m->shard_bytes - mh->shard_bytes;
  EXPECT_GT(mh->host_gradient_bytes, 0);
  EXPECT_LE(saved, mh->host_gradient_bytes);
  EXPECT_GE(saved, mh->host_gradient_bytes - 2 * layer_shard - (int64_t(1) << 20));
  CompileOptions fewer = h;
  fewer.fsdp_host_gradient_units -= 1;
  auto mf = PlanFsdpMemory(fwd, fewer, 2);
  ASSERT_TRUE(mf.ok()) << mf.status();
  EXPECT_GT(mf->Total(), budget) << "one unit fewer would have fit";
  std::cout << absl::StrFormat("budget 41.75 GiB: gradient shards of %d units on the host (%.3f GiB), planned "
                               "%.3f GiB on the GPU\n",
                               h.fsdp_host_gradient_units, mh->host_gradient_bytes / kGiB,
                               (mh->Total() - mh->comm_scratch_bytes) / kGiB)
            << Table(*mh);
}

// The deferred optimizer's option: a negative count, and gradient accumulation (which adds each
// micro-batch's gradients into the shards the deferral moves to the host), are refused by name.
// The 1b on 2 ranks under the benchmark's 25 GiB budget, f32 against bf16 gradients
// (CompileOptions::bf16_gradients), planned on the CPU: the matmul weights' unit gradients take
// half the arena bytes, so the plan is smaller and --recompute=auto recomputes SwiGLU in no more
// layers.
TEST(FsdpMemoryTest, Bf16GradientsPlan1bTwoRanks) {
  const LlamaBenchConfig c = LlamaBenchConfigNamed("1b").value();
  graph::Graph fwd = graph::BuildLlamaForward(c.model).value();
  constexpr double kGiB = 1073741824.0;
  int64_t total[2] = {0, 0}, unit_grads[2] = {0, 0};
  int swiglu[2] = {0, 0};
  for (int b = 0; b < 2; ++b) {
    CompileOptions o = LlamaStepOptions(c, Device::Cpu(), RecomputePolicy::kNone);
    o.strategy = Strategy::kFsdp;
    o.bf16_gradients = b == 1;
    ASSERT_TRUE(ChooseRecompute(fwd, int64_t(24.75 * kGiB), 2, &o).ok());
    swiglu[b] = o.recompute == RecomputePolicy::kSelective ? o.recompute_swiglu_layers : -1;
    auto m = PlanFsdpMemory(fwd, o, 2);
    ASSERT_TRUE(m.ok()) << m.status();
    total[b] = m->Total();
    unit_grads[b] = m->unit_grads_peak_bytes;
  }
  std::cout << absl::StrFormat("1b FSDP on 2 ranks under 24.75 GiB: f32 gradients %.2f GiB (SwiGLU recomputed in %d "
                               "layers, unit gradients %.3f GiB at most), bf16 %.2f GiB (%d layers, %.3f GiB)\n",
                               total[0] / kGiB, swiglu[0], unit_grads[0] / kGiB, total[1] / kGiB, swiglu[1],
                               unit_grads[1] / kGiB);
  EXPECT_GE(swiglu[0], 0);
  EXPECT_GE(swiglu[1], 0);
  EXPECT_LE(swiglu[1], swiglu[0]);
  EXPECT_LT(unit_grads[1], unit_grads[0]);
  EXPECT_LE(total[1], int64_t(24.75 * kGiB));
}

TEST(FsdpMemoryTest, HostGradientUnitsRefusesBadOptions) {
  const LlamaBenchConfig c = Small();
  graph::Graph fwd = graph::BuildLlamaForward(c.model).value();
  CompileOptions o = LlamaStepOptions(c, Device::Cpu(), RecomputePolicy::kNone);
  o.strategy = Strategy::kFsdp;
  o.fsdp_host_gradient_units = -1;
  auto m = PlanFsdpMemory(fwd, o, 2);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_NE(m.status().message().find("fsdp_host_gradient_units must be >= 0, found -1"), std::string::npos)
      << m.status();
  o.fsdp_host_gradient_units = 2;
  o.micro_batches = 2;
  o.binding["batch"] = 2;
  m = PlanFsdpMemory(fwd, o, 2);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented) << m.status();
  EXPECT_NE(m.status().message().find("fsdp_host_gradient_units=2 defers AdamW to the next step's forward, which "
                                      "micro_batches=2"),
            std::string::npos)
      << m.status();
  // ChooseRecompute does not offer it with micro-batches: the least memory it plans has none.
  o.fsdp_host_gradient_units = 0;
  ASSERT_TRUE(ChooseRecompute(fwd, 1, 2, &o).ok());
  EXPECT_EQ(o.fsdp_host_gradient_units, 0);
  EXPECT_EQ(o.recompute, RecomputePolicy::kFull);
}

TEST(FsdpMemoryTest, TwoRanksPeakMatchesPlan) {
  comm::testing::WorkerRun run = comm::testing::RunWorkers(2, "Workers.DISABLED_FsdpMemory",
                                                           {absl::StrCat("SG_DIST_SEED=", sg::testing::Rng()())},
                                                           absl::Seconds(120));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
  std::cout << run.outputs[0];
}

// The same with AdamW deferred and the gradient shards of 5 of the 6 units (all but the
// embedding) in host memory (CompileOptions::fsdp_host_gradient_units): the device buffers are
// still exactly the plan.
TEST(FsdpMemoryTest, TwoRanksPeakMatchesPlanWithHostGradients) {
  comm::testing::WorkerRun run = comm::testing::RunWorkers(
      2, "Workers.DISABLED_FsdpMemory", {absl::StrCat("SG_DIST_SEED=", sg::testing::Rng()()), "SG_HOST_UNITS=5"},
      absl::Seconds(120));
  EXPECT_TRUE(run.AllPassed()) << run.Summary();
  std::cout << run.outputs[0];
}

TEST(Workers, DISABLED_FsdpMemory) {
  const int rank = int(comm::testing::EnvInt("RANK", 0)), world = int(comm::testing::EnvInt("WORLD_SIZE", 1));
  const LlamaBenchConfig c = Small();
  graph::Graph fwd = graph::BuildLlamaForward(c.model).value();
  CompileOptions o = LlamaStepOptions(c, Device::Cpu(), RecomputePolicy::kSelective);
  o.strategy = Strategy::kFsdp;
  o.comm_timeout_s = 60;
  o.fsdp_host_gradient_units = int(comm::testing::EnvInt("SG_HOST_UNITS", 0));
  auto planned = PlanFsdpMemory(fwd, o, world);
  ASSERT_TRUE(planned.ok()) << planned.status();
  const PlannedMemory single = PlanMemory(fwd, o).value();

  Allocator* cpu = AllocatorFor(Device::Cpu()).value();
  auto batch = RandomTokenBatch(c, uint64_t(comm::testing::EnvInt("SG_DIST_SEED", 1)) + uint64_t(rank)).value();
  std::map<std::string, TensorView> views;
  for (auto& [name, t] : batch) views[name] = t.view();
  const int64_t before = cpu->CurrentBytes();
  auto step = Compile(fwd, o);
  ASSERT_TRUE(step.ok()) << step.status();
  const int64_t compiled = cpu->CurrentBytes() - before;
  ASSERT_TRUE(InitLlamaParameters(**step, fwd, 7).ok());
  ASSERT_TRUE((*step)->SetLearningRate(1e-3f).ok());
  auto* fsdp = dynamic_cast<ShardedDataParallelStep*>(step->get());
  ASSERT_NE(fsdp, nullptr);
  const ShardedStepMemory& m = fsdp->memory();
  // Compile allocates exactly what PlanMemory says (rank 0 has the largest chunks).
  if (rank == 0) {
    EXPECT_EQ(m.Total(), planned->Total()) << m.ToString() << " vs " << planned->ToString();
  }
  EXPECT_EQ(m.arena_bytes, planned->arena_bytes);

  cpu->ResetPeak();
  float first = 0;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE((*step)->Run(views).ok());
    StepMetrics sm = (*step)->ReadMetrics().value();
    ASSERT_TRUE(std::isfinite(sm.loss));
    if (i == 0) first = sm.loss;
  }
  EXPECT_GT(first, 1.0f);
  const int64_t peak = cpu->PeakBytes() - before;
  std::string out = absl::StrFormat("rank %d of %d, FSDP at dim %d, %d layers, vocab %d, seq %d, batch %d:\n", rank,
                                    world, c.model.dim, c.model.n_layers, c.model.vocab, c.seq, c.batch);
  out += Table(m);
  out += Row("allocated by Compile (measured)", compiled);
  out += Row("peak of two steps (measured)", peak);
  out += Row("  peak - planned total", peak - m.Total());
  out += Row("single-device plan: arena", single.arena_bytes);
  out += Row("single-device plan: state / ranks", single.state_bytes / world);
  std::cout << out;
  // Compile allocates the plan but comm's scratch, which the steps add (with any kernel scratch).
  EXPECT_GE(compiled, m.Total() - m.comm_scratch_bytes);
  EXPECT_LT(std::abs(double(peak - m.Total())) / double(peak), 0.05) << out;
  EXPECT_LE(m.gathered_peak_bytes, GatheredBf16Bound(c)) << out;
  if (o.fsdp_host_gradient_units > 0) {
    // The host units' gradient shards left the device for two slots of the largest of them (the
    // output projection's rows here: vocab x dim / ranks f32).
    CompileOptions eager = o;
    eager.fsdp_host_gradient_units = 0;
    auto without = PlanFsdpMemory(fwd, eager, world);
    ASSERT_TRUE(without.ok()) << without.status();
    const int64_t slot = c.model.vocab * c.model.dim / world * 4;
    EXPECT_GT(m.host_gradient_bytes, 2 * slot);
    EXPECT_EQ(m.shard_bytes + m.host_gradient_bytes,
              without->shard_bytes + ShardedDataParallelStep::kHostGradientSlots * slot) << out;
    EXPECT_LT(m.shard_bytes, without->shard_bytes) << out;
    return;
  }

  if (rank == 0) {
    // The 1b step on 2 ranks, as llama_step_benchmark runs it (selective, SwiGLU recomputed in 2
    // layers): per-rank plan versus the single-device arena + state / 2 it used to be budgeted as.
    LlamaBenchConfig b = LlamaBenchConfigNamed("1b").value();
    graph::Graph f1 = graph::BuildLlamaForward(b.model).value();
    CompileOptions o1 = LlamaStepOptions(b, Device::Cpu(), RecomputePolicy::kSelective);
    o1.recompute_swiglu_layers = 2;
    o1.strategy = Strategy::kFsdp;
    ShardedStepMemory m1 = PlanFsdpMemory(f1, o1, 2).value();
    PlannedMemory s1 = PlanMemory(f1, o1).value();
    std::cout << "1b, 2 ranks (planned on the CPU):\n" << Table(m1) << Row("single-device plan: arena", s1.arena_bytes)
              << Row("single-device plan: state / 2", s1.state_bytes / 2);
    // bf16 gathers: 241 MiB of gathered parameters at most (482 MiB when they were f32).
    EXPECT_LE(m1.gathered_peak_bytes, GatheredBf16Bound(b)) << m1.ToString();
    // What llama_step_benchmark's --recompute=auto now picks for FSDP at the 1b's 32 GiB budget
    // (less its 0.25 GiB allowance for library workspaces), and at 25 GiB.
    // The CPU's host ring takes a reduce-scatter work buffer the device ring at 2 ranks does not:
    // added to the budget, so the choice is the one made on the GPU.
    for (const double gib : {31.75, 24.75}) {
      CompileOptions a = o1;
      const int64_t budget = int64_t(gib * 1073741824.0) + m1.comm_scratch_bytes;
      auto bytes = ChooseRecompute(f1, budget, 2, &a);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      EXPECT_LE(*bytes, budget);
      // The 1b fits with the bucketed collectives (one a layer: per-parameter ones cost it 3.1% on
      // 2 H200s) and SwiGLU recomputed in at most 7 layers under 25 GiB (measured 76,244 tok/s).
      EXPECT_FALSE(a.fsdp_per_parameter_collectives);
      EXPECT_EQ(a.offload_activations, 0);
      EXPECT_EQ(a.fsdp_host_gradient_units, 0);
      if (gib < 25) {
        EXPECT_EQ(a.recompute, RecomputePolicy::kSelective);
        EXPECT_LE(a.recompute_swiglu_layers, 7);
      }
      std::cout << absl::StrFormat("ChooseRecompute(fsdp, 2 ranks, budget %.2f GiB): policy %d, swiglu layers %d, "
                                   "planned %.2f GiB without comm scratch\n", gib, int(a.recompute),
                                   a.recompute_swiglu_layers, (*bytes - m1.comm_scratch_bytes) / 1073741824.0);
    }
    // With the weight-gradient stream (its matmuls' inputs kept until their joins) under 25 GiB.
    CompileOptions w = o1;
    w.wgrad_stream = true;
    const int64_t budget = int64_t(24.75 * 1073741824.0) + m1.comm_scratch_bytes;
    auto bytes = ChooseRecompute(f1, budget, 2, &w);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_LE(*bytes, budget);
    std::cout << absl::StrFormat("ChooseRecompute(fsdp, 2 ranks, budget 24.75 GiB, wgrad_stream): policy %d, swiglu "
                                 "layers %d, planned %.2f GiB without comm scratch\n", int(w.recompute),
                                 w.recompute_swiglu_layers, (*bytes - m1.comm_scratch_bytes) / 1073741824.0);
  }
}

}  // namespace
}  // namespace sg::compiler
