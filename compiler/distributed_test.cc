// Distributed Compile on real processes (localhost, CPU, UCX): FSDP (2 ranks, uneven chunks),
// HYBRID_SHARD (2x2 mesh on 4 processes) and auto (2 ranks) against the single-process step on
// the whole batch: the loss, the gradient norm and EVERY gradient (gathered to full shape) after
// one step, and every parameter after 3 steps. A rank that dies makes the others fail with an
// error naming it. Tolerance: f32 kernels summing in another order (per-rank partial sums, ring
// reductions): relative 2e-5 on loss and norm, 1e-4 on gradients and parameters. Also FSDP and
// HYBRID_SHARD in bf16 mixed precision on the CPU, where the runtime gathers bf16 weights (cast
// from the f32 master shards) and the reference casts its f32 masters: the same tolerances.
#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/multiprocess_testing.h"
#include "compiler/compile.h"
#include "compiler/dist_context.h"
#include "compiler/testing/step_compare.h"
#include "compiler/testing/tiny_llama.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::compiler {
namespace {

constexpr int64_t kGlobalBatch = 4, kSeq = 8, kSteps = 3;
// Also on CUDA: these comparisons keep testing::kCpuLr.
constexpr float kLr = testing::kCpuLr;

std::string SeedEnv() { return absl::StrCat("SG_DIST_SEED=", sg::testing::Rng()()); }

// The same on every rank: seeded from the parent's random seed. The CUDA model has the CUDA
// kernels' shapes and matrices scaled down so bf16 logits stay moderate.
testing::StepData MakeData(bool cuda = false, bool bf16 = false, bool even = false, int layers = 2) {
  testing::TinyLlamaConfig c;
  c.layers = layers;
  c.ffn = even ? 24 : 25;  // w1/w3 have 25 rows: uneven chunks over 2 and 4 ranks
  if (cuda) c = testing::WithCudaKernelShapes(c);
  testing::StepDataOptions o(kSteps, kGlobalBatch, kSeq, c.vocab);
  o.ignored_targets = {1};  // an ignored token: the global mean must count tokens, not rows
  o.small_matrices = cuda || bf16;
  return testing::MakeStepData(*testing::TinyLlama(c), uint64_t(comm::testing::EnvInt("SG_DIST_SEED", 1)), o);
}

// The whole comparison, on every rank of a job of `world` processes. On CUDA each rank uses GPU
// `rank` for both its distributed share and the single-GPU reference, both in bf16 mixed precision
// (f32 master weights and gradients, bf16 activations: the CUDA attention kernels' case).
// `per_parameter`: FSDP with CompileOptions::fsdp_per_parameter_collectives, on a model whose
// every parameter splits evenly over the ranks (so every layer takes that form).
// `offload` > 0: also full recompute with that many kept activations offloaded to host memory
// (CompileOptions::offload_activations, the 7b's form), on a model of 6 layers (the offloads need
// long gaps between the forward's last and the backward's first reader).
// `wgrad`: CompileOptions::wgrad_stream (weight-gradient matmuls on their own stream, joined before
// the reduce-scatters that read them).
// `host_units` > 0: CompileOptions::fsdp_host_gradient_units (AdamW deferred into the next step's
// forward, those units' gradient shards in host memory). The losses of steps 2 and 3 then depend
// on the deferred updates, "grad:" is read from the host, and the parameters after the last step
// on the update applied by Read.
// `bf16_grads`: CompileOptions::bf16_gradients on both (bf16 mixed precision): the reference keeps
// its matmul weights' gradients in bf16, the distributed step packs bf16 buckets and reduce-scatters
// them summed in f32 into its f32 shards.
void CompareWithSingleProcess(Strategy strategy, std::vector<int64_t> mesh, bool cuda = false, bool bf16 = false,
                              bool per_parameter = false, int offload = 0, bool wgrad = false, int host_units = 0,
                              bool bf16_grads = false) {
  const int rank = int(comm::testing::EnvInt("RANK", 0)), world = int(comm::testing::EnvInt("WORLD_SIZE", 1));
  const Device device = cuda ? Device::Cuda(rank) : Device::Cpu();
  // CUDA: bf16 activations from GEMMs at another M (cuBLASLt may pick another algorithm, so a bf16
  // rounding flips here and there) and attention's atomic dq: bf16-level agreement.
  testing::StepCompare cmp;
  if (cuda) {
    cmp.tol = testing::Bf16StepTolerances();
    cmp.tol.trained = 1e-3;  // kLr, not kCudaLr: larger steps
    // kLr's larger steps also carry bf16 flips further: on the H200 seed 4197957661795577967 put
    // the third step's gradient norm 0.40% and tok_embeddings 1.34% off after 3 steps, eager and
    // graph-replayed alike (bitwise the same), above Bf16StepTolerances' 0.2% / 1%.
    // Seed 9945489772930281095 (2026-11-30 13:28) put tok_embeddings 2.46% off after 3 steps while
    // every first-step gradient agreed to 1.1e-7, bitwise the same on the binaries before and after
    // that day's FSDP layout changes: rows whose gradients are at rounding level get lr-sized
    // first AdamW steps, so the embedding carries these flips furthest. A wrong partial sum shows in
    // the first step's gradients (Bf16StepTolerances' bound), long before the parameters.
    cmp.tol.scalar = 5e-3;
    cmp.tol.param = 4e-2;
  }
  // The loss and gradient norm of later steps carry a rare, larger difference: AdamW's first,
  // normalized step turns a gradient at rounding level into a full lr-sized update, and the ranks
  // sum in another order. f32 2x2 HYBRID_SHARD, one CI seed (SG_TEST_SEED=6656523637087264236 for
  // the whole binary, 2026-11-30, the same at the previous session's code): 5.7e-5 relative; 24
  // other seeds at most 9.4e-6. 2e-4 keeps it in, far below a missing or doubled partial sum.
  if (!cuda) cmp.tol.scalar = 2e-4;
  if (bf16 && !cuda) cmp.tol = testing::Bf16StepTolerances();
  // bf16 on the CPU: every rank casts the same f32 master rows the reference casts, but the
  // per-rank partial sums are rounded to bf16 at other points than the one-process sums; 2 seeds
  // stayed within the f32 tolerances, 16 CI-size runs did not (gradients 8e-4, parameters 5.0e-4
  // after 3 steps, 2026-11-30): bf16-level agreement, as on CUDA.
  // bf16 gradients: each rank's partial gradient is rounded to bf16 before the f32 sum, the
  // reference's whole-batch gradient once, so they differ by up to a bf16 ulp (2^-8) per element
  // (first-step gradients 2.4e-3 apart at most, CPU, 2026-12-04), which AdamW's normalized steps
  // carry into the parameters: after 3 steps 1.2-1.9% and a 0.2% gradient norm. The CUDA
  // tolerances; a missing or doubled partial sum still fails the first step's gradients.
  if (bf16_grads) {
    cmp.tol.scalar = 5e-3;
    cmp.tol.param = 4e-2;
  }
  const Precision precision = cuda || bf16 ? Precision::kBF16Mixed : Precision::kF32;
  testing::StepData d = MakeData(cuda, bf16, per_parameter, offload > 0 ? 6 : 2);
  CompileOptions ref_opt;
  ref_opt.precision = precision;
  ref_opt.device = device;
  ref_opt.binding = {{"batch", kGlobalBatch}, {"seq", kSeq}};
  ref_opt.bf16_gradients = bf16_grads;
  std::unique_ptr<CompiledStep> ref = testing::CompileAndInit(d, ref_opt, kLr);
  CompileOptions dist_opt;
  dist_opt.strategy = strategy;
  dist_opt.precision = precision;
  dist_opt.device = device;
  dist_opt.mesh = mesh;
  dist_opt.comm_timeout_s = 30;
  dist_opt.fsdp_per_parameter_collectives = per_parameter;
  dist_opt.wgrad_stream = wgrad;
  dist_opt.fsdp_host_gradient_units = host_units;
  dist_opt.bf16_gradients = bf16_grads;
  if (offload > 0) {
    dist_opt.recompute = RecomputePolicy::kFull;
    dist_opt.offload_activations = offload;
  }
  dist_opt.binding = {{"batch", kGlobalBatch / world}, {"seq", kSeq}};
  std::unique_ptr<CompiledStep> dist = testing::CompileAndInit(d, dist_opt, kLr);
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(dist, nullptr);
  if (rank == 0) std::cout << dist->explanation() << "\n";
  // The matmul weights' gradients are bf16 in both programs exactly when asked for.
  for (const CompiledStep* s : {ref.get(), dist.get()}) {
    const DType t = s->program().outputs.at("grad:layers.0.feed_forward.w1.weight").dtype();
    EXPECT_EQ(t, bf16_grads ? DType::kBF16 : DType::kF32) << (s == ref.get() ? "reference" : "distributed");
    EXPECT_EQ(s->program().outputs.at("grad:layers.0.attention_norm.weight").dtype(), DType::kF32);
  }
  EXPECT_EQ(absl::StrContains(dist->explanation(), "each parameter gathered and reduce-scattered on its own"),
            per_parameter)
      << dist->explanation();
  int offloads = 0, reloads = 0;
  for (const Step& st : dist->program().schedule.steps) {
    offloads += absl::StartsWith(st.name, "offload ");
    reloads += absl::StartsWith(st.name, "reload ");
    if (absl::StartsWith(st.name, "offload ") || absl::StartsWith(st.name, "reload ")) {
      EXPECT_EQ(st.stream, 2);
    }
  }
  EXPECT_EQ(offloads, offload) << "one copy to the host per offloaded activation";
  int on_wgrad_stream = 0;
  for (const Step& st : dist->program().schedule.steps) on_wgrad_stream += st.stream == 3;
  if (wgrad) {
    EXPECT_GT(on_wgrad_stream, 0) << "the layers' weight gradients but each unit's last";
  } else {
    EXPECT_EQ(on_wgrad_stream, 0);
  }
  EXPECT_EQ(reloads, offload);
  // The deferred optimizer: one update per unit in the forward, none at the end; one copy back per
  // unit on the host but two (the tiny Llama's units: its layers, the embedding, the final norm,
  // the output).
  int deferred = 0, copied_back = 0, adamw_at_end = 0;
  for (const Step& st : dist->program().schedule.steps) {
    deferred += absl::StartsWith(st.name, "adamw (deferred) ") || absl::StartsWith(st.name, "adamw (deferred, host) ");
    copied_back += absl::StartsWith(st.name, "copy gradients back ");
    adamw_at_end += absl::StartsWith(st.name, "adamw (multi-tensor");
  }
  if (host_units > 0) {
    // The host units' copies back and updates are all issued at the step's start, before the first
    // gather (the copies run ahead of the forward); the comm stream waits for each update later.
    bool gathered = false;
    int waits = 0;
    for (const Step& st : dist->program().schedule.steps) {
      gathered = gathered || absl::StartsWith(st.name, "all-gather ");
      if (absl::StartsWith(st.name, "copy gradients back ") || absl::StartsWith(st.name, "adamw (deferred, host) ")) {
        EXPECT_FALSE(gathered) << st.name << " is issued after a gather";
      }
      if (absl::StartsWith(st.name, "wait adamw (deferred, host) ")) {
        EXPECT_EQ(st.stream, 1) << st.name;
        ++waits;
      }
    }
    EXPECT_EQ(waits, std::min(host_units, deferred));
    EXPECT_GT(deferred, 2);
    EXPECT_EQ(adamw_at_end, 0);
    // The first two host units in forward order are the last two in backward order, still in
    // their slots: updated from there, not copied back (when there are more than two).
    const int host = std::min(host_units, deferred);
    EXPECT_EQ(copied_back, host > 2 ? host - 2 : host);
    EXPECT_TRUE(absl::StrContains(dist->explanation(), "AdamW deferred into the next forward, the gradient shards of "))
        << dist->explanation();
    if (device.is_cuda() && copied_back > 0) {  // a replayed graph would run the copies behind the forward
      EXPECT_TRUE(absl::StrContains(dist->explanation(), "eager (the host units' copies back overlap the forward"))
          << dist->explanation();
    }
  } else {
    EXPECT_EQ(deferred + copied_back, 0);
    EXPECT_EQ(adamw_at_end, 1);
  }

  cmp.part = rank;
  cmp.parts = world;
  cmp.rank = rank;
  cmp.print_errors = cuda || bf16;
  if (!testing::CompareSteps(d, *ref, *dist, cmp)) return;

  // The trace: collectives on the comm stream and the exposed-communication share.
  auto trace = dist->TraceStep(testing::Views(testing::Rows(d.batches[0], rank, world)));
  ASSERT_TRUE(trace.ok()) << trace.status();
  int collectives = 0;
  for (const TraceEvent& e : trace->events) {
    if (e.category == "collective") {
      ++collectives;
      EXPECT_EQ(e.stream, 1) << e.name;
    }
  }
  EXPECT_GE(collectives, 3);
  const TraceSummary sum = Summarize(*trace);
  EXPECT_GT(sum.comm_us, 0);
  if (!cuda) {
    EXPECT_GT(sum.exposed_comm_share(), 0);  // the CPU runs both streams on one thread
  }
  if (rank == 0) std::cout << SummaryLine(*trace) << "\n";
  // Rank 0 hosts the store: it waits here for every rank, so a sub-group still in its last
  // collective keeps the store (one run in 16 lost it: "Connection reset by peer").
  auto ctx = DistContext::FromEnv(device, {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_TRUE((*ctx)->Finalize(absl::Now() + absl::Seconds(30)).ok());
}

TEST(Workers, DISABLED_Fsdp) { CompareWithSingleProcess(Strategy::kFsdp, {}); }
TEST(Workers, DISABLED_HybridShard) { CompareWithSingleProcess(Strategy::kHybridShard, {2, 2}); }
TEST(Workers, DISABLED_Auto) { CompareWithSingleProcess(Strategy::kAuto, {}); }
TEST(Workers, DISABLED_FsdpBf16) { CompareWithSingleProcess(Strategy::kFsdp, {}, false, /*bf16=*/true); }
TEST(Workers, DISABLED_HybridShardBf16) {
  CompareWithSingleProcess(Strategy::kHybridShard, {2, 2}, false, /*bf16=*/true);
}
TEST(Workers, DISABLED_FsdpCuda) { CompareWithSingleProcess(Strategy::kFsdp, {}, /*cuda=*/true); }
TEST(Workers, DISABLED_FsdpBf16Gradients) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, false, /*bf16=*/true, false, 0, false, 0, /*bf16_grads=*/true);
}
TEST(Workers, DISABLED_FsdpPerParameterBf16Gradients) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, false, /*bf16=*/true, /*per_parameter=*/true, 0, false, 0,
                           /*bf16_grads=*/true);
}
TEST(Workers, DISABLED_HybridShardBf16Gradients) {
  CompareWithSingleProcess(Strategy::kHybridShard, {2, 2}, false, /*bf16=*/true, false, 0, false, 0,
                           /*bf16_grads=*/true);
}
TEST(Workers, DISABLED_FsdpHostGradientsBf16Gradients) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, false, /*bf16=*/true, false, 0, false, /*host_units=*/3,
                           /*bf16_grads=*/true);
}
TEST(Workers, DISABLED_FsdpBf16GradientsCuda) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, /*cuda=*/true, false, false, 0, false, 0, /*bf16_grads=*/true);
}
TEST(Workers, DISABLED_FsdpPerParameter) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, false, false, /*per_parameter=*/true);
}
TEST(Workers, DISABLED_FsdpOffload) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, false, false, /*per_parameter=*/true, /*offload=*/3);
}
TEST(Workers, DISABLED_FsdpOffloadCuda) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, /*cuda=*/true, false, /*per_parameter=*/true, /*offload=*/3);
}
TEST(Workers, DISABLED_FsdpWgrad) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, false, false, false, 0, /*wgrad=*/true);
}
TEST(Workers, DISABLED_FsdpWgradCuda) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, /*cuda=*/true, false, false, 0, /*wgrad=*/true);
}
// An even count of host units puts each in another slot in the forward than in the backward
// (with an odd count, both orders give every unit the same slot).
TEST(Workers, DISABLED_FsdpHostGradients) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, false, false, false, 0, false, /*host_units=*/4);
}
TEST(Workers, DISABLED_HybridShardHostGradients) {
  CompareWithSingleProcess(Strategy::kHybridShard, {2, 2}, false, false, false, 0, false, /*host_units=*/4);
}
TEST(Workers, DISABLED_FsdpHostGradientsBf16) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, false, /*bf16=*/true, false, 0, false, /*host_units=*/3);
}
TEST(Workers, DISABLED_FsdpHostGradientsOffload) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, false, false, /*per_parameter=*/true, /*offload=*/3, false,
                           /*host_units=*/6);
}
TEST(Workers, DISABLED_FsdpHostGradientsCuda) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, /*cuda=*/true, false, /*per_parameter=*/true, /*offload=*/3, false,
                           /*host_units=*/6);
}
TEST(Workers, DISABLED_FsdpPerParameterCuda) {
  CompareWithSingleProcess(Strategy::kFsdp, {}, /*cuda=*/true, false, /*per_parameter=*/true);
}

