// Context-parallel GPU benchmarks; run one process per GPU under the launcher:
//
//   bazel build -c opt //compiler/context_parallel:cp_benchmark
//   comm/launch --nproc=2 -- bazel-bin/compiler/context_parallel/cp_benchmark
//
// BM_RingAttention/<seq>/<mode>: causal bf16 ring attention forward + backward at the 1b model's
//   attention shape (32 query heads, 8 key/value heads, head_dim 64), batch 1, the sequence split
//   over the ranks. mode 0: the real ring; mode 1: the same kernel work with no transfer
//   (RingAttentionOptions::skip_exchanges); mode 2: the bare block exchanges alone (cp-1 forward,
//   2cp-1 backward transfers of one key/value block each). Counters: us_per_ring_step (forward
//   time / cp) and, on mode 0, hidden_share = 1 - (ring - compute-only) / exchanges-alone: the
//   part of the transfer time the overlap hides (1 = fully hidden).
// BM_LlamaLongSequence/<seq>/<layers>/<cp>: a whole bf16 training step of the 1b model's shapes
//   (the layer count may be reduced) through Compile, one sequence of <seq> tokens: cp = 0 runs
//   the single-GPU step on each rank independently, cp = 1 Strategy::kContextParallel over all
//   ranks. Counter tokens_per_s (the step's tokens / step time) and tokens_per_s_per_gpu.
// Every benchmark has a fixed iteration count (the ranks take part in the same collectives) and
// skips with a message without a GPU or without the launcher's 2+ ranks. SG_BENCH_CPU=1 runs a
// smoke version on the CPU (f32 ring attention with 4/2 heads at 1/64 of the sequence; the tiny
// model at seq/128) that exercises the same code paths without a GPU.

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "compiler/compile.h"
#include "compiler/context_parallel/cp_layout.h"
#include "compiler/context_parallel/ring_attention.h"
#include "compiler/dist_context.h"
#include "compiler/llama_step.h"
#include "kernels/core/device.h"
#include "kernels/core/status.h"
#include "kernels/core/testing.h"

