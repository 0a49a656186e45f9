#!/usr/bin/env bash
# Ran 2026-12-02 03:14-03:20 (results in benchmarks/README.md). Its Early0* variants were removed
# when the early fill was adopted (the benchmark's Atomic2sNoEarly is the default without it): this
# script no longer runs as written.
# Prepared 2026-12-02 03:15. One H200, ~7 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt"
# //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark). gpu_call76/77 found
# the early fill's gain (~2-3 us at 16384 of 32000 x 2048) the same from 8 KB to 4 MB, so it is not
# its bytes. Now the default starts the side stream with one fill CTA's rows (16 KB) at the call's
# entry. Against it, in one process each (random interleaving): no early fill (Early0leastCold),
# and the entry wait without a kernel (Early0wait); then at 128256, at dim 8 and with a hot id,
# default against off. The embedding tests run first, on the new default.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
export BM_TIMEOUT=250 BM_REPS=3
il=--benchmark_enable_random_interleaving=true
t embedding 200 kernels/embedding/embedding_test
bm 1_32000 'Backward.*Atomic2s(Early0wait|Early0leastCold)?Batch/16384/32000/2048/' $il
bm 2_32000 'Backward.*Atomic2s(Early0wait|Early0leastCold)?Batch/16384/32000/2048/' $il
bm 3_other 'Backward.*Atomic2s(Early0leastHot|Hot)Batch/16384/32000/2048/|Backward.*Atomic2s(Early0leastCold)?Batch/16384/(128256/2048|32000/8|128256/8)/' $il
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