// Rank 1 leaves after the first step; rank 0's second step must fail (not hang) naming it.
TEST(Workers, DISABLED_DeadRank) {
  const int rank = int(comm::testing::EnvInt("RANK", 0));
  testing::StepData d = MakeData();
  CompileOptions o;
  o.strategy = Strategy::kFsdp;
  o.comm_timeout_s = 10;
  o.binding = {{"batch", kGlobalBatch / 2}, {"seq", kSeq}};
  std::unique_ptr<CompiledStep> step = testing::CompileAndInit(d, o, kLr);
  ASSERT_NE(step, nullptr);
  auto mine = testing::Rows(d.batches[0], rank, 2);
  ASSERT_TRUE(step->Run(testing::Views(mine)).ok());
  ASSERT_TRUE(step->ReadMetrics().ok());
  if (rank == 1) std::_Exit(0);  // dies without a word (exit 0 so the supervisor keeps rank 0)
  absl::Status st = step->Run(testing::Views(mine));
  if (st.ok()) st = step->ReadMetrics().status();
  ASSERT_FALSE(st.ok()) << "the step succeeded without rank 1";
  std::cout << "rank 0 failed as expected: " << st << "\n";
  EXPECT_NE(std::string(st.message()).find("rank 1"), std::string::npos) << st;
}

