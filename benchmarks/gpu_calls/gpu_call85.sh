#!/usr/bin/env bash
# Ran 2026-12-02 06:12-06:14 (29 tests passed; 94.8 / 94.5 us). Prepared 06:10. One H200, ~2 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt"
# //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark).
# After scan3's removal (3d83b1a): the embedding tests, then the default backward at the Llama-1B
# shape in two more processes (the spread between processes is most of #3's remaining question).
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
export BM_TIMEOUT=100 BM_REPS=3
t embedding 120 kernels/embedding/embedding_test
bm 1_a 'Backward.*Atomic2sBatch/16384/(32000|128256)/2048/' --benchmark_min_time=0.2
bm 2_b 'Backward.*Atomic2sBatch/16384/(32000|128256)/2048/' --benchmark_min_time=0.2
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
