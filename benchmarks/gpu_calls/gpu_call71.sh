#!/usr/bin/env bash
# Ran 2026-12-01 23:56 (benchmarks/README.md); "bucket" and its benchmarks are removed since.
# 2026-12-02, one H200 (~7 minutes): issue #3's embedding backward, "bucket" (embedding_atomic.cu:
# the count keeps each row's first four positions, one kernel sums the touched rows and zeroes the
# rest, no scan, scatter or side stream) against the default atomic2s, in the same processes with
# Google Benchmark's random interleaving (gpu_call70 found 94.3-98.7 us between processes of one
# binary, 0.1-0.5 us within one). Prediction: 86-92 us at 16384 of 32000 x 2048 (3.6-3.8 TB/s),
# if the zero stores fill the time the sums' loads are in flight; no better at 128256, where
# atomic2s's fill already streams at 4.0 TB/s. First the embedding tests (every backward, bucket
# included, bitwise against the sorted path and the CPU reference).
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t embedding 240 kernels/embedding/embedding_test
export BM_TIMEOUT=150 BM_REPS=5
il=--benchmark_enable_random_interleaving=true
bm 1_32000 'Backward.*(Atomic2s|Bucket)Batch/16384/32000/2048/' $il
bm 2_32000 'Backward.*(Atomic2s|Bucket)Batch/16384/32000/2048/' $il
BM_REPS=3 bm 3_128256 'Backward.*(Atomic2s|Bucket)Batch/16384/128256/2048/' $il
BM_REPS=3 bm 4_hot 'Backward.*(Atomic2s|Bucket)HotBatch/16384/32000/2048/' $il
BM_REPS=3 bm 5_dim8 'Backward.*(Atomic2s|Bucket)Batch/16384/(32000|128256)/8/' $il
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