TEST(DistributedTest, FsdpOnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_Fsdp", {SeedEnv()}, absl::Seconds(100));
}

// The memory form the 7b takes (ChooseRecompute when full recompute alone does not fit): each
// parameter gathered and reduce-scattered on its own, in place.
TEST(DistributedTest, FsdpPerParameterOnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpPerParameter", {SeedEnv()}, absl::Seconds(100));
}

// ... and with kept activations offloaded to host memory (full recompute), the 7b's form since
// 2026-11-30 evening: the copies on their own stream must not change a bit of the step.
TEST(DistributedTest, FsdpOffloadOnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpOffload", {SeedEnv()}, absl::Seconds(100));
}

// Weight-gradient matmuls on their own stream, joined before each unit's reduce-scatter.
TEST(DistributedTest, FsdpWgradStreamOnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpWgrad", {SeedEnv()}, absl::Seconds(100));
}

// AdamW deferred into the next step's forward with gradient shards in host memory
// (CompileOptions::fsdp_host_gradient_units): bucketed units in f32 (the reduce-scatter stages
// through the block), in bf16 (it writes straight into the slot), and the 7b's form (per-parameter
// collectives, offloaded activations, 6 of 9 units on the host, so both slots are reused).
TEST(DistributedTest, FsdpHostGradientsOnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpHostGradients", {SeedEnv()}, absl::Seconds(100));
}
TEST(DistributedTest, FsdpHostGradientsInBf16OnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpHostGradientsBf16", {SeedEnv()}, absl::Seconds(100));
}
TEST(DistributedTest, FsdpHostGradientsWithOffloadOnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpHostGradientsOffload", {SeedEnv()}, absl::Seconds(100));
}

