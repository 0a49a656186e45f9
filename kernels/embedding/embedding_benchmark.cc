// Embedding bandwidth. Forward: token ids read, out written, and the gathered table rows read
// (tokens x dim: each output row is one table read). Backward: dout read, dtable (f32) written,
// ids read; the index preparation's traffic (sort or counts) is not counted as useful bytes.
//
// Backward kernels (embedding.cu, selected per call by SG_EMBEDDING_BWD) side by side with batch
// timing (10 back-to-back calls, as in a CUDA-graph step):
//   --benchmark_filter='Backward.*Batch'  rows (sorted) against atomic, atomic_nopdl and atomic2s
//     (the zero fill of rows without tokens overlapped with the index preparation); the "Hot"
//     entries put 5% of the tokens on one id; dim 8 shapes leave little but the index preparation
//     and the launches (the row sums write vocab x 32 bytes). Atomic2s*: the default
//     (embedding_atomic.cu).
//   --benchmark_filter='Backward.*(Atomic|ZeroFill).*Batch/16384/(32000|128256)/2048'
//     compares them.
//   Atomic2sGraph, Atomic2sGraphPriority: the default's batch captured once into a CUDA graph and
//     replayed (as a compiled step runs it), without and with the kernels' launch priorities kept.
//   Built with SG_EMB_TIMELINE (embedding_timeline.h), BM_EmbeddingBackwardTimeline* report when
//     each atomic2s kernel starts, passes its wait and ends within a call of a back-to-back batch.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/core/benchmark_timing.h"
#include "kernels/core/testing.h"
#include "kernels/embedding/embedding.h"
#include "kernels/embedding/embedding_timeline.h"

