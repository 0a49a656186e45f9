#!/usr/bin/env bash
# Ran 2026-12-02 03:06-03:11 (results in benchmarks/README.md): the early fill at 8 KB - 4 MB and at
# the greatest priority against none, at 16384 of 32000 x 2048, interleaved in each of two processes.
# Its Early* variants were removed when the early fill was adopted: it no longer runs as written.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ)"
export BM_TIMEOUT=280 BM_REPS=3
il=--benchmark_enable_random_interleaving=true
bm 1_32000 'Backward.*Atomic2s(Early[0-9]+(least|greatest))?Batch/16384/32000/2048/' $il
bm 2_32000 'Backward.*Atomic2s(Early[0-9]+(least|greatest))?Batch/16384/32000/2048/' $il
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
