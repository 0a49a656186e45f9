// Pipeline parallelism through Compile on real processes (localhost, CPU, UCX) against the
// single-process step on the whole batch: loss, gradient norm and every gradient after one step,
// every parameter after 3 steps, for 2 stages x 4 micro-batches and 4 stages x 3 micro-batches
// (an ignored target makes the micro-batch losses unequally weighted). Also the graph split: the
// stages' forwards chained through the interpreter give the whole graph's loss.
#include <random>

#include "absl/strings/str_cat.h"
#include "comm/multiprocess_testing.h"
#include "compiler/compile.h"
#include "compiler/dist_context.h"
#include "compiler/llama_step.h"
#include "compiler/training_graph.h"
#include "compiler/pipeline/graph_split.h"
#include "compiler/pipeline/pp_step.h"
#include "compiler/testing/step_compare.h"
#include "compiler/testing/tiny_llama.h"
#include "graph/interpreter.h"
#include "gtest/gtest.h"
#include "kernels/core/testing.h"

namespace sg::compiler {
namespace {

using graph::Feeds;

constexpr int64_t kSteps = 3, kSeq = 7;

std::string SeedEnv() { return absl::StrCat("SG_PP_SEED=", sg::testing::Rng()()); }

// cuda: the CUDA kernels' shapes.
testing::TinyLlamaConfig Config(bool cuda = false) {
  testing::TinyLlamaConfig c;
  c.layers = 4;
  return cuda ? testing::WithCudaKernelShapes(c) : c;
}

// cuda: matrices scaled down so bf16 logits stay moderate.
testing::StepData MakeData(int64_t batch, bool cuda = false) {
  testing::StepDataOptions o(kSteps, batch, kSeq, Config(cuda).vocab);
  o.ignored_targets = {0, 1, 2};  // micro-batch 0 has fewer tokens
  o.small_matrices = cuda;
  return testing::MakeStepData(*testing::TinyLlama(Config(cuda)), uint64_t(comm::testing::EnvInt("SG_PP_SEED", 1)), o);
}

// `batch` is the global batch; mesh {dp, pp} gives each replica batch/dp of it.
// cuda: each rank uses GPU `rank` for its stage and the single-GPU reference, bf16 mixed precision.
// fsdp: each stage's parameters sharded over the dp dim (CompileOptions::pipeline_fsdp).
void CompareWithSingleProcess(int64_t batch, int micro, std::vector<int64_t> mesh = {}, bool cuda = false,
                              bool fsdp = false) {
  const int rank = int(comm::testing::EnvInt("RANK", 0)), world = int(comm::testing::EnvInt("WORLD_SIZE", 1));
  const int dp = mesh.size() == 2 ? int(mesh[0]) : 1, pp_size = world / dp;
  const Device device = cuda ? Device::Cuda(rank) : Device::Cpu();
  const Precision precision = cuda ? Precision::kBF16Mixed : Precision::kF32;
  testing::StepData d = MakeData(batch, cuda);
  CompileOptions ref_opt;
  ref_opt.device = device;
  ref_opt.precision = precision;
  ref_opt.binding = {{"batch", batch}, {"seq", kSeq}};
  std::unique_ptr<CompiledStep> ref = testing::CompileAndInit(d, ref_opt, testing::LrFor(device));
  CompileOptions o;
  o.strategy = Strategy::kPipeline;
  o.device = device;
  o.precision = precision;
  o.micro_batches = micro;
  o.mesh = mesh;
  o.pipeline_fsdp = fsdp;
  o.comm_timeout_s = 30;
  o.binding = {{"batch", batch / dp}, {"seq", kSeq}};
  std::unique_ptr<CompiledStep> dist = testing::CompileAndInit(d, o, testing::LrFor(device));
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(dist, nullptr);
  std::cout << dist->explanation() << "\n";
  auto* pp = dynamic_cast<PipelineStep*>(dist.get());
  ASSERT_NE(pp, nullptr);
  EXPECT_EQ(pp->stage(), rank % pp_size);
  EXPECT_LT(dist->parameter_names().size(), ref->parameter_names().size()) << "each stage holds a slice";
  int64_t stage_elements = 0;
  for (const std::string& name : dist->parameter_names()) {
    auto v = ref->View(name);
    ASSERT_TRUE(v.ok()) << v.status();
    stage_elements += v->numel();
  }
  // Every parameter row splits evenly over 2 in the tiny model: the moments are exactly 1/dp.
  EXPECT_EQ(pp->optimizer_state_elements(), 2 * stage_elements / (fsdp ? dp : 1));
  EXPECT_EQ(pp->device_transfers(), cuda) << "device to device exactly on CUDA";

  testing::StepCompare cmp;
  if (cuda) {
    cmp.tol = testing::Bf16StepTolerances();
    // Four micro-batches of one sequence run the GEMMs at another M than the one-pass reference, so
    // cuBLASLt may pick other algorithms and bf16 roundings flip; AdamW's first, normalized step
    // carries the flips into the second step's loss and gradient norm. H200, 2026-11-30, seed
    // 5025775103667804482: step 1's gradient norm 0.22% off (Bf16StepTolerances allows 0.2%), as
    // distributed_test's FSDP case sees 0.4% on some seeds (that file's tolerance). Replayed at 15:16
    // on the binary from before that day's memory changes: the same 5.6234 against 5.6360, so the
    // difference is the data's, not a regression. A lost or doubled micro-batch
    // moves the norm by tens of percent.
    cmp.tol.scalar = 5e-3;
  } else {
    // Micro-batches and replicas add the gradients in another order than one pass, and AdamW's
    // first steps (m / sqrt(v) ~ sign(g)) magnify those f32 differences in near-zero gradient
    // elements. The f32 defaults failed on some seeds before FSDP and device transfers existed
    // (whole binary, SG_TEST_SEED=6113420819339014640: a parameter 1.2e-4 off after 3 steps, both
    // with 2 stages and with 2 replicas), and the sharded run gives the replicated run's numbers
    // bit for bit (SG_TEST_SEED=14927320950215591828: grad norm 3.5e-5 off at step 1 in both).
    cmp.tol.scalar = 1e-4;
    cmp.tol.param = 5e-4;
  }
  cmp.part = rank / pp_size;
  cmp.parts = dp;
  cmp.rank = rank;
  cmp.after_step = [&](int) { EXPECT_EQ(pp->last_actions().size(), size_t(2 * micro)); };
  if (!testing::CompareSteps(d, *ref, *dist, cmp)) return;

  // Rank 0 hosts the store: it waits for every rank before exiting.
  auto ctx = DistContext::FromEnv(device, {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_TRUE((*ctx)->Finalize(absl::Now() + absl::Seconds(30)).ok());
}

TEST(Workers, DISABLED_Pp2) { CompareWithSingleProcess(4, 4); }
TEST(Workers, DISABLED_Pp4) { CompareWithSingleProcess(6, 3); }
TEST(Workers, DISABLED_DpPp) { CompareWithSingleProcess(4, 2, {2, 2}); }
TEST(Workers, DISABLED_DpPpFsdp) { CompareWithSingleProcess(8, 4, {2, 2}, /*cuda=*/false, /*fsdp=*/true); }
TEST(Workers, DISABLED_Pp2Cuda) { CompareWithSingleProcess(4, 4, {}, /*cuda=*/true); }
TEST(Workers, DISABLED_DpPpFsdpCuda) { CompareWithSingleProcess(8, 4, {2, 2}, /*cuda=*/true, /*fsdp=*/true); }

TEST(PpStepTest, TwoStagesFourMicroBatchesEqualOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_Pp2", {SeedEnv()}, absl::Seconds(100));
}

TEST(PpStepTest, FourStagesThreeMicroBatchesEqualOneProcess) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_Pp4", {SeedEnv()}, absl::Seconds(100));
}

// 2 replicas of a 2-stage pipeline (4 processes): gradients all-reduced per stage, the micro-batch
// weights counting both replicas' tokens (replica 0 has the ignored targets).
TEST(PpStepTest, TwoReplicasOfTwoStagesEqualOneProcess) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_DpPp", {SeedEnv()}, absl::Seconds(100));
}

// FSDP inside the stages: mesh {dp 2, pp 2} on 4 processes, 4 micro-batches per replica; every
// stage's parameters, moments and reduced gradients sharded by rows over its 2 replicas, gathered
// once per step (reads gather them too); replica 0 has the ignored targets. Uneven row splits are
// ShardBucket's test (compiler/shard_bucket_test.cc).
TEST(PpStepTest, TwoStagesShardedOverTwoReplicasEqualOneProcess) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_DpPpFsdp", {SeedEnv()}, absl::Seconds(100));
}

// GPU: 2 stages on 2 GPUs (bf16 mixed, activations and gradients sent device to device over NCCL,
// no host sync in the schedule) vs 1 GPU. Skips without 2 GPUs.
TEST(PpStepTest, TwoGpuStagesEqualOneGpu) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  testing::ExpectWorkersPass(2, "Workers.DISABLED_Pp2Cuda", {SeedEnv()}, absl::Seconds(200));
}

