// The timing loop every kernel benchmark shares: `calls` back-to-back calls per Google Benchmark
// iteration, CUDA events around them on a GPU (the wall clock on the CPU), after 50 ms of untimed
// calls so the GPU's clocks are up from idle and lazily loaded kernels are loaded. Reports the
// bandwidth in decimal TB/s from the mean time per call (`mean_TBps`) and from the median
// (`median_TBps`, the statistic the PyTorch peers print). SG_BENCH_HOLD=1 holds the stream
// (testing::StreamHold) while each batch is enqueued, so the events exclude host launch gaps.
//
//   void BM_MyKernel(benchmark::State& state) {
//     ...
//     sg::testing::TimeCalls(state, stream, /*calls=*/10, /*bytes_per_call=*/3 * n * 2,
//                            [&] { return MyKernel(x, y, stream); });
//   }
//   BENCHMARK(BM_MyKernel)->UseManualTime();
#ifndef SGTRAIN_KERNELS_CORE_BENCHMARK_TIMING_H_
#define SGTRAIN_KERNELS_CORE_BENCHMARK_TIMING_H_

#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "kernels/core/stream.h"

namespace sg::testing {

// Times `fn` (one call of the kernel under test, enqueued on `stream`) as described above and sets
// the iteration time per call and the bytes processed. The first error skips the benchmark with
// its message.
void TimeCalls(benchmark::State& state, const Stream& stream, int calls, int64_t bytes_per_call,
               const std::function<absl::Status()>& fn);

// TimeCalls with the `calls` calls captured once into a CUDA graph (after the eager warm-up, so
// whatever `fn` creates on first use exists) and each iteration one replay, as a compiled
// training step runs them. `node_priority`: the replays keep each kernel's launch priority
// (cudaGraphInstantiateFlagUseNodePriority); otherwise every node runs at the launch stream's.
// Blocks `fn` frees inside the capture stay reserved for the graph's lifetime. A CUDA stream only.
void TimeGraphReplays(benchmark::State& state, const Stream& stream, int calls, int64_t bytes_per_call,
                      const std::function<absl::Status()>& fn, bool node_priority);

}  // namespace sg::testing

#endif  // SGTRAIN_KERNELS_CORE_BENCHMARK_TIMING_H_
