#!/usr/bin/env bash
# RAN 2026-11-30 19:58 (results in benchmarks/README.md); o4 became atomic2s's default after it and the variant name was removed.
# Session 10, call 6 (1 H200): the embedding row sums with four repeated rows' loads in flight
# (SumRunsThen; the same additions in the same order), every embedding test, then atomic2s at 3 and
# at 4 CTAs per SM (o4) at the issue #3 shape, alternating, and with a hot id (where o4 had lost 25%
# with the one-load loop, gpu_call37.sh).
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t embedding 100 kernels/embedding/embedding_test
for r in 1 2; do
  bm "a$r" 'Backward.*(Atomic2s|Atomic2sO4)Batch/16384/32000/2048/'
done
bm hot 'Backward.*(Atomic2sHot|Atomic2sO4Hot)Batch/16384/32000/2048/'
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
