#!/usr/bin/env bash
# Ran 2026-12-02 00:03 (benchmarks/README.md); the temporary PlainFill benchmark is removed since.
# 2026-12-02, one H200 (~4 minutes): the zero fill's evict-first stores (the default where
# tokens * 4 >= vocab) against plain stores (a temporary benchmark setting SG_EMBEDDING_FILL_CS=0),
# in the same processes with random interleaving, 5 repetitions, three processes; gpu_call69/70
# compared them across processes only (94.0-98.2 us against 95.8-98.7).
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
export BM_TIMEOUT=150 BM_REPS=5
il=--benchmark_enable_random_interleaving=true
for i in 1 2 3; do bm "${i}_32000" 'Backward.*Atomic2s(PlainFill)?Batch/16384/32000/2048/' $il; done
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
