#!/usr/bin/env bash
# One H200, ~3 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //kernels/core:core_test
# //compiler:compile_test //kernels/wgmma_gemm/... //kernels/swiglu:swiglu_test).
# 1. CudaGraph moved into kernels/core: its new CUDA tests, and the executor's captured steps
#    (compile_test) through it.
# 2. The new SwiGLU-backward epilogue (WgmmaGemmSwiGluBackward: dh = dy W2 and SwiGLU's backward in
#    one kernel, dh never written) and TransposeMatrix: their tests (bitwise against WgmmaGemm +
#    SwiGluBackward, double reference), then BM_MlpDownSwiGluBackward at the 1b shape against
#    cuBLASLt + SwiGluBackward (the step's form), two processes.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
t core 120 kernels/core/core_test
t compile 300 compiler/compile_test
t swiglu 120 kernels/swiglu/swiglu_test
t wgmma 120 kernels/wgmma_gemm/wgmma_gemm_test
t wgmma_swiglu 300 kernels/wgmma_gemm/wgmma_gemm_swiglu_test
grep -E "CudaGraphTest|Backward" "$logs/core.log" "$logs/wgmma_swiglu.log" | grep -E "OK|FAILED|SKIPPED" | cut -c1-160
for p in a b; do
  timeout 200 .gpu/run kernels/wgmma_gemm/wgmma_gemm_swiglu_benchmark --benchmark_filter='BM_MlpDownSwiGluBackward' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_min_time=0.2 \
    --benchmark_enable_random_interleaving=true > "$logs/down_$p.txt" 2>&1
  echo "== down $p rc=$?"
  grep -E "_median" "$logs/down_$p.txt" | sed -E 's/ +/ /g' | cut -c1-220
done
echo "== done $(date -u +%FT%TZ)"
