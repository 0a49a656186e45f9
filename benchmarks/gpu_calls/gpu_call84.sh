#!/usr/bin/env bash
# Ran 2026-12-02 05:53-05:55 (all passed: 32, 1, 24, 11 tests; 95.1 us against 97.3 without the early
# fill). Prepared 05:52. One H200, ~4 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt"
# //kernels/embedding:embedding_test //kernels/embedding:embedding_capture_first_test
# //kernels/embedding:embedding_benchmark //compiler:compile_test //compiler:llama_step_test).
# Issue #3: the chain on the caller's stream adopted (gpu_call82-83): the tests, CUDA-graph captures
# and the Llama steps with it; then the default against no early fill (which now costs the sums an
# event wait) at 32000 x 2048, 128256 x 2048 and 32000 x 768, in one process.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
export BM_TIMEOUT=200 BM_REPS=3
t embedding 120 kernels/embedding/embedding_test
t capture_first 60 kernels/embedding/embedding_capture_first_test
t compile 200 compiler/compile_test
t llama_step 200 compiler/llama_step_test
bm 1_default 'Backward.*Atomic2s(NoEarly)?Batch/16384/(32000/2048|128256/2048|32000/768)/' --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