// ... and on a 2 x 2 HYBRID_SHARD mesh (each unit's gradients all-reduced over the replicas before
// its norm and its copy to the host).
TEST(DistributedTest, HybridShardHostGradientsOn2x2MeshEqualsOneProcess) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_HybridShardHostGradients", {SeedEnv()}, absl::Seconds(100));
}

TEST(DistributedTest, HybridShardOn2x2MeshEqualsOneProcess) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_HybridShard", {SeedEnv()}, absl::Seconds(100));
}

// bf16 mixed precision: parameters gathered in bf16 (compiler/data_parallel_graph.h's
// GatherInComputeDType) against the single process, which casts its f32 masters per use.
TEST(DistributedTest, FsdpInBf16OnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpBf16", {SeedEnv()}, absl::Seconds(100));
}

// bf16 gradients (CompileOptions::bf16_gradients): bf16 buckets reduce-scattered into f32 shards
// (summed in f32), bucketed, per parameter, with the deferred optimizer, and over a 2 x 2 mesh,
// against the single process keeping its matmul gradients in bf16.
TEST(DistributedTest, FsdpBf16GradientsOnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpBf16Gradients", {SeedEnv()}, absl::Seconds(100));
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpPerParameterBf16Gradients", {SeedEnv()}, absl::Seconds(100));
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpHostGradientsBf16Gradients", {SeedEnv()}, absl::Seconds(100));
}
TEST(DistributedTest, HybridShardBf16GradientsOn2x2MeshEqualsOneProcess) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_HybridShardBf16Gradients", {SeedEnv()}, absl::Seconds(100));
}

