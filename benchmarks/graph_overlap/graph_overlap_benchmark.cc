// The graph-overlap probe (graph_overlap.h) eager and replayed, with and without a kernel in the
// copy chain, and with the update stream at the greatest priority (node priorities kept):
//   bazel-bin/benchmarks/graph_overlap/graph_overlap_benchmark
// Each row reports ms (one run after an untimed one) and the ideal: the compute alone
// (compute_kernels x kernel_us) or the copies alone (at 55 GB/s), whichever is longer.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>

#include "benchmarks/graph_overlap/graph_overlap.h"

namespace sg::benchmarks {
namespace {

void BM_Overlap(benchmark::State& state, bool update_kernels, bool graph, bool priority, bool on_copy = false,
                int slots = 2, bool outside = false) {
  OverlapProbe p;
  p.chain_outside_graph = outside;
  p.kernels_on_copy_stream = on_copy;
  p.slots = slots;
  p.update_kernels = update_kernels;
  p.graph = graph;
  p.priority = priority;
  double ms = 0;
  for (auto _ : state) {
    absl::StatusOr<double> t = RunOverlapProbe(p);
    if (!t.ok()) {
      state.SkipWithError(std::string(t.status().message()).c_str());
      return;
    }
    ms = *t;
    state.SetIterationTime(ms / 1e3);
  }
  const double compute_ms = p.compute_kernels * p.kernel_us / 1e3;
  const double copy_ms = p.copies * double(p.copy_bytes) / 55e9 * 1e3;
  state.counters["ms"] = ms;
  state.counters["ideal_ms"] = std::max(compute_ms, copy_ms);
  state.counters["serial_ms"] = compute_ms + copy_ms;
}

BENCHMARK_CAPTURE(BM_Overlap, copies_eager, false, false, false)->UseManualTime()->Iterations(3);
BENCHMARK_CAPTURE(BM_Overlap, copies_graph, false, true, false)->UseManualTime()->Iterations(3);
BENCHMARK_CAPTURE(BM_Overlap, copies_kernels_eager, true, false, false)->UseManualTime()->Iterations(3);
BENCHMARK_CAPTURE(BM_Overlap, copies_kernels_graph, true, true, false)->UseManualTime()->Iterations(3);
BENCHMARK_CAPTURE(BM_Overlap, copies_kernels_eager_priority, true, false, true)->UseManualTime()->Iterations(3);
BENCHMARK_CAPTURE(BM_Overlap, copies_kernels_graph_priority, true, true, true)->UseManualTime()->Iterations(3);
BENCHMARK_CAPTURE(BM_Overlap, copies_kernels_on_copy_stream_eager, true, false, false, true)
    ->UseManualTime()
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_Overlap, copies_kernels_on_copy_stream_graph, true, true, false, true)
    ->UseManualTime()
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_Overlap, copies_kernels_4_slots_graph, true, true, false, false, 4)->UseManualTime()->Iterations(3);
// The chain enqueued eagerly before each launch of a graph of the compute alone (external waits).
BENCHMARK_CAPTURE(BM_Overlap, copies_kernels_outside_graph, true, true, false, false, 2, true)
    ->UseManualTime()
    ->Iterations(3);

}  // namespace
}  // namespace sg::benchmarks
