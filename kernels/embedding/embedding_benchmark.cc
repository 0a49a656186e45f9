// Embedding bandwidth. Forward: token ids read, out written, and the gathered table rows read
// (tokens x dim: each output row is one table read). Backward: dout read, dtable (f32) written,
// ids read; the sort's index traffic is not counted as useful bytes. The backward's two stages are
// also timed alone (embedding_internal.h): the index preparation (CUB vs one CTA; bytes: ids read,
// order and offsets written) and the row sums on prepared indices (bytes: as the whole backward, so
// its TB/s compare with it), with a sweep of the fused row-sum launch shapes.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/core/testing.h"
#include "kernels/embedding/embedding.h"
#include "kernels/embedding/embedding_internal.h"

namespace sg::kernels {
namespace {

struct Setup {
  Device device = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
};

// kernel: SG_EMBEDDING_BWD for this benchmark ("" = the default); calls: calls per timed iteration
// (1: events around one call, host launch latency included; kBatch: back-to-back calls, as in a
// CUDA-graph step). zero_fill: time ZeroTensor(dtable) instead, the write-only ceiling of the
// backward's largest stream (the f32 dtable).
constexpr int kBatch = 10;
// hot: a fraction of the tokens (5%, Zipf-like text's most frequent token) is one id, a run of ~820
// rows at 16384 tokens that a single row sum adds in order.
constexpr double kHotFraction = 0.05;
std::vector<double> DrawIds(int64_t n, int64_t vocab, bool hot) {
  std::vector<double> idv;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = testing::Rng()();
    idv.push_back(hot && double(r % 10000) < kHotFraction * 10000 ? double(vocab / 2)
                                                                  : double((r >> 16) % uint64_t(vocab)));
  }
  return idv;
}

void Run(benchmark::State& state, DType dtype, bool backward, const char* kernel = "", int calls = 1,
         bool zero_fill = false, bool hot = false) {
  Setup s;
  if (*kernel != 0) {
    setenv("SG_EMBEDDING_BWD", kernel, 1);
  } else {
    unsetenv("SG_EMBEDDING_BWD");
  }
  const int64_t n = state.range(0), vocab = state.range(1), dim = state.range(2);
  Tensor ids = testing::FromHost(DrawIds(n, vocab, hot), {n}, DType::kI32, s.device);
  Tensor table = testing::RandomTensor({vocab, dim}, dtype, s.device, testing::Rng());
  Tensor out = Tensor::Empty({n, dim}, dtype, s.device).value();
  Tensor dtable = Tensor::Empty({vocab, dim}, DType::kF32, s.device).value();
  Event start = Event::Create(s.device, true).value(), stop = Event::Create(s.device, true).value();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)start.Record(s.stream);
    absl::Status st;
    for (int i = 0; i < calls && st.ok(); ++i) {
      st = zero_fill  ? ZeroTensor(dtable, s.stream)
           : backward ? EmbeddingBackward(out, ids, dtable, s.stream)
                      : EmbeddingForward(ids, table, out, s.stream);
    }
    (void)stop.Record(s.stream);
    if (!st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      break;
    }
    if (s.device.is_cuda()) {
      (void)stop.Synchronize();
      state.SetIterationTime(stop.ElapsedMsSince(start).value() / 1e3 / calls);
    } else {
      state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls);
    }
  }
  unsetenv("SG_EMBEDDING_BWD");
  const int64_t bytes = zero_fill  ? vocab * dim * 4
                        : backward ? n * dim * SizeOf(dtype) + vocab * dim * 4 + n * 4
                                   : 2 * n * dim * SizeOf(dtype) + n * 4;
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetLabel(std::string(DTypeName(dtype)) + "@" + s.device.ToString() +
                 (zero_fill ? " zero-fill dtable" : (*kernel ? std::string(" ") + kernel : std::string(" default"))) +
                 (calls > 1 ? " batch" : " per-call") + (hot ? " hot-id" : ""));
}

