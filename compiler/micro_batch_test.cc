// Gradient accumulation (CompileOptions::micro_batches) against one pass over the whole batch, on
// the CPU: one device (kNone) with 4 micro-batches, and FSDP on 2 real processes with 4
// micro-batches each, both compared with the single-process, single-pass step on the whole batch:
// the loss, the gradient norm and EVERY gradient after one step, every parameter after 3 steps.
// The micro-batches hold different numbers of non-ignored tokens, so the per-micro-batch loss
// weights matter. Tolerance: f32 sums in another order: 2e-5 on loss and norm, 1e-4 elsewhere.
// GPU (skipped without one): the same on 1 GPU and FSDP on 2 GPUs, bf16 mixed precision.
#include <cstdlib>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/multiprocess_testing.h"
#include "compiler/compile.h"
#include "compiler/testing/step_compare.h"
#include "compiler/testing/tiny_llama.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::compiler {
namespace {

constexpr int64_t kSeq = 8, kSteps = 3, kMicro = 4;

// The same in every process: seeded from SG_MB_SEED (the parent's random seed). The CUDA model
// has the CUDA kernels' shapes and small matrices.
testing::StepData MakeData(int64_t batch, bool cuda = false) {
  const uint64_t seed = uint64_t(comm::testing::EnvInt("SG_MB_SEED", int64_t(sg::testing::Rng()())));
  testing::TinyLlamaConfig c;
  c.ffn = 25;  // uneven FSDP chunks over 2 ranks
  if (cuda) c = testing::WithCudaKernelShapes(c);
  testing::StepDataOptions o(kSteps, batch, kSeq, c.vocab);
  // Ignored tokens in the second row only: micro-batches (rows) count different token numbers.
  o.ignored_targets = {size_t(kSeq), size_t(kSeq + 1), size_t(kSeq + 2)};
  o.small_matrices = cuda;
  return testing::MakeStepData(*testing::TinyLlama(c), seed, o);
}

// testing::CompileAndInit with every blocking wait of the step bounded.
std::unique_ptr<CompiledStep> CompileAndInit(const testing::StepData& d, CompileOptions o) {
  o.comm_timeout_s = 30;
  return testing::CompileAndInit(d, o, testing::LrFor(o.device));
}

// `strategy` with kMicro micro-batches per rank of `world` vs one process, one pass, whole batch.
// CUDA: GPU `rank`, bf16 mixed precision on both sides; GEMMs at other M may pick other cuBLASLt
// algorithms (bf16 roundings flip), and attention's dq uses atomics: bf16-level agreement.
void CompareWithWholeBatch(Strategy strategy, bool cuda = false) {
  const int rank = int(comm::testing::EnvInt("RANK", 0)), world = int(comm::testing::EnvInt("WORLD_SIZE", 1));
  const int64_t whole = kMicro * world;  // micro-batches of one row
  testing::StepData d = MakeData(whole, cuda);
  CompileOptions ref_opt;
  ref_opt.device = cuda ? Device::Cuda(rank) : Device::Cpu();
  ref_opt.precision = cuda ? Precision::kBF16Mixed : Precision::kF32;
  ref_opt.binding = {{"batch", whole}, {"seq", kSeq}};
  std::unique_ptr<CompiledStep> ref = CompileAndInit(d, ref_opt);
  CompileOptions mb_opt = ref_opt;
  mb_opt.strategy = strategy;
  mb_opt.micro_batches = kMicro;
  mb_opt.binding = {{"batch", whole / world}, {"seq", kSeq}};
  std::unique_ptr<CompiledStep> mb = CompileAndInit(d, mb_opt);
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(mb, nullptr);
  if (rank == 0) std::cout << mb->explanation() << "\n";
  int micro_steps = 0;
  for (const Step& s : mb->program().schedule.steps) micro_steps += absl::StrContains(s.name, "loss seed");
  EXPECT_EQ(micro_steps, kMicro) << "one forward + backward per micro-batch";

  testing::StepCompare cmp;
  if (cuda) cmp.tol = testing::Bf16StepTolerances();
  cmp.part = rank;
  cmp.parts = world;
  cmp.rank = rank;
  cmp.step_count_note = "one optimizer update per step, not per micro-batch";
  testing::CompareSteps(d, *ref, *mb, cmp);
}

TEST(MicroBatchTest, OneDeviceFourMicroBatchesEqualOneWholeBatchStep) { CompareWithWholeBatch(Strategy::kNone); }

TEST(Workers, DISABLED_FsdpMicroBatches) { CompareWithWholeBatch(Strategy::kFsdp); }

TEST(MicroBatchTest, FsdpTwoRanksFourMicroBatchesEqualOneWholeBatchStep) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpMicroBatches",
                             {absl::StrCat("SG_MB_SEED=", sg::testing::Rng()())}, absl::Seconds(100));
}

TEST(MicroBatchTest, OneGpuFourMicroBatchesEqualOneWholeBatchStep) {
  SG_SKIP_WITHOUT_CUDA();
  CompareWithWholeBatch(Strategy::kNone, /*cuda=*/true);
}

TEST(Workers, DISABLED_FsdpMicroBatchesCuda) { CompareWithWholeBatch(Strategy::kFsdp, /*cuda=*/true); }

TEST(MicroBatchTest, FsdpTwoGpusFourMicroBatchesEqualOneWholeBatchStep) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  testing::ExpectWorkersPass(2, "Workers.DISABLED_FsdpMicroBatchesCuda",
                             {absl::StrCat("SG_MB_SEED=", sg::testing::Rng()())}, absl::Seconds(120));
}

TEST(MicroBatchTest, BadMicroBatchCountsAreClearErrors) {
  testing::StepData d = MakeData(4);
  CompileOptions o;
  o.binding = {{"batch", 4}, {"seq", kSeq}};
  o.micro_batches = 3;
  auto step = Compile(d.forward, o);
  ASSERT_FALSE(step.ok());
  EXPECT_NE(std::string(step.status().message()).find("not a multiple of micro_batches=3"), std::string::npos)
      << step.status();
  o.micro_batches = 0;
  EXPECT_FALSE(Compile(d.forward, o).ok());
  // Run takes the whole batch: a micro-batch-sized input is refused naming both shapes.
  o.micro_batches = 2;
  std::unique_ptr<CompiledStep> ok = CompileAndInit(d, o);
  ASSERT_NE(ok, nullptr);
  absl::Status st = ok->Run(testing::Views(testing::Rows(d.batches[0], 0, 2)));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("2 micro-batches of [2,8]"), std::string::npos) << st;
}

}  // namespace
}  // namespace sg::compiler
