#!/usr/bin/env bash
# One H200, ~1.5 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //kernels/wgmma_gemm/...).
# After gpu_call93: the fused SwiGLU-backward epilogue now TMA-loads gate/up into two box pairs per
# warpgroup (computed and stored in place), on a 3-stage ring; its tests, then, as in gpu_call93,
# BM_MlpDownSwiGluBackward's step form, our unfused form and the
# fused one, interleaved.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
t wgmma 120 kernels/wgmma_gemm/wgmma_gemm_test
t wgmma_swiglu 300 kernels/wgmma_gemm/wgmma_gemm_swiglu_test
timeout 150 .gpu/run kernels/wgmma_gemm/wgmma_gemm_swiglu_benchmark \
  --benchmark_filter='BM_MlpDownSwiGluBackward/.*/mode:(0|1|2)/' --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_min_time=0.2 --benchmark_enable_random_interleaving=true \
  > "$logs/down.txt" 2>&1
echo "== down rc=$?"
grep -E "_median" "$logs/down.txt" | sed -E 's/ +/ /g; s/BM_MlpDownSwiGluBackward.M:16384.F:8192.K:2048.//' | cut -c1-200
echo "== done $(date -u +%FT%TZ)"