namespace sg::compiler {
namespace {

constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadDim = 64;

bool CpuSmoke() { return std::getenv("SG_BENCH_CPU") != nullptr; }

// The process's GPU and world group, or why the benchmark cannot run.
struct Env {
  std::shared_ptr<DistContext> ctx;
  Device device;
  std::string skip;
};

const Env& GetEnv() {
  static Env* env = [] {
    auto* e = new Env();
    if (CudaDeviceCount() == 0 && !CpuSmoke()) {
      e->skip = "needs a CUDA GPU";
      return e;
    }
    auto info = comm::RankInfoFromEnv();
    if (!info.ok() || info->world_size < 2) {
      e->skip = "needs 2+ ranks: run under comm/launch --nproc=2";
      return e;
    }
    e->device = CpuSmoke() ? Device::Cpu() : Device::Cuda(info->local_rank % CudaDeviceCount());
    comm::ProcessGroupOptions po;
    po.timeout = absl::Seconds(120);
    auto ctx = DistContext::FromEnv(e->device, po);
    if (!ctx.ok()) {
      e->skip = absl::StrCat("distributed set-up failed: ", ctx.status().message());
      return e;
    }
    e->ctx = *ctx;
    return e;
  }();
  return *env;
}

#define BENCH_OK(expr)                                              \
  do {                                                              \
    absl::Status sg_s_ = (expr);                                    \
    if (!sg_s_.ok()) {                                              \
      state.SkipWithError(std::string(sg_s_.message()).c_str());    \
      return;                                                       \
    }                                                               \
  } while (0)

double TimeMs(const Stream& stream, comm::ProcessGroup& pg, int reps, const std::function<absl::Status()>& fn,
              absl::Status* status) {
  *status = pg.Barrier();
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < reps && status->ok(); ++i) *status = fn();
  if (status->ok()) *status = stream.Synchronize();
  return absl::ToDoubleMilliseconds(absl::Now() - t0) / reps;
}

void BM_RingAttention(benchmark::State& state) {
  const Env& env = GetEnv();
  if (!env.skip.empty()) {
    state.SkipWithError(env.skip.c_str());
    return;
  }
  const bool cpu = CpuSmoke();
  const int64_t seq = cpu ? state.range(0) / 64 : state.range(0);
  const int mode = int(state.range(1));
  const int64_t heads = cpu ? 4 : kHeads, kv_heads = cpu ? 2 : kKvHeads;
  const DType dtype = cpu ? DType::kF32 : DType::kBF16;
  comm::ProcessGroup& pg = env.ctx->world();
  const int cp = pg.size(), me = pg.rank();
  auto layout = CpLayout::Create(seq, cp);
  BENCH_OK(layout.status());
  const int64_t local = layout->LocalSeq(me);
  auto stream_or = Stream::Create(env.device);
  BENCH_OK(stream_or.status());
  const Stream& stream = *stream_or;
  std::mt19937_64 rng(uint64_t(me) + 1);
  const Device d = env.device;
  Tensor q = sg::testing::RandomTensor({1, local, heads, kHeadDim}, dtype, d, rng);
  Tensor k = sg::testing::RandomTensor({1, local, kv_heads, kHeadDim}, dtype, d, rng);
  Tensor v = sg::testing::RandomTensor({1, local, kv_heads, kHeadDim}, dtype, d, rng);
  Tensor out = Tensor::Empty(q.shape(), dtype, d).value();
  Tensor lse = Tensor::Empty({1, heads, local}, DType::kF32, d).value();
  Tensor dq = Tensor::Empty(q.shape(), dtype, d).value();
  Tensor dk = Tensor::Empty(k.shape(), dtype, d).value();
  Tensor dv = Tensor::Empty(k.shape(), dtype, d).value();
  Tensor blk_a = Tensor::Empty({2 * local * kv_heads * kHeadDim}, dtype, d).value();
  Tensor blk_b = Tensor::Empty({2 * local * kv_heads * kHeadDim}, dtype, d).value();
  RingAttentionOptions opt;
  opt.causal = true;
  opt.seq = seq;
  auto ring = [&](bool skip) -> absl::Status {
    RingAttentionOptions o = opt;
    o.skip_exchanges = skip;
    SG_RETURN_IF_ERROR(RingAttentionForward(q, k, v, o, pg, out, lse, stream));
    return RingAttentionBackward(q, k, v, out, out, lse, o, pg, dq, dk, dv, stream);
  };
  auto forward_only = [&]() { return RingAttentionForward(q, k, v, opt, pg, out, lse, stream); };
  auto exchanges = [&]() -> absl::Status {
    for (int i = 0; i < (cp - 1) + (2 * cp - 1); ++i) {
      SG_ASSIGN_OR_RETURN(auto r, pg.SendRecv(blk_a, (me + 1) % cp, blk_b, (me + cp - 1) % cp, 7, stream));
      if (!cpu) {  // device transfers complete on the transport's stream, ordered by events
        SG_RETURN_IF_ERROR(pg.OrderAfterP2P(stream));
        continue;
      }
      SG_RETURN_IF_ERROR(r.first.Wait(absl::Now() + absl::Seconds(60)));
      SG_RETURN_IF_ERROR(r.second.Wait(absl::Now() + absl::Seconds(60)));
    }
    return absl::OkStatus();
  };
  std::function<absl::Status()> body = mode == 0 ? std::function<absl::Status()>([&] { return ring(false); })
                                      : mode == 1 ? std::function<absl::Status()>([&] { return ring(true); })
                                                  : std::function<absl::Status()>(exchanges);
  absl::Status st;
  TimeMs(stream, pg, 2, body, &st);  // warm-up (kernel heuristics, NCCL channels)
  BENCH_OK(st);
  for (auto _ : state) {
    const double ms = TimeMs(stream, pg, 3, body, &st);
    BENCH_OK(st);
    state.SetIterationTime(ms / 1e3);
  }
  const double fwd_ms = TimeMs(stream, pg, 3, forward_only, &st);
  BENCH_OK(st);
  state.counters["us_per_ring_step"] = 1e3 * fwd_ms / cp;
  if (mode == 0) {
    const double full = TimeMs(stream, pg, 3, body, &st);
    const double compute = TimeMs(stream, pg, 3, [&] { return ring(true); }, &st);
    const double xfer = TimeMs(stream, pg, 3, exchanges, &st);
    BENCH_OK(st);
    state.counters["compute_only_ms"] = compute;
    state.counters["exchanges_alone_ms"] = xfer;
    // Clamped to [0, 1]: on a noisy host the three timings can disagree by more than the transfers.
    state.counters["hidden_share"] = xfer > 0 ? std::clamp(1.0 - (full - compute) / xfer, 0.0, 1.0) : 1.0;
  }
  state.SetLabel(absl::StrCat("cp=", cp, " seq=", seq, " ", mode == 0 ? "ring" : mode == 1 ? "compute only" : "exchanges only"));
}
BENCHMARK(BM_RingAttention)
    ->ArgsProduct({{8192, 32768}, {0, 1, 2}})
    ->Iterations(5)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

void BM_LlamaLongSequence(benchmark::State& state) {
  const Env& env = GetEnv();
  if (!env.skip.empty()) {
    state.SkipWithError(env.skip.c_str());
    return;
  }
  const bool cpu = CpuSmoke();
  const int64_t seq = cpu ? state.range(0) / 128 : state.range(0), layers = state.range(1);
  const bool cp = state.range(2) != 0;
  auto c = LlamaBenchConfigNamed(cpu ? "tiny" : "1b");
  BENCH_OK(c.status());
  c->model.n_layers = layers;
  c->model.max_seq_len = std::max(c->model.max_seq_len, seq);
  c->seq = seq;
  c->batch = 1;
  auto fwd = graph::BuildLlamaForward(c->model);
  BENCH_OK(fwd.status());
  CompileOptions o = LlamaStepOptions(*c, env.device);
  o.cuda_graph = false;
  if (cpu) o.precision = Precision::kF32;
  if (cp) {
    o.strategy = Strategy::kContextParallel;
    o.comm_timeout_s = 120;
  }
  auto step = Compile(*fwd, o);
  BENCH_OK(step.status());
  BENCH_OK(InitLlamaParameters(**step, *fwd, 1));
  BENCH_OK((*step)->SetLearningRate(1e-4f));
  auto batch = RandomTokenBatch(*c, 2);  // the same on every rank
  BENCH_OK(batch.status());
  std::map<std::string, TensorView> views;
  for (const auto& [name, t] : *batch) views[name] = t.view();
  BENCH_OK((*step)->Run(views));
  BENCH_OK((*step)->ReadMetrics().status());
  BENCH_OK(env.ctx->world().Barrier());
  for (auto _ : state) {
    const absl::Time t0 = absl::Now();
    BENCH_OK((*step)->Run(views));
    BENCH_OK((*step)->ReadMetrics().status());
    state.SetIterationTime(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  const int gpus = cp ? env.ctx->world_size() : 1;
  state.counters["tokens_per_s"] = benchmark::Counter(double(seq), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens_per_s_per_gpu"] =
      benchmark::Counter(double(seq) / gpus, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(absl::StrCat(c->name, " shapes, ", layers, " layers, seq ", seq, cp ? ", context parallel over " : ", one GPU",
                              cp ? absl::StrCat(env.ctx->world_size(), " GPUs") : ""));
}
BENCHMARK(BM_LlamaLongSequence)
    ->ArgsProduct({{32768}, {4, 16}, {0, 1}})
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace sg::compiler