// GPU: {dp 2, pp 2} with FSDP inside the stages on 4 GPUs (device transfers, device collectives
// over each stage's dp pair) vs 1 GPU. Skips without 4 GPUs.
TEST(PpStepTest, FourGpusShardedStagesEqualOneGpu) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 4) GTEST_SKIP() << "needs 4 GPUs, found " << CudaDeviceCount();
  testing::ExpectWorkersPass(4, "Workers.DISABLED_DpPpFsdpCuda", {SeedEnv()}, absl::Seconds(200));
}

// The split alone: chaining the stages' forwards reproduces the whole graph's loss.
TEST(GraphSplitTest, ChainedStagesGiveTheWholeLoss) {
  std::mt19937_64 rng(sg::testing::Rng()());
  auto g = testing::TinyLlama(Config());
  ASSERT_TRUE(g.ok());
  Feeds params = testing::RandomParameters(*g, rng);
  Feeds batch = testing::RandomBatch(2, 5, Config().vocab, rng);
  Feeds all = params;
  for (auto& [k, v] : batch) all[k] = v;
  auto whole = graph::Interpret(*g, all);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (int stages : {1, 2, 3, 4}) {
    auto split = SplitIntoStages(*g, stages);
    ASSERT_TRUE(split.ok()) << split.status();
    ASSERT_EQ(split->size(), size_t(stages));
    graph::HostTensor h;
    size_t params_seen = 0;
    for (const StageGraph& s : *split) {
      params_seen += s.parameters.size();
      Feeds f = all;
      if (!s.spec.first()) f[kStageInput] = h;
      auto out = graph::Interpret(s.forward, f);
      ASSERT_TRUE(out.ok()) << out.status();
      if (!s.spec.last()) {
        h = out->at(kStageOutput);
      } else {
        EXPECT_NEAR(out->at("loss").data[0], whole->at("loss").data[0], 1e-12) << stages << " stages";
      }
    }
    EXPECT_EQ(params_seen, params.size()) << "every parameter on exactly one stage";
  }
  EXPECT_FALSE(SplitIntoStages(*g, 5).ok()) << "more stages than layers";
}

