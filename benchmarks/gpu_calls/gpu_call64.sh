#!/usr/bin/env bash
# Run 2026-12-01 11:18 (results in benchmarks/README.md; the row form is removed). One H200 (~7 minutes): issue #3's embedding backward with the untouched rows' zero
# fill row by row (ZeroUntouchedRowsKernel: a row's count read once, no division per 16-byte store)
# against the per-store form (SG_EMBEDDING_FILL=div), alternating processes. The fill issues ~8
# integer divisions per thread beside the side stream's sums on the same SMs (~17 us of issue slots
# over the GPU by count). Predicted: 95.5 -> 93-95 us (3.46-3.54 TB/s) at vocab 32000 if those issue
# slots slow the sums; no change if the fill and sums are bound by DRAM alone. The embedding tests
# first (bitwise against the sorted path, poisoned outputs).
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t embedding 150 kernels/embedding/embedding_test
export BM_TIMEOUT=100
filter='Backward.*Atomic2s(Hot)?Batch/16384/(32000|128256)/2048/'
for i in 1 2; do
  unset SG_EMBEDDING_FILL
  bm "${i}a_rows" "$filter"
  export SG_EMBEDDING_FILL=div
  bm "${i}b_div" "$filter"
done
unset SG_EMBEDDING_FILL
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
