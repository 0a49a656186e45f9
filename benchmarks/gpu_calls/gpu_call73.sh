#!/usr/bin/env bash
# Ran 2026-12-02 00:09, then 512 / 1024 / 2048 and, at vocab 128256, 1024 / 2048 by hand in the same
# session (benchmarks/README.md); the temporary knob and benchmarks are removed since, 1024 adopted.
# 2026-12-02, one H200 (~5 minutes), warm: atomic2s's zero-fill CTA size (kZeroVecs, 2048 float4 =
# 32 KB of rows) against 1024, 4096, 8192 (a temporary SG_EMBEDDING_FILL_VECS), random interleaving
# in each of two processes, 4 repetitions, 16384 of 32000 x 2048.
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
export BM_TIMEOUT=200 BM_REPS=4
il=--benchmark_enable_random_interleaving=true
for i in 1 2; do bm "${i}_32000" 'Backward.*Atomic2s(Fill[0-9]+)?Batch/16384/32000/2048/' $il; done
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
