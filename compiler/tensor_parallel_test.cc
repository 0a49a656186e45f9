// Tensor-parallel Compile on real processes (localhost, CPU, UCX) against the single-process step
// on the same batch: the loss, the gradient norm and EVERY gradient (gathered to full shape) after
// one step, and every parameter after 3 steps, on 2 and 4 tp ranks, with full recompute, and on a
// 2x2 mesh (DDP x TP, and FSDP x TP: each tp slice sharded over the dp ranks, checked through the
// shard views). The vocabulary is split (embedding and LM head sharded, the cross-entropy on the
// logits shard) in all of them, also for a vocabulary 2 and 4 do not divide (uneven torch.chunk
// pieces) and a tied LM head. kAuto on a 2x2 mesh offers fsdp_tp. Each rank also checks its
// replicated gradients against the reference, so the tp ranks agree on them. Plus the per-rank
// graph itself (no processes): which weights split, how many all-reduces, the uneven vocabulary
// pieces, the logits memory the vocabulary split saves in the lowered plan, and the errors for
// heads that do not divide and a vocabulary too small. Tolerance: f32 kernels summing in another
// order (partial sums over ranks): relative 2e-5 on loss and norm, 1e-4 on gradients, 5e-4 on
// parameters after three steps (compiler/testing/step_compare.h says why).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "comm/multiprocess_testing.h"
#include "compiler/compile.h"
#include "compiler/data_parallel_graph.h"
#include "compiler/dist_context.h"
#include "compiler/distributed.h"
#include "compiler/tensor_parallel.h"
#include "compiler/tensor_parallel_fsdp.h"
#include "compiler/tensor_parallel_graph.h"
#include "compiler/testing/step_compare.h"
#include "compiler/testing/tiny_llama.h"
#include "graph/models/llama.h"
#include "gtest/gtest.h"
#include "kernels/core/status.h"
#include "kernels/core/testing.h"