// One stage of the CUDA backward, kBatch back-to-back calls between events. prepare: the index
// preparation alone; else the row sums alone on indices prepared once. range(3..5), where given:
// the fused row sums' rows_per_step, ctas_per_sm and streaming stores.
void RunStage(benchmark::State& state, embedding_internal::BackwardPath path, bool prepare, bool match_any = false,
              bool early_zeros = false) {
#ifdef SG_WITH_CUDA
  Setup s;
  if (s.device.is_cpu()) {
    state.SkipWithError("needs a GPU");
    return;
  }
  const int64_t n = state.range(0), vocab = state.range(1), dim = state.range(2);
  embedding_internal::BackwardConfig cfg;
  cfg.path = path;
  cfg.prep_match_any = match_any;
  cfg.early_zeros = early_zeros;
  if (state.range(3) > 0) cfg.rows_per_step = int(state.range(3));
  if (state.range(3) > 0) cfg.ctas_per_sm = int(state.range(4));
  if (state.range(3) > 0) cfg.streaming_stores = state.range(5) != 0;
  const embedding_internal::Problem p{n, vocab, dim, DType::kBF16, false};
  Tensor ids = testing::FromHost(DrawIds(n, vocab, false), {n}, DType::kI32, s.device);
  Tensor dout = testing::RandomTensor({n, dim}, DType::kBF16, s.device, testing::Rng());
  Tensor dtable = Tensor::Empty({vocab, dim}, DType::kF32, s.device).value();
  Tensor order = Tensor::Empty({n}, DType::kI32, s.device).value();
  Tensor offsets = Tensor::Empty({embedding_internal::BackwardOffsetsInts(p)}, DType::kI32, s.device).value();
  auto prep = [&] {
    return embedding_internal::BackwardPrepareCuda(p, cfg, ids.view().raw(), order.data<int32_t>(),
                                                   offsets.data<int32_t>(), s.device.ordinal, s.stream.native());
  };
  absl::Status st = prep();
  Event start = Event::Create(s.device, true).value(), stop = Event::Create(s.device, true).value();
  for (auto _ : state) {
    (void)start.Record(s.stream);
    for (int i = 0; i < kBatch && st.ok(); ++i) {
      st = prepare ? prep()
                   : embedding_internal::BackwardRowSumCuda(p, cfg, dout.view().raw(), order.data<int32_t>(),
                                                            offsets.data<int32_t>(), dtable.data<float>(),
                                                            s.stream.native());
    }
    (void)stop.Record(s.stream);
    if (!st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      break;
    }
    (void)stop.Synchronize();
    state.SetIterationTime(stop.ElapsedMsSince(start).value() / 1e3 / kBatch);
  }
  const int64_t bytes = prepare ? (2 * n + vocab + 1) * 4 : n * dim * 2 + vocab * dim * 4 + n * 4;
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetLabel(cfg.ToString() + (prepare ? " prepare" : " row sums") + " batch");
#else
  (void)path;
  (void)prepare;
  (void)match_any;
  (void)early_zeros;
  state.SkipWithError("built without CUDA");
#endif
}

