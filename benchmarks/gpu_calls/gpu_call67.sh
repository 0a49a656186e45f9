#!/usr/bin/env bash
# Run 2026-12-01 22:05 on a build with "atomic2c" (since removed; results and its design in benchmarks/README.md).
# One H200 (~5 minutes): issue #3's embedding backward with the touched rows' sums by a persistent
# grid ("atomic2c": ChunkSumTouchedKernel, each CTA a share of the touched list with its runs'
# positions in shared memory and 8 dout loads in flight per thread) against atomic2s (a CTA per
# four listed rows, a chain of dependent round trips before any dout load), alternating processes.
# Prediction: the sums stop being latency-bound, so the side stream no longer outlasts the zero
# fill by ~20 us alone at ~2.7 TB/s: 95.5 us -> 80-88 us (3.7-4.1 TB/s) at vocab 32000; the dim-8
# shape (the index preparation alone) a little faster (fewer CTAs); hot ids unchanged (the hot row
# is one long chain either way). Then the grid at 2 and 3 CTAs per SM. The embedding tests first
# (every backward bitwise against the sorted path and the CPU, poisoned outputs).
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t embedding 200 kernels/embedding/embedding_test
export BM_TIMEOUT=120
filter='Backward.*(Atomic2s|Atomic2c|ZeroFill)(Hot)?Batch/16384/(32000|128256)/(2048|8)/'
for i in 1 2; do
  bm "${i}_both" "$filter"
done
for k in 2 3; do
  SG_EMBEDDING_CHUNK_CTAS=$k bm "ctas$k" 'Backward.*Atomic2c(Hot)?Batch/16384/(32000|128256)/2048/'
done
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