TEST(DistributedTest, HybridShardInBf16On2x2MeshEqualsOneProcess) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_HybridShardBf16", {SeedEnv()}, absl::Seconds(100));
}

TEST(DistributedTest, AutoOnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_Auto", {SeedEnv()}, absl::Seconds(100));
}

// GPU: FSDP on 2 GPUs (NCCL device transport, collectives on the comm stream) vs 1 GPU.
TEST(DistributedTest, FsdpOnTwoGpusEqualsOneGpu) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpCuda", {SeedEnv()}, absl::Seconds(120));
}

// ... with bf16 gradients: the IPC reduce-scatter reads the bf16 buckets over NVLink and sums them in
// f32 into the shards (comm/ipc_kernels.cu's widening pull-reduce).
TEST(DistributedTest, FsdpBf16GradientsOnTwoGpusEqualsOneGpu) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpBf16GradientsCuda", {SeedEnv()}, absl::Seconds(120));
}

TEST(DistributedTest, FsdpPerParameterOnTwoGpusEqualsOneGpu) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpPerParameterCuda", {SeedEnv()}, absl::Seconds(120));
}

TEST(DistributedTest, FsdpOffloadOnTwoGpusEqualsOneGpu) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpOffloadCuda", {SeedEnv()}, absl::Seconds(120));
}

