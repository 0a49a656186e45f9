#!/usr/bin/env bash
# One H200, ~1.5 minutes; carry [".gpu"] (gpu-bundle //kernels/wgmma_gemm:wgmma_gemm_swiglu_benchmark).
# Where the fused SwiGLU-backward epilogue's time goes (gpu_call91: 1.27 ms against 1.16 for
# cuBLASLt + SwiGluBackward): the temporary knob SG_SWIGLU_BWD_DIAG=1 drops the L2 prefetch, =2
# replaces the gate/up loads by values made from the index (stores and math only).
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
for d in 0 1 2 0; do
  SG_SWIGLU_BWD_DIAG=$d timeout 120 .gpu/run kernels/wgmma_gemm/wgmma_gemm_swiglu_benchmark \
    --benchmark_filter='BM_MlpDownSwiGluBackward/.*/mode:(1|2)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_min_time=0.2 > "$logs/diag_$d.txt" 2>&1
  echo "== diag $d rc=$?"
  grep -E "_median" "$logs/diag_$d.txt" | sed -E 's/ +/ /g; s/BM_MlpDownSwiGluBackward.M:16384.F:8192.K:2048.//' | cut -c1-200
done
echo "== done $(date -u +%FT%TZ)"
