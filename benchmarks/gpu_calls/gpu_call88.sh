#!/usr/bin/env bash
# Ran 2026-12-02 18:37:51-18:40:37 (results: benchmarks/README.md;
# its knob was removed before committing). Prepared 18:37.
# One H200; carry [".gpu"] (gpu-bundle --flags "-c opt"
# //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark).
# Issue #3, after gpu_call86-87. The numbers so far: each stream alone (one stream's last kernel
# left out, 2026-12-01) took 65.0 us (chain, its sums ~38 us of it) and 47.1 us (the fill's); both
# together 94-95, so the sums and the fill mixed are ~12% less efficient than each alone.
# SG_EMB_SERIAL=1: the caller's stream waits on the fill's join before the sums (the fill beside
# the scan and scatter only, the sums alone after it). Predicted 86-90 us at 32000 x 2048 (47 + 38
# + the wait) if the mixed phase's inefficiency is the gap; slower at dim 768 / 8, where the fill is
# short and the wait is on the path. Variants interleaved (ExpBatch/n/vocab/dim/v: v & 1 serial,
# v & 2 hot, v & 4 no early fill), two processes at 32000 x 2048.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
SG_EMB_SERIAL=1 t emb_serial 150 kernels/embedding/embedding_test
export BM_TIMEOUT=300 BM_REPS=3
I='--benchmark_enable_random_interleaving=true'
bm 1_a 'ExpBatch/16384/32000/2048/(0|1|4|5)/' $I --benchmark_min_time=0.2
bm 1_b 'ExpBatch/16384/32000/2048/(0|1)/' $I --benchmark_min_time=0.2
BM_REPS=2 bm 2_other 'ExpBatch/16384/(128256/2048/(0|1|2|3)|32000/2048/(2|3)|32000/768/(0|1)|32000/8/(0|1)|128256/8/(0|1))/' $I --benchmark_min_time=0.2
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