// The 124m model's stage programs in bf16 mixed precision lower onto CUDA kernels only (planning:
// nothing allocated), with no helper op left from the cotangent seeding.
TEST(GraphSplitTest, StageProgramsOf124mLowerOntoCudaKernels) {
  auto c = LlamaBenchConfigNamed("124m");
  ASSERT_TRUE(c.ok());
  auto fwd = graph::BuildLlamaForward(c->model);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  auto mixed = ToMixedPrecision(*fwd);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  auto split = SplitIntoStages(*mixed, 4);
  ASSERT_TRUE(split.ok()) << split.status();
  for (const StageGraph& s : *split) {
    auto step = PrepareStageStep(s, /*fuse=*/true);
    ASSERT_TRUE(step.ok()) << step.status();
    for (const graph::Node& n : step->nodes()) {
      EXPECT_NE(n.op, graph::OpKind::kReduceSum) << "stage " << s.spec.stage << ": helper vjp node left";
    }
    EXPECT_GE(step->FindOutput("grad:" + s.parameters[0]), 0);
    EXPECT_EQ(step->FindOutput("grad:h_in") >= 0, !s.spec.first());
    auto plan = PlanStepMemory(*step, {{"batch", 1}, {"seq", 1024}}, Device::Cuda(0));
    ASSERT_TRUE(plan.ok()) << "stage " << s.spec.stage << ": " << plan.status();
    EXPECT_EQ(plan->impls.count("reference"), 0u) << "stage " << s.spec.stage;
  }
}

}  // namespace
}  // namespace sg::compiler