TEST(DistributedTest, FsdpHostGradientsOnTwoGpusEqualsOneGpu) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpHostGradientsCuda", {SeedEnv()}, absl::Seconds(120));
}

// The deferred optimizer's CUDA mechanics (copies to and from pinned memory on their own stream,
// the unit norms on the comm stream, the CUDA graph) on one GPU: FSDP over a group of one.
TEST(DistributedTest, FsdpHostGradientsOnOneGpuEqualsSingleDevice) {
  SG_SKIP_WITHOUT_CUDA();
  testing::ExpectWorkersPass(1, "Workers.DISABLED_FsdpHostGradientsCuda", {SeedEnv()}, absl::Seconds(120));
}

// ... and its CPU twin: the group of one takes the same path.
TEST(DistributedTest, FsdpHostGradientsOnOneRankEqualsOneProcess) {
  testing::ExpectWorkersPass(1, "Workers.DISABLED_FsdpHostGradientsOffload", {SeedEnv()}, absl::Seconds(100));
}

TEST(DistributedTest, FsdpWgradStreamOnTwoGpusEqualsOneGpu) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpWgradCuda", {SeedEnv()}, absl::Seconds(120));
}

TEST(DistributedTest, DeadRankFailsTheOthersWithAClearError) {
  auto run = comm::testing::RunWorkers(2, "Workers.DISABLED_DeadRank", {SeedEnv()}, absl::Seconds(60));
  ASSERT_FALSE(run.timed_out) << run.Summary();
  ASSERT_EQ(run.exit_codes.size(), 2u);
  EXPECT_EQ(run.exit_codes[0], 0) << run.Summary();
  EXPECT_NE(run.outputs[0].find("[  PASSED  ] 1 test."), std::string::npos) << run.Summary();
  std::cout << run.outputs[0];
}

// Tensor parallelism has its own tests (compiler/tensor_parallel_test.cc).
TEST(DistributedTest, WithoutLauncherVariablesFailsClearly) {
  auto g = testing::TinyLlama({});
  ASSERT_TRUE(g.ok());
  CompileOptions o;
  o.strategy = Strategy::kTensorParallel;
  o.binding = {{"batch", 2}, {"seq", 8}};
  // Without launcher variables the context cannot be set up: a clear error, no hang.
  auto step = Compile(*g, o);
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kNotFound) << step.status();
  std::cout << step.status() << "\n";
}

}  // namespace
}  // namespace sg::compiler