namespace sg::compiler {
namespace {

constexpr int64_t kGlobalBatch = 4, kSeq = 8, kSteps = 3;

std::string SeedEnv() { return absl::StrCat("SG_DIST_SEED=", sg::testing::Rng()()); }

// 8 query heads over 4 key/value heads (GQA groups of 2), ffn 24: divisible by 2 and 4 ranks.
testing::TinyLlamaConfig TpConfig() {
  testing::TinyLlamaConfig c;
  c.dim = 32;
  c.heads = 8;
  c.kv_heads = 4;
  c.ffn = 24;
  return c;
}

// graph/models' Llama (separate residual adds, which fusion turns into add_rmsnorm and matmul
// epilogues): 4 query heads over 2 key/value heads, ffn 64.
graph::LlamaConfig ModelConfig() {
  graph::LlamaConfig c;
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 64;
  c.vocab = 32;
  c.dtype = DType::kF32;  // f32 master weights, as the compiler trains them
  return c;
}

// The same on every rank: seeded from the parent's random seed. `model`: graph/models' Llama
// instead of the compiler's tiny test model.
// The CUDA model has head_dim 64 and a vocabulary that is a multiple of 8 (the flash attention and
// cross-entropy kernels' bf16 cases) and matrices scaled down so bf16 logits stay moderate.
// `wide`: dim 512 and ffn 2048 (8M parameters) for a batch of a few tokens, where the planner's
// cost model prefers tensor parallelism (its traffic scales with activations, DDP's and FSDP's
// with parameters).
// `vocab` > 0 replaces the vocabulary; `tied`: the LM head is the embedding table.
testing::StepData MakeData(bool model = false, bool cuda = false, bool wide = false, bool small_weights = false,
                           int64_t vocab = 0, bool tied = false) {
  testing::TinyLlamaConfig c = TpConfig();
  if (vocab > 0) c.vocab = vocab;
  c.tied = tied;
  if (wide) {
    c.dim = 512;
    c.ffn = 2048;
  }
  if (cuda) {
    c.vocab = 64;
    c.dim = 256;
    c.heads = 4;
    c.kv_heads = 2;
    c.ffn = 256;
  }
  testing::StepDataOptions o(kSteps, kGlobalBatch, kSeq, c.vocab);
  o.ignored_targets = {1};  // an ignored token: a dp split must count tokens, not rows
  o.small_matrices = cuda || wide || small_weights;
  return testing::MakeStepData(model ? *graph::BuildLlamaForward(ModelConfig()) : *testing::TinyLlama(c),
                               uint64_t(comm::testing::EnvInt("SG_DIST_SEED", 1)), o);
}

// On every rank of a job: the tp step (mesh {} = tp over every rank, or {D, T}) vs the
// single-process step on the whole batch. The reference never recomputes. On CUDA each rank uses
// GPU `rank` for both, in bf16 mixed precision (f32 master weights and gradients).
// Every tp rank holds the same replicated gradients, bit for bit (they are computed from summed
// values every rank received identically), and its own slice of each split one.
void ExpectReplicatedGradientsAgree(CompiledStep& step) {
  auto* tp = dynamic_cast<TensorParallelStep*>(&step);
  ASSERT_NE(tp, nullptr);
  auto ctx = DistContext::FromEnv(step.program().device, {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const int world = (*ctx)->world_size();
  for (const TpParam& p : tp->tp_graph().params) {
    auto view = tp->View("grad:" + p.name);
    ASSERT_TRUE(view.ok()) << view.status();
    int64_t local = 1;
    for (int64_t d : p.local) local *= d;
    ASSERT_EQ(view->numel(), local) << p.name;
    if (p.dim >= 0) continue;
    std::vector<float> mine(static_cast<size_t>(local), 0.f), all(static_cast<size_t>(local * world), std::nanf(""));
    ASSERT_TRUE(tp->executor().Synchronize().ok());
    ASSERT_TRUE(CopyTensor(*view, TensorView(mine.data(), DType::kF32, {local}, Device::Cpu()),
                           tp->executor().compute_stream()).ok());
    ASSERT_TRUE(tp->executor().Synchronize().ok());
    ASSERT_TRUE((*ctx)->world().AllGather(TensorView(mine.data(), DType::kF32, {local}, Device::Cpu()),
                                          TensorView(all.data(), DType::kF32, {local * world}, Device::Cpu())).ok());
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(std::memcmp(all.data(), all.data() + r * local, size_t(local) * 4), 0)
          << "grad:" << p.name << " differs between tp ranks 0 and " << r;
    }
  }
}

struct Case {
  std::vector<int64_t> mesh;  // {}: tp over every rank; {D, T}: dp x tp
  RecomputePolicy recompute = RecomputePolicy::kNone;
  Strategy strategy = Strategy::kTensorParallel;
  bool model = false;  // graph/models' Llama instead of the tiny test model
  bool cuda = false;   // GPU `rank`, bf16 mixed precision
  bool bf16 = false;   // bf16 mixed precision on the CPU
  bool wide = false;   // MakeData's wide model
  int64_t vocab = 0;   // > 0: the tiny model's vocabulary
  bool tied = false;   // the tiny model's LM head is its embedding table
  bool fsdp = false;   // FSDP x TP (tensor_parallel_fsdp) on the 2-D mesh instead of DDP x TP
};

// FSDP x TP: every parameter, its gradient and AdamW state on this rank are its dp rows
// (torch.chunk over the D ranks of mesh dim 0) of its tp slice.
void ExpectShardedOverDp(CompiledStep& step, int D, int dp_rank) {
  auto* f = dynamic_cast<TensorParallelFsdpStep*>(&step);
  ASSERT_NE(f, nullptr) << "expected the FSDP x TP runtime";
  for (const TpParam& p : f->tp_graph().params) {
    int64_t local = 1;
    for (int64_t d : p.local) local *= d;
    const int64_t rows = p.local[0], row = local / rows;
    const int64_t chunk = (rows + D - 1) / D;
    const int64_t mine = std::max<int64_t>(0, std::min(rows, (dp_rank + 1) * chunk) - dp_rank * chunk) * row;
    for (const std::string& name : {p.name, "grad:" + p.name, "opt.m." + p.name}) {
      auto view = f->View(name);
      ASSERT_TRUE(view.ok()) << view.status();
      EXPECT_EQ(view->numel(), mine) << name << " (tp slice " << local << " elements)";
    }
  }
}

// kAuto: the per-rank batch is half the global one, and the reference takes as many rows as the
// chosen strategy's data shares consume (tp peers share a batch).
void CompareWithSingleProcess(const Case& c) {
  const std::vector<int64_t>& mesh = c.mesh;
  const RecomputePolicy recompute = c.recompute;
  const Strategy strategy = c.strategy;
  const bool cuda = c.cuda, wide = c.wide, bf16 = c.cuda || c.bf16;
  const int rank = int(comm::testing::EnvInt("RANK", 0)), world = int(comm::testing::EnvInt("WORLD_SIZE", 1));
  const int planned_dp = strategy == Strategy::kAuto ? 2 : mesh.size() == 2 ? int(mesh[0]) : 1;
  const Device device = cuda ? Device::Cuda(rank) : Device::Cpu();
  const Precision precision = bf16 ? Precision::kBF16Mixed : Precision::kF32;
  // bf16: activations rounded to bf16 at other points (partial sums are rounded before they are
  // added; on CUDA GEMMs of other shapes may take another cuBLASLt algorithm): bf16-level
  // agreement, as compiler/distributed_test's FSDP on CUDA.
  // After 3 AdamW steps (each about sign(g) * lr early on) bf16 noise flips the step of elements
  // whose gradient is near zero: 2e-2 on parameters too. A missing or doubled sum is O(1).
  testing::StepCompare cmp;
  if (bf16) {
    cmp.tol.scalar = 2e-3;
    cmp.tol.grad = 2e-2;
    cmp.tol.param = 2e-2;
  }
  // f32: the loss and gradient norm of later steps carry a rare, larger difference: AdamW's
  // first, normalized step turns a gradient at rounding level into a full lr-sized update, and the
  // ranks sum partial products in another order. Seen in CI-size runs (2026-11-30): the odd
  // vocabulary on 4 ranks 1.05e-4 relative (SG_TEST_SEED=12089422106774185821 for the whole
  // binary), the plain 2-rank case 2.4e-5 (8335815796913218030), both the same at the previous
  // session's code; 30 other seeds of the former at most 1.8e-6. 5e-4 keeps them in and stays far
  // below what a missing or doubled partial sum does (O(1)); gradients and parameters keep theirs.
  if (!bf16) cmp.tol.scalar = 5e-4;
  // bf16: matrices scaled down (as on CUDA) so the logits stay moderate; with RandomParameters'
  // 0.3 the tiny model's softmax is so peaked that two bf16 runs differ by a few percent.
  testing::StepData d = MakeData(c.model, cuda, wide, /*small_weights=*/bf16, c.vocab, c.tied);
  CompileOptions tp_opt;
  tp_opt.device = device;
  tp_opt.precision = precision;
  tp_opt.strategy = strategy;
  tp_opt.mesh = mesh;
  tp_opt.recompute = recompute;
  tp_opt.tensor_parallel_fsdp = c.fsdp;
  tp_opt.comm_timeout_s = 30;
  tp_opt.binding = {{"batch", kGlobalBatch / planned_dp}, {"seq", kSeq}};
  // Scaled-down weights (0.03): lr 1e-2 steps would be a third of them, and AdamW's normalized
  // step turns a near-zero gradient's rounding into a full-size update.
  const float lr = wide || bf16 ? 1e-3f : testing::kCpuLr;
  std::unique_ptr<CompiledStep> tp = testing::CompileAndInit(d, tp_opt, lr);
  ASSERT_NE(tp, nullptr);
  if (rank == 0) std::cout << tp->explanation() << "\n";
  const int dp = tp->data_ranks(), dp_rank = tp->data_rank();
  const int64_t rows = kGlobalBatch / planned_dp * dp;
  if (strategy == Strategy::kTensorParallel) {
    EXPECT_NE(tp->explanation().find("all-reduces per step"), std::string::npos) << tp->explanation();
    EXPECT_EQ(dp, planned_dp) << "tp peers share a batch";
    EXPECT_EQ(dp_rank, rank / (world / dp));
  }
  CompileOptions ref_opt;
  ref_opt.device = device;
  ref_opt.precision = precision;
  ref_opt.binding = {{"batch", rows}, {"seq", kSeq}};
  std::unique_ptr<CompiledStep> ref = testing::CompileAndInit(d, ref_opt, lr);
  ASSERT_NE(ref, nullptr);

  cmp.part = dp_rank;
  cmp.parts = dp;
  cmp.rows = rows;
  cmp.rank = rank;
  cmp.print_errors = bf16;
  cmp.expect_nonzero_grads = true;
  cmp.after_step = [&](int s) {
    if (s == 0 && mesh.empty() && strategy == Strategy::kTensorParallel) ExpectReplicatedGradientsAgree(*tp);
    if (s == 0 && c.fsdp) ExpectShardedOverDp(*tp, dp, dp_rank);
  };
  if (!testing::CompareSteps(d, *ref, *tp, cmp)) return;

  // The trace: the tp all-reduces on the comm stream.
  auto trace = tp->TraceStep(testing::Views(testing::Rows(d.batches[0], dp_rank, dp, rows)));
  ASSERT_TRUE(trace.ok()) << trace.status();
  int reduces = 0, backward_gathers = 0;
  for (const TraceEvent& e : trace->events) {
    if (e.category == "collective" && e.name.find("all-reduce(tp)") != std::string::npos) {
      ++reduces;
      EXPECT_EQ(e.stream, 1) << e.name;
    }
    if (e.category == "collective" && e.name.find("all-gather") != std::string::npos &&
        e.name.find("(backward)") != std::string::npos) {
      ++backward_gathers;
    }
  }
  // FSDP x TP gathers every unit's tp slices again for its backward ("<p>@bwd").
  if (c.fsdp) {
    EXPECT_GE(backward_gathers, int(TpConfig().layers)) << "backward all-gathers";
  }
  if (tp->explanation().find("strategy tensor_parallel") != std::string::npos) {
    EXPECT_GE(reduces, 4 * TpConfig().layers) << "2 forward + 2 backward all-reduces per block";
  }
  if (rank == 0) std::cout << SummaryLine(*trace) << "\n";
  // Rank 0 hosts the store: nobody leaves while another rank's collectives may still need it.
  auto ctx = DistContext::FromEnv(device, {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_TRUE((*ctx)->world().Barrier().ok());
}

TEST(Workers, DISABLED_Tp) { CompareWithSingleProcess(Case()); }
TEST(Workers, DISABLED_TpRecompute) {
  Case c;
  c.recompute = RecomputePolicy::kFull;
  CompareWithSingleProcess(c);
}
TEST(Workers, DISABLED_DpTp) {
  Case c;
  c.mesh = {2, 2};
  CompareWithSingleProcess(c);
}
TEST(Workers, DISABLED_FsdpTp) {
  Case c;
  c.mesh = {2, 2};
  c.fsdp = true;
  CompareWithSingleProcess(c);
}
// 33 over tp 2: 17 + 16 rows, each over dp 2: 9 + 8 and 8 + 8; the head tied to the table.
TEST(Workers, DISABLED_FsdpTpOddVocabTied) {
  Case c;
  c.mesh = {2, 2};
  c.fsdp = true;
  c.vocab = 33;
  c.tied = true;
  CompareWithSingleProcess(c);
}
TEST(Workers, DISABLED_FsdpTpCuda) {
  Case c;
  c.mesh = {2, 2};
  c.fsdp = true;
  c.cuda = true;
  CompareWithSingleProcess(c);
}
TEST(Workers, DISABLED_Auto) {
  Case c;
  c.strategy = Strategy::kAuto;
  CompareWithSingleProcess(c);
}
TEST(Workers, DISABLED_AutoWide) {
  Case c;
  c.strategy = Strategy::kAuto;
  c.wide = true;
  CompareWithSingleProcess(c);
}
// 33 over 2 ranks: 17 + 16 rows; over 4: 9 + 9 + 9 + 6.
TEST(Workers, DISABLED_TpOddVocab) {
  Case c;
  c.vocab = 33;
  CompareWithSingleProcess(c);
}
TEST(Workers, DISABLED_TpTied) {
  Case c;
  c.tied = true;
  CompareWithSingleProcess(c);
}
TEST(Workers, DISABLED_TpBf16) {
  Case c;
  c.bf16 = true;
  CompareWithSingleProcess(c);
}
TEST(Workers, DISABLED_TpCuda) {
  Case c;
  c.cuda = true;
  CompareWithSingleProcess(c);
}
TEST(Workers, DISABLED_TpModel) {
  Case c;
  c.recompute = RecomputePolicy::kSelective;
  c.model = true;
  CompareWithSingleProcess(c);
}

// kAuto on a 2x2 mesh: fsdp_tp is a candidate (whichever wins, the step compiles and runs).
TEST(Workers, DISABLED_Auto2x2) {
  testing::StepData d = MakeData();
  CompileOptions o;
  o.strategy = Strategy::kAuto;
  o.mesh = {2, 2};
  o.comm_timeout_s = 30;
  o.binding = {{"batch", 1}, {"seq", kSeq}};
  std::unique_ptr<CompiledStep> step = testing::CompileAndInit(d, o, testing::kCpuLr);
  ASSERT_NE(step, nullptr);
  if (comm::testing::EnvInt("RANK", 0) == 0) std::cout << step->explanation() << "\n";
  const auto batch = testing::Rows(d.batches[0], step->data_rank(), step->data_ranks(), step->data_ranks());
  ASSERT_TRUE(step->Run(testing::Views(batch)).ok());
  auto m = step->ReadMetrics();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(m->loss, 1.f);
  auto ctx = DistContext::FromEnv(Device::Cpu(), {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_TRUE((*ctx)->world().Barrier().ok());
}

// kv heads 2 over 4 ranks: a clear error on every rank, no hang.
TEST(Workers, DISABLED_IndivisibleHeads) {
  testing::TinyLlamaConfig c = TpConfig();
  c.kv_heads = 2;
  auto g = testing::TinyLlama(c);
  ASSERT_TRUE(g.ok());
  CompileOptions o;
  o.strategy = Strategy::kTensorParallel;
  o.comm_timeout_s = 30;
  o.binding = {{"batch", 2}, {"seq", 8}};
  auto step = Compile(*g, o);
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument) << step.status();
  EXPECT_NE(std::string(step.status().message()).find("found 8 query heads and 2 key/value heads"), std::string::npos)
      << step.status();
  std::cout << step.status() << "\n";
}

TEST(TensorParallelTest, TwoRanksEqualOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_Tp", {SeedEnv()}, absl::Seconds(100));
}

TEST(TensorParallelTest, FourRanksEqualOneProcess) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_Tp", {SeedEnv()}, absl::Seconds(100));
}

TEST(TensorParallelTest, OddVocabularyOnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_TpOddVocab", {SeedEnv()}, absl::Seconds(100));
}

TEST(TensorParallelTest, OddVocabularyOnFourRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_TpOddVocab", {SeedEnv()}, absl::Seconds(100));
}

TEST(TensorParallelTest, TiedEmbeddingAndLmHeadOnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_TpTied", {SeedEnv()}, absl::Seconds(100));
}

TEST(TensorParallelTest, Bf16MixedPrecisionOnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_TpBf16", {SeedEnv()}, absl::Seconds(100));
}

TEST(TensorParallelTest, FullRecomputeGivesTheSameGradients) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_TpRecompute", {SeedEnv()}, absl::Seconds(100));
}

TEST(TensorParallelTest, DataParallelTimesTensorParallelOn2x2Mesh) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_DpTp", {SeedEnv()}, absl::Seconds(100));
}

TEST(TensorParallelTest, FsdpTimesTensorParallelOn2x2Mesh) {
  comm::testing::WorkerRun run = testing::ExpectWorkersPass(4, "Workers.DISABLED_FsdpTp", {SeedEnv()}, absl::Seconds(100));
  EXPECT_NE(run.outputs[0].find("(mesh dim 1) x fsdp over 2 (mesh dim 0)"), std::string::npos) << run.outputs[0];
}

TEST(TensorParallelTest, FsdpTimesTensorParallelWithOddTiedVocabularyOn2x2Mesh) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_FsdpTpOddVocabTied", {SeedEnv()}, absl::Seconds(100));
}

TEST(TensorParallelTest, LlamaModelWithSelectiveRecomputeOnTwoRanksEqualsOneProcess) {
  testing::ExpectWorkersPass(2, "Workers.DISABLED_TpModel", {SeedEnv()}, absl::Seconds(100));
}

// kAuto offers tp to the planner when the heads divide; whichever it picks trains like one process.
TEST(TensorParallelTest, AutoConsidersTensorParallel) {
  comm::testing::WorkerRun run = testing::ExpectWorkersPass(2, "Workers.DISABLED_Auto", {SeedEnv()}, absl::Seconds(100));
  EXPECT_NE(run.outputs[0].find("candidates the runtime lowers: replicate, fsdp, tp"), std::string::npos)
      << run.outputs[0];
}

TEST(TensorParallelTest, AutoChoosesTensorParallelForAWideModelAndTinyBatch) {
  comm::testing::WorkerRun run = testing::ExpectWorkersPass(2, "Workers.DISABLED_AutoWide", {SeedEnv()}, absl::Seconds(100));
  EXPECT_NE(run.outputs[0].find("chose tp"), std::string::npos) << run.outputs[0];
  EXPECT_NE(run.outputs[0].find("strategy tensor_parallel: tp over 2 ranks"), std::string::npos) << run.outputs[0];
}

// GPU: tp over 2 GPUs (NCCL device transport, all-reduces on the comm stream) vs 1 GPU.
TEST(TensorParallelTest, TwoGpusEqualOneGpu) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  testing::ExpectWorkersPass(2, "Workers.DISABLED_TpCuda", {SeedEnv()}, absl::Seconds(120));
}

TEST(TensorParallelTest, AutoOn2x2MeshConsidersFsdpTimesTensorParallel) {
  comm::testing::WorkerRun run = testing::ExpectWorkersPass(4, "Workers.DISABLED_Auto2x2", {SeedEnv()}, absl::Seconds(100));
  EXPECT_NE(run.outputs[0].find("candidates the runtime lowers: replicate, fsdp, hybrid_shard, tp, fsdp_tp"),
            std::string::npos)
      << run.outputs[0];
}

// GPU: FSDP x TP on a 2x2 mesh of 4 GPUs vs 1 GPU.
TEST(TensorParallelTest, FsdpTimesTensorParallelOnFourGpusEqualsOneGpu) {
  SG_SKIP_WITHOUT_CUDA();
  if (CudaDeviceCount() < 4) GTEST_SKIP() << "needs 4 GPUs, found " << CudaDeviceCount();
  testing::ExpectWorkersPass(4, "Workers.DISABLED_FsdpTpCuda", {SeedEnv()}, absl::Seconds(120));
}

TEST(TensorParallelTest, IndivisibleHeadsAreRefusedClearly) {
  testing::ExpectWorkersPass(4, "Workers.DISABLED_IndivisibleHeads", {SeedEnv()}, absl::Seconds(60));
}

// The per-rank graph, without processes.
absl::StatusOr<TensorParallelGraph> RankGraph(const testing::TinyLlamaConfig& c, int T, int rank,
                                              RecomputePolicy recompute = RecomputePolicy::kNone,
                                              bool vocab_parallel = true) {
  SG_ASSIGN_OR_RETURN(graph::Graph forward, testing::TinyLlama(c));
  CompileOptions o;
  o.recompute = recompute;
  SG_ASSIGN_OR_RETURN(graph::Graph train, PrepareTrainingGraph(forward, o));
  SG_ASSIGN_OR_RETURN(DataParallelGraph dp, SplitOptimizer(train));
  TensorParallelGraphOptions go;
  go.vocab_parallel = vocab_parallel;
  return BuildTensorParallelGraph(dp, T, rank, go);
}

TEST(TensorParallelGraphTest, MegatronPlacementsFromTheStrategy) {
  const testing::TinyLlamaConfig c = TpConfig();
  for (bool vocab_parallel : {true, false}) {
    for (int rank : {0, 1}) {
      auto tp = RankGraph(c, 2, rank, RecomputePolicy::kNone, vocab_parallel);
      ASSERT_TRUE(tp.ok()) << tp.status();
      std::cout << tp->Summary() << "\n";
      int split = 0;
      for (const TpParam& p : tp->params) {
        const bool column = p.name.find(".wq.") != std::string::npos || p.name.find(".wk.") != std::string::npos ||
                            p.name.find(".wv.") != std::string::npos || p.name.find(".w1.") != std::string::npos ||
                            p.name.find(".w3.") != std::string::npos;
        const bool row = p.name.find(".wo.") != std::string::npos || p.name.find(".w2.") != std::string::npos;
        const bool vocab = p.name == "tok_embeddings.weight" || p.name == "output.weight";
        EXPECT_EQ(p.dim, column || (vocab && vocab_parallel) ? 0 : row ? 1 : -1) << p.name;
        if (p.dim >= 0) {
          ++split;
          EXPECT_EQ(p.local[size_t(p.dim)] * 2, p.global[size_t(p.dim)]) << p.name;
        } else {
          EXPECT_EQ(p.local, p.global) << p.name;
        }
      }
      EXPECT_EQ(split, 7 * c.layers + (vocab_parallel ? 2 : 0));
      // Per block: the wo and w2 outputs in forward, the column-parallel input gradients in
      // backward; vocabulary parallel adds the embedding's output and the LM head's input gradient.
      EXPECT_EQ(int(tp->all_reduces.size()), 4 * c.layers + (vocab_parallel ? 2 : 0));
      EXPECT_EQ(tp->dropped_residuals, rank == 0 ? 0 : 2 * c.layers);
      // embedding, embedding_backward, softmax_cross_entropy and its backward on the shard.
      ASSERT_EQ(tp->vocab_ops.size(), vocab_parallel ? 4u : 0u);
      for (const TpVocabOp& v : tp->vocab_ops) {
        EXPECT_EQ(v.start, rank * c.vocab / 2);
        EXPECT_EQ(v.length, c.vocab / 2);
      }
    }
  }
}

// 33 over 4 ranks: torch.chunk's 9, 9, 9, 6 rows of the table, the LM head and the logits.
TEST(TensorParallelGraphTest, UnevenVocabularySplitsAsChunks) {
  testing::TinyLlamaConfig c = TpConfig();
  c.vocab = 33;
  for (int rank = 0; rank < 4; ++rank) {
    auto tp = RankGraph(c, 4, rank);
    ASSERT_TRUE(tp.ok()) << tp.status();
    const int64_t want = rank < 3 ? 9 : 6;
    for (const TpParam& p : tp->params) {
      if (p.name == "tok_embeddings.weight" || p.name == "output.weight") {
        EXPECT_EQ(p.local[0], want) << p.name;
      }
    }
    ASSERT_FALSE(tp->vocab_ops.empty());
    EXPECT_EQ(tp->vocab_ops[0].start, 9 * rank);
    EXPECT_EQ(tp->vocab_ops[0].length, want);
  }
  // 5 over 4 (chunks of 2): rank 3 would hold nothing.
  c.vocab = 5;
  auto tiny = RankGraph(c, 4, 3);
  ASSERT_FALSE(tiny.ok());
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(tiny.status().message()).find("vocabulary of 5 leaves rank 3 no rows"), std::string::npos)
      << tiny.status();
}