void BM_EmbeddingForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false); }
void BM_EmbeddingBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true); }
void BM_EmbeddingForwardF32(benchmark::State& st) { Run(st, DType::kF32, false); }
// The two row-sum kernels side by side (embedding.cu), and the write-only ceiling, batch timing.
void BM_EmbeddingBackwardBF16RowsBatch(benchmark::State& st) { Run(st, DType::kBF16, true, "rows", kBatch); }
void BM_EmbeddingBackwardBF16PacksBatch(benchmark::State& st) { Run(st, DType::kBF16, true, "packs", kBatch); }
void BM_EmbeddingBackwardZeroFillBatch(benchmark::State& st) { Run(st, DType::kBF16, true, "", kBatch, true); }
void BM_EmbeddingBackwardBF16FusedBatch(benchmark::State& st) { Run(st, DType::kBF16, true, "fused", kBatch); }
void BM_EmbeddingBackwardBF16FusedEarlyBatch(benchmark::State& st) {
  Run(st, DType::kBF16, true, "fused-early", kBatch);
}
// 5% of the tokens one id: the long run one row sum adds in token order.
void BM_EmbeddingBackwardBF16RowsHotBatch(benchmark::State& st) {
  Run(st, DType::kBF16, true, "rows", kBatch, false, true);
}
void BM_EmbeddingBackwardBF16FusedHotBatch(benchmark::State& st) {
  Run(st, DType::kBF16, true, "fused", kBatch, false, true);
}
// The stages alone.
using embedding_internal::BackwardPath;
void BM_EmbeddingPrepareCubBatch(benchmark::State& st) { RunStage(st, BackwardPath::kRows, true); }
void BM_EmbeddingPrepareOneCtaBatch(benchmark::State& st) { RunStage(st, BackwardPath::kFused, true); }
void BM_EmbeddingPrepareOneCtaMatchAnyBatch(benchmark::State& st) { RunStage(st, BackwardPath::kFused, true, true); }
void BM_EmbeddingRowSumRowsBatch(benchmark::State& st) { RunStage(st, BackwardPath::kRows, false); }
void BM_EmbeddingRowSumPacksBatch(benchmark::State& st) { RunStage(st, BackwardPath::kPacks, false); }
void BM_EmbeddingRowSumFusedBatch(benchmark::State& st) { RunStage(st, BackwardPath::kFused, false); }
// Early zeros' two passes over the step without the overlap they exist for (the flag is already set).
void BM_EmbeddingRowSumFusedEarlyBatch(benchmark::State& st) {
  RunStage(st, BackwardPath::kFused, false, false, true);
}

// Llama-1B: 16384 tokens, vocab 32000 (and 128256), dim 2048; a small CPU-sized case.
#define SG_SHAPES ->Args({16384, 32000, 2048})->Args({16384, 128256, 2048})->Args({256, 1000, 256})->UseManualTime()
BENCHMARK(BM_EmbeddingForwardBF16) SG_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16) SG_SHAPES;
BENCHMARK(BM_EmbeddingForwardF32) SG_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16RowsBatch) SG_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16PacksBatch) SG_SHAPES;
BENCHMARK(BM_EmbeddingBackwardZeroFillBatch) SG_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16FusedBatch) SG_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16FusedEarlyBatch) SG_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16RowsHotBatch)->Args({16384, 32000, 2048})->UseManualTime();
BENCHMARK(BM_EmbeddingBackwardBF16FusedHotBatch)->Args({16384, 32000, 2048})->UseManualTime();
// Stage args: tokens, vocab, dim, then (fused row sums) rows_per_step, ctas_per_sm, streaming (0: defaults).
#define SG_STAGE_SHAPES \
  ->Args({16384, 32000, 2048, 0, 0, 0})->Args({16384, 128256, 2048, 0, 0, 0})->UseManualTime()
BENCHMARK(BM_EmbeddingPrepareCubBatch) SG_STAGE_SHAPES;
BENCHMARK(BM_EmbeddingPrepareOneCtaBatch) SG_STAGE_SHAPES;
BENCHMARK(BM_EmbeddingPrepareOneCtaMatchAnyBatch) SG_STAGE_SHAPES;
BENCHMARK(BM_EmbeddingRowSumRowsBatch) SG_STAGE_SHAPES;
BENCHMARK(BM_EmbeddingRowSumPacksBatch) SG_STAGE_SHAPES;
BENCHMARK(BM_EmbeddingRowSumFusedBatch) SG_STAGE_SHAPES;
BENCHMARK(BM_EmbeddingRowSumFusedEarlyBatch) SG_STAGE_SHAPES;
// The fused row sums' launch shapes at the Llama-1B shape (--benchmark_filter=RowSumFusedSweep;
// batch-timed like the others, but not named "Batch", so the usual Batch/16384 runs skip it).
void BM_EmbeddingRowSumFusedSweep(benchmark::State& st) { RunStage(st, BackwardPath::kFused, false); }
BENCHMARK(BM_EmbeddingRowSumFusedSweep)
    ->ArgsProduct({{16384}, {32000}, {2048}, {4, 8, 16}, {0, 1, 2, 4}, {0, 1}})
    ->UseManualTime();

}  // namespace
}  // namespace sg::kernels
