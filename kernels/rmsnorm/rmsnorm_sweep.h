// The launch-configuration sweep shared by the RMSNorm and add+RMSNorm benchmarks (both run the
// kernels of rmsnorm_launch.h): one argument list and its decoding into a LaunchConfig.
//
//   BENCHMARK(BM_MySweep)->Apply(rmsnorm_launch::SweepArgs)->UseManualTime();
//   void BM_MySweep(benchmark::State& state) {
//     const rmsnorm_launch::LaunchConfig cfg = rmsnorm_launch::SweepConfig(state);
//     const bool backward = rmsnorm_launch::SweepBackward(state);
//     const int64_t rows = state.range(1), dim = state.range(2);
//     ...
//   }
#ifndef SGTRAIN_KERNELS_RMSNORM_RMSNORM_SWEEP_H_
#define SGTRAIN_KERNELS_RMSNORM_RMSNORM_SWEEP_H_

#include <benchmark/benchmark.h>

#include <cstdint>
#include <utility>

#include "kernels/rmsnorm/rmsnorm_launch.h"

namespace sg::kernels::rmsnorm_launch {

// Args: backward, rows, dim, max_threads, rows_per_step, ctas_per_sm (forward: 0 = one CTA per step
// of rows, n = n persistent CTAs per SM; backward: 0 = all resident, else CTAs per SM), overlap_sum
// (backward), prefetch, pdl (programmatic dependent launch of the forward / the backward's main
// kernel). The configurations earlier H200 sweeps left in contention, at the Llama-1B shape and the
// 7B width (kept short enough to run in about a minute).
inline void SweepArgs(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"bwd", "rows", "dim", "threads", "rows_step", "ctas_sm", "overlap", "prefetch", "pdl"});
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{16384, 2048}, {8192, 4096}}) {
    for (int threads : {128, 256}) {
      for (int pdl : {0, 1}) bm->Args({0, rows, dim, threads, 1, 0, 0, 0, pdl});
    }
    for (int step : {1, 2}) {
      for (int ctas : {0, 2, 4, 8}) {
        for (int pdl : {0, 1}) bm->Args({1, rows, dim, 128, step, ctas, 1, 0, pdl});
      }
      bm->Args({1, rows, dim, 128, step, 0, 0, 0, 0});  // the partial-row sum launched plainly
      bm->Args({1, rows, dim, 128, step, 0, 1, 1, 1});  // with prefetch
      bm->Args({1, rows, dim, 64, step, 0, 1, 0, 1});   // 64-thread CTAs: 4 packs a thread at dim 2048
      bm->Args({1, rows, dim, 64, step, 0, 1, 1, 1});   // the same with prefetch
    }
  }
}

inline bool SweepBackward(const benchmark::State& state) { return state.range(0) != 0; }

// Both directions' shape come from the same arguments; the other direction's fields keep defaults.
inline LaunchConfig SweepConfig(const benchmark::State& state) {
  LaunchConfig cfg;
  const bool backward = SweepBackward(state);
  cfg.max_threads = int(state.range(3));
  cfg.rows_per_step = int(state.range(4));
  cfg.fwd_max_threads = cfg.max_threads;
  cfg.fwd_rows_per_step = cfg.rows_per_step;
  (backward ? cfg.bwd_ctas_per_sm : cfg.fwd_ctas_per_sm) = int(state.range(5));
  cfg.overlap_sum = state.range(6) != 0;
  (backward ? cfg.bwd_prefetch : cfg.fwd_prefetch) = state.range(7) != 0;
  (backward ? cfg.bwd_pdl : cfg.fwd_pdl) = state.range(8) != 0;
  return cfg;
}

}  // namespace sg::kernels::rmsnorm_launch

#endif  // SGTRAIN_KERNELS_RMSNORM_RMSNORM_SWEEP_H_