// The memory the vocabulary split saves, in the lowered per-rank plan: the logits and dlogits of
// a 4096-token vocabulary at batch 4 x seq 8 are 512 KiB each in full, half per rank over 2.
TEST(TensorParallelGraphTest, VocabularyParallelPlanHoldsHalfTheLogits) {
  testing::TinyLlamaConfig c = TpConfig();
  c.vocab = 4096;
  const graph::Binding binding = {{"batch", kGlobalBatch}, {"seq", kSeq}};
  auto split = RankGraph(c, 2, 0);
  auto whole = RankGraph(c, 2, 0, RecomputePolicy::kNone, /*vocab_parallel=*/false);
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto a = PlanStepMemory(split->graph, binding, Device::Cpu());
  auto b = PlanStepMemory(whole->graph, binding, Device::Cpu());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const int64_t half_logits = kGlobalBatch * kSeq * c.vocab / 2 * 4;
  std::cout << "arena per rank: vocabulary parallel " << a->arena_bytes << " B, replicated " << b->arena_bytes
            << " B; state " << a->state_bytes << " vs " << b->state_bytes << " B\n";
  EXPECT_LE(a->arena_bytes, b->arena_bytes - half_logits);
  // The table and LM head (f32) are halved too.
  EXPECT_LE(a->state_bytes, b->state_bytes - c.vocab * c.dim * 4);
}