namespace sg::kernels {
namespace {

struct Setup {
  Device device = CudaAvailable() ? Device::Cuda(0) : Device::Cpu();
  Stream stream = device.is_cpu() ? Stream::Cpu() : Stream::Create(device).value();
};

// kernel: SG_EMBEDDING_BWD for a backward benchmark ("" = the default); calls: calls per timed
// iteration (1: events around one call, host launch latency included; kBatch: back-to-back calls,
// as in a CUDA-graph step). zero_fill: time ZeroTensor(dtable) instead, the write-only ceiling of
// the backward's largest stream (the f32 dtable). hot: every 20th token is id 7 (5% on one id, the
// rest uniform). no_early: SG_EMBEDDING_EARLY_FILL=0 (atomic2s without its early fill).
constexpr int kBatch = 10;
// graph: 0 back-to-back calls; 1 the batch replayed as a captured CUDA graph (as a compiled step runs
// it); 2 the same keeping each kernel's launch priority in the replay (testing::TimeGraphReplays).
void Run(benchmark::State& state, DType dtype, bool backward, const char* kernel = "", int calls = 1,
         bool zero_fill = false, bool hot = false, bool no_early = false, int graph = 0) {
  Setup s;
  if (no_early) setenv("SG_EMBEDDING_EARLY_FILL", "0", 1);
  const char* var = "SG_EMBEDDING_BWD";
  if (*kernel != 0) {
    setenv(var, kernel, 1);
  } else {
    unsetenv(var);
  }
  const int64_t n = state.range(0), vocab = state.range(1), dim = state.range(2);
  std::vector<double> idv;
  for (int64_t i = 0; i < n; ++i) {
    idv.push_back(hot && i % 20 == 0 ? double(7 % vocab) : double(testing::Rng()() % uint64_t(vocab)));
  }
  Tensor ids = testing::FromHost(idv, {n}, DType::kI32, s.device);
  Tensor table = testing::RandomTensor({vocab, dim}, dtype, s.device, testing::Rng());
  // The forward's output, and the backward's dout: random, so the backward never reads zeros or
  // whatever the allocator's block last held.
  Tensor out = backward ? testing::RandomTensor({n, dim}, dtype, s.device, testing::Rng())
                        : Tensor::Empty({n, dim}, dtype, s.device).value();
  Tensor dtable = Tensor::Empty({vocab, dim}, DType::kF32, s.device).value();
  const int64_t bytes = zero_fill  ? vocab * dim * 4
                        : backward ? n * dim * SizeOf(dtype) + vocab * dim * 4 + n * 4
                                   : 2 * n * dim * SizeOf(dtype) + n * 4;
  auto call = [&] {
    return zero_fill  ? ZeroTensor(dtable, s.stream)
           : backward ? EmbeddingBackward(out, ids, dtable, s.stream)
                      : EmbeddingForward(ids, table, out, s.stream);
  };
  if (graph > 0) {
    testing::TimeGraphReplays(state, s.stream, calls, bytes, call, graph == 2);
  } else {
    testing::TimeCalls(state, s.stream, calls, bytes, call);
  }
  unsetenv(var);
  if (no_early) unsetenv("SG_EMBEDDING_EARLY_FILL");
  state.SetLabel(std::string(DTypeName(dtype)) + "@" + s.device.ToString() +
                 (zero_fill ? " zero-fill dtable" : (*kernel ? std::string(" ") + kernel : std::string(" default"))) +
                 (hot ? " hot" : "") + (no_early ? " no-early" : "") + (calls > 1 ? " batch" : " per-call") +
                 (graph == 1 ? " graph" : graph == 2 ? " graph+priorities" : ""));
}

void BM_EmbeddingForwardBF16(benchmark::State& st) { Run(st, DType::kBF16, false); }
void BM_EmbeddingBackwardBF16(benchmark::State& st) { Run(st, DType::kBF16, true); }
void BM_EmbeddingForwardF32(benchmark::State& st) { Run(st, DType::kF32, false); }
void BM_EmbeddingForwardBF16Batch(benchmark::State& st) { Run(st, DType::kBF16, false, "", kBatch); }
void BM_EmbeddingForwardF32Batch(benchmark::State& st) { Run(st, DType::kF32, false, "", kBatch); }
// The backward's index preparations and row-sum kernels side by side, and the write-only ceiling,
// batch timing.
void BM_EmbeddingBackwardBF16RowsBatch(benchmark::State& st) { Run(st, DType::kBF16, true, "rows", kBatch); }
void BM_EmbeddingBackwardBF16AtomicBatch(benchmark::State& st) { Run(st, DType::kBF16, true, "atomic", kBatch); }
void BM_EmbeddingBackwardBF16AtomicNoPdlBatch(benchmark::State& st) {
  Run(st, DType::kBF16, true, "atomic_nopdl", kBatch);
}
// Atomic2s: the atomic path with the untouched rows' zero fill on the caller's stream overlapping
// the index preparation and touched rows' sums on a high-priority side stream.
void BM_EmbeddingBackwardBF16Atomic2sBatch(benchmark::State& st) { Run(st, DType::kBF16, true, "atomic2s", kBatch); }
void BM_EmbeddingBackwardBF16Atomic2sHotBatch(benchmark::State& st) {
  Run(st, DType::kBF16, true, "atomic2s", kBatch, false, true);
}
// Without the early fill (embedding_atomic.cu), for comparisons in one process.
void BM_EmbeddingBackwardBF16Atomic2sNoEarlyBatch(benchmark::State& st) {
  Run(st, DType::kBF16, true, "atomic2s", kBatch, false, false, true);
}
// The default backward captured into a CUDA graph and replayed: with every node at the launch
// stream's priority, and with the kernels' own priorities kept (the chain's greatest, the fill's
// least), as the executor now instantiates a compiled step.
void BM_EmbeddingBackwardBF16Atomic2sGraph(benchmark::State& st) {
  Run(st, DType::kBF16, true, "atomic2s", kBatch, false, false, false, 1);
}
void BM_EmbeddingBackwardBF16Atomic2sGraphPriority(benchmark::State& st) {
  Run(st, DType::kBF16, true, "atomic2s", kBatch, false, false, false, 2);
}
void BM_EmbeddingBackwardBF16RowsHotBatch(benchmark::State& st) {
  Run(st, DType::kBF16, true, "rows", kBatch, false, true);
}
void BM_EmbeddingBackwardBF16AtomicHotBatch(benchmark::State& st) {
  Run(st, DType::kBF16, true, "atomic", kBatch, false, true);
}
void BM_EmbeddingBackwardZeroFillBatch(benchmark::State& st) { Run(st, DType::kBF16, true, "", kBatch, true); }

#ifdef SG_EMB_TIMELINE
// The timeline of atomic2s's kernels (embedding_timeline.h) over kBatch back-to-back calls: for
// each kernel, "<name>_start", "_waited" and "_end", us after the call's first kernel started,
// and "call_us", that to the next call's first start; medians over the calls after the first and
// the iterations. no_early: SG_EMBEDDING_EARLY_FILL=0.
void RunTimeline(benchmark::State& state, bool no_early) {
  Setup s;
  if (!s.device.is_cuda()) return state.SkipWithError("no CUDA device");
  setenv("SG_EMBEDDING_BWD", "atomic2s", 1);
  if (no_early) setenv("SG_EMBEDDING_EARLY_FILL", "0", 1);
  const int64_t n = state.range(0), vocab = state.range(1), dim = state.range(2);
  std::vector<double> idv;
  for (int64_t i = 0; i < n; ++i) idv.push_back(double(testing::Rng()() % uint64_t(vocab)));
  Tensor ids = testing::FromHost(idv, {n}, DType::kI32, s.device);
  Tensor dout = testing::RandomTensor({n, dim}, DType::kBF16, s.device, testing::Rng());
  Tensor dtable = Tensor::Empty({vocab, dim}, DType::kF32, s.device).value();
  using T = EmbeddingTimeline;
  std::vector<double> at[T::kKernels][3], call;  // us after the call's first start
  for (auto _ : state) {
    absl::Status st = EmbeddingTimelineReset();
    for (int c = 0; c < kBatch && st.ok(); ++c) st = EmbeddingBackward(dout, ids, dtable, s.stream);
    absl::StatusOr<T> t = st.ok() ? EmbeddingTimelineRead() : absl::StatusOr<T>(st);
    if (!t.ok()) return state.SkipWithError(std::string(t.status().message()).c_str());
    auto first = [&](int c) {
      uint64_t f = ~0ull;
      for (int k = 0; k < T::kKernels; ++k) f = std::min(f, t->start[k][c]);
      return f;
    };
    for (int c = 1; c + 1 < kBatch && c + 1 < T::kCalls; ++c) {
      const uint64_t f = first(c);
      call.push_back(double(first(c + 1) - f) / 1e3);
      for (int k = 0; k < T::kKernels; ++k) {
        const uint64_t v[3] = {t->start[k][c], t->waited[k][c], t->end[k][c]};
        for (int w = 0; w < 3; ++w) {
          if (v[w] != ~0ull && v[w] != 0) at[k][w].push_back((double(v[w]) - double(f)) / 1e3);
        }
      }
    }
    state.SetIterationTime(1e-6 * testing::Median(call));
  }
  const char* what[3] = {"_start", "_waited", "_end"};
  for (int k = 0; k < T::kKernels; ++k) {
    for (int w = 0; w < 3; ++w) {
      if (!at[k][w].empty()) state.counters[std::string(kEmbeddingTimelineNames[k]) + what[w]] = testing::Median(at[k][w]);
    }
  }
  state.counters["call_us"] = testing::Median(call);
  unsetenv("SG_EMBEDDING_BWD");
  if (no_early) unsetenv("SG_EMBEDDING_EARLY_FILL");
}
void BM_EmbeddingBackwardTimeline(benchmark::State& st) { RunTimeline(st, false); }
void BM_EmbeddingBackwardTimelineNoEarly(benchmark::State& st) { RunTimeline(st, true); }
BENCHMARK(BM_EmbeddingBackwardTimeline)->Args({16384, 32000, 2048})->Args({16384, 32000, 8})->UseManualTime();
BENCHMARK(BM_EmbeddingBackwardTimelineNoEarly)->Args({16384, 32000, 2048})->Args({16384, 32000, 8})->UseManualTime();
#endif

// Llama-1B: 16384 tokens, vocab 32000 (and 128256), dim 2048; a small CPU-sized case. The backward
// also at the 124m's dim 768, and the index shapes (dim 8): almost no row-sum bytes.
#define SG_SHAPES ->Args({16384, 32000, 2048})->Args({16384, 128256, 2048})->Args({256, 1000, 256})->UseManualTime()
#define SG_BWD_SHAPES SG_SHAPES->Args({16384, 32000, 768})->Args({16384, 32000, 8})->Args({16384, 128256, 8})
BENCHMARK(BM_EmbeddingForwardBF16) SG_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16) SG_SHAPES;
BENCHMARK(BM_EmbeddingForwardF32) SG_SHAPES;
BENCHMARK(BM_EmbeddingForwardBF16Batch) SG_SHAPES;
BENCHMARK(BM_EmbeddingForwardF32Batch) SG_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16RowsBatch) SG_BWD_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16AtomicBatch) SG_BWD_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16AtomicNoPdlBatch) SG_BWD_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16Atomic2sBatch) SG_BWD_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16Atomic2sNoEarlyBatch) SG_BWD_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16Atomic2sGraph) SG_BWD_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16Atomic2sGraphPriority) SG_BWD_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16RowsHotBatch) SG_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16AtomicHotBatch) SG_SHAPES;
BENCHMARK(BM_EmbeddingBackwardBF16Atomic2sHotBatch) SG_SHAPES;
BENCHMARK(BM_EmbeddingBackwardZeroFillBatch) SG_SHAPES;

}  // namespace
}  // namespace sg::kernels
