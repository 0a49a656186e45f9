// Context parallelism through Compile on real processes (localhost, CPU, UCX) against the
// single-process step on the same batch: the loss, the gradient norm and every gradient after one
// step, every parameter after 3 steps. cp = 2 and cp = 4 with causal attention and an odd
// sequence length (uneven layout chunks: ranks hold different row counts), and a 2x2 {dp, cp}
// mesh with parameters ZeRO-3 sharded over all four ranks (FSDP x CP). Tolerance: f32 kernels
// summing in another order (merged attention blocks, ring reductions).
#include "absl/strings/str_cat.h"
#include "comm/multiprocess_testing.h"
#include "compiler/compile.h"
#include "compiler/dist_context.h"
#include "compiler/context_parallel/cp_step.h"
#include "compiler/testing/step_compare.h"
#include "compiler/testing/tiny_llama.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::compiler {
namespace {

constexpr int64_t kSteps = 3;

std::string SeedEnv() { return absl::StrCat("SG_CP_SEED=", sg::testing::Rng()()); }

// cuda: the CUDA kernels' shapes, matrices scaled down so bf16 logits stay moderate.
testing::StepData MakeData(int64_t batch, int64_t seq, bool cuda = false) {
  testing::TinyLlamaConfig c;
  c.heads = 4;
  c.kv_heads = 2;
  if (cuda) c = testing::WithCudaKernelShapes(c);
  testing::StepDataOptions o(kSteps, batch, seq, c.vocab);
  o.ignored_targets = {2};  // an ignored token: the global mean counts tokens
  o.small_matrices = cuda;
  return testing::MakeStepData(*testing::TinyLlama(c), uint64_t(comm::testing::EnvInt("SG_CP_SEED", 1)), o);
}

// On every rank of the job: mesh {cp} or {dp, cp}; batch is the global batch.
// cuda: each rank uses GPU `rank` for both its share and the single-GPU reference, in bf16 mixed
// precision (bf16-level agreement, as compiler/distributed_test's GPU case).
void CompareWithSingleProcess(std::vector<int64_t> mesh, int64_t batch, int64_t seq, bool fsdp,
                              RecomputePolicy recompute = RecomputePolicy::kNone, bool cuda = false) {
  const int rank = int(comm::testing::EnvInt("RANK", 0));
  const int dp = mesh.size() == 2 ? int(mesh[0]) : 1, cp = int(mesh.back());
  const int dp_rank = rank / cp;
  const Device device = cuda ? Device::Cuda(rank) : Device::Cpu();
  const Precision precision = cuda ? Precision::kBF16Mixed : Precision::kF32;
  testing::StepData d = MakeData(batch, seq, cuda);
  CompileOptions ref_opt;
  ref_opt.device = device;
  ref_opt.precision = precision;
  ref_opt.binding = {{"batch", batch}, {"seq", seq}};
  std::unique_ptr<CompiledStep> ref = testing::CompileAndInit(d, ref_opt, testing::LrFor(device));
  CompileOptions o;
  o.strategy = Strategy::kContextParallel;
  o.device = device;
  o.precision = precision;
  o.mesh = mesh;
  o.context_parallel_fsdp = fsdp;
  o.recompute = recompute;
  o.comm_timeout_s = 30;
  o.binding = {{"batch", batch / dp}, {"seq", seq}};
  std::unique_ptr<CompiledStep> dist = testing::CompileAndInit(d, o, testing::LrFor(device));
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(dist, nullptr);
  if (rank == 0) std::cout << dist->explanation() << "\n";
  int ring_steps = 0;
  for (const Step& st : dist->program().schedule.steps) ring_steps += st.impl == "ring";
  // Every attention forward and backward of the 2 layers goes around the ring (full recompute: the
  // attention forward once more in the backward).
  EXPECT_EQ(ring_steps, recompute == RecomputePolicy::kFull ? 2 * 3 : 2 * 2);

  testing::StepCompare cmp;
  if (cuda) cmp.tol = testing::Bf16StepTolerances();
  // f32 on the CPU: the ring adds the attention blocks in another order than one pass, and AdamW's
  // first, normalized steps carry those differences into later losses and gradient norms; the
  // full-recompute run once put a gradient norm 2.47e-5 off (2026-11-30, seed not kept), above the
  // 2e-5 default. 2e-4, as distributed_test's CPU comparisons, still catches a lost or doubled
  // block, which moves them by percents.
  if (!cuda) cmp.tol.scalar = 2e-4;
  cmp.part = dp_rank;
  cmp.parts = dp;
  cmp.rank = rank;
  if (!testing::CompareSteps(d, *ref, *dist, cmp)) return;

  // Rank 0 hosts the store: it waits for every rank before exiting.
  auto ctx = DistContext::FromEnv(device, {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_TRUE((*ctx)->Finalize(absl::Now() + absl::Seconds(30)).ok());
}

TEST(Workers, DISABLED_Cp2) { CompareWithSingleProcess({2}, 2, 13, false); }
TEST(Workers, DISABLED_Cp4) { CompareWithSingleProcess({4}, 2, 13, false); }
TEST(Workers, DISABLED_DpCpFsdp) { CompareWithSingleProcess({2, 2}, 2, 10, true); }
TEST(Workers, DISABLED_Cp2FullRecompute) { CompareWithSingleProcess({2}, 1, 11, false, RecomputePolicy::kFull); }
TEST(Workers, DISABLED_Cp2Cuda) {
  CompareWithSingleProcess({2}, 2, 1001, false, RecomputePolicy::kSelective, /*cuda=*/true);
}

TEST(CpStepTest, TwoRanksOddSequenceEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_Cp2", {SeedEnv()}, absl::Seconds(100));
}

TEST(CpStepTest, FourRanksOddSequenceEqualsOneProcess) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_Cp4", {SeedEnv()}, absl::Seconds(100));
}

TEST(CpStepTest, FullRecomputeRunsTheRingAgainInTheBackward) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_Cp2FullRecompute", {SeedEnv()}, absl::Seconds(100));
}

TEST(CpStepTest, FsdpTimesCpOn2x2MeshEqualsOneProcess) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_DpCpFsdp", {SeedEnv()}, absl::Seconds(100));
}

// GPU: context parallel over 2 GPUs (NCCL ring, bf16) vs 1 GPU, odd sequence, selective
// recompute (the trainer's GPU default). Skips without 2 GPUs.
TEST(CpStepTest, TwoGpusOddSequenceEqualOneGpu) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  testing::ExpectWorkersPass(2, "Workers.DISABLED_Cp2Cuda", {SeedEnv()}, absl::Seconds(200));
}

TEST(CpStepTest, NoLauncherIsAClearError) {
  auto g = testing::TinyLlama({});
  ASSERT_TRUE(g.ok());
  CompileOptions o;
  o.strategy = Strategy::kContextParallel;
  o.binding = {{"batch", 2}};
  auto step = Compile(*g, o);
  ASSERT_FALSE(step.ok());
  EXPECT_NE(std::string(step.status().message()).find("seq"), std::string::npos) << step.status();
}

}  // namespace
}  // namespace sg::compiler