TEST(TensorParallelGraphTest, LlamaModelSplitsLikeTheTestModel) {
  auto forward = graph::BuildLlamaForward(ModelConfig());
  ASSERT_TRUE(forward.ok()) << forward.status();
  auto train = PrepareTrainingGraph(*forward, CompileOptions{});
  ASSERT_TRUE(train.ok()) << train.status();
  auto dp = SplitOptimizer(*train);
  ASSERT_TRUE(dp.ok()) << dp.status();
  auto tp = BuildTensorParallelGraph(*dp, 2, 1);
  ASSERT_TRUE(tp.ok()) << tp.status();
  std::cout << tp->Summary() << "\n";
  int split = 0;
  for (const TpParam& p : tp->params) split += p.dim >= 0;
  EXPECT_EQ(split, 7 * ModelConfig().n_layers + 2);  // + the embedding and the LM head
  EXPECT_EQ(int(tp->all_reduces.size()), 4 * ModelConfig().n_layers + 2);
  EXPECT_EQ(tp->vocab_ops.size(), 4u);
}

TEST(TensorParallelGraphTest, FullRecomputeAllReducesTheRecomputedRowParallelOutputs) {
  auto tp = RankGraph(TpConfig(), 2, 1, RecomputePolicy::kFull);
  ASSERT_TRUE(tp.ok()) << tp.status();
  std::cout << tp->Summary() << "\n";
  EXPECT_GT(int(tp->all_reduces.size()), 4 * TpConfig().layers + 2);
}

TEST(TensorParallelGraphTest, HeadsAndFfnMustDivide) {
  testing::TinyLlamaConfig c = TpConfig();
  auto heads = RankGraph(c, 3, 0);
  ASSERT_FALSE(heads.ok());
  EXPECT_EQ(heads.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(heads.status().message()).find("divisible by 3, found 8 query heads and 4 key/value heads"),
            std::string::npos)
      << heads.status();
  c.ffn = 25;
  auto ffn = RankGraph(c, 2, 0);
  ASSERT_FALSE(ffn.ok());
  EXPECT_NE(std::string(ffn.status().message()).find("expected its extent 25 to be a constant divisible by 2"),
            std::string::npos)
      << ffn.status();
}

}  // namespace
}  // namespace sg::compiler
