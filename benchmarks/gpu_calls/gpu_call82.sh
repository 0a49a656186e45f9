#!/usr/bin/env bash
# Ran 2026-12-02 05:20-05:24 (results: benchmarks/README.md, "2026-12-02 05:12-05:55"; the knobs were
# removed before the adoption was committed; the script is kept as the record).
# Prepared 05:18. One H200, ~5 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt"
# //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark).
# Issue #3. gpu_call81's timeline (instrumented build): each side-stream kernel started ~3.8 us after
# the one before it ended (1.5-1.8 us at dim 8, where no fill competes), and the scan 3.6 us after
# the count (the cross-stream fork). Two experiment knobs (embedding_atomic.cu, temporary):
# SG_EMB_TRIGGER, kernels that trigger their programmatic dependents at their start, and
# SG_EMB_CHAIN=caller, the whole chain (zero, count, scan, scatter, sums) on the caller's stream by
# PDL at the greatest priority and the fill on the side stream (no fork on the chain's path).
# Predicted: up to 2-4 us off 94 if the gaps are launch latency. Tests first with the knobs on.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
export BM_TIMEOUT=200 BM_REPS=3
SG_EMB_CHAIN=caller SG_EMB_TRIGGER=15 t emb_caller15 120 kernels/embedding/embedding_test
SG_EMB_TRIGGER=12 t emb_side12 120 kernels/embedding/embedding_test
bm 1_32000 'Atomic2sExpBatch/16384/32000/2048/' --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2
BM_REPS=2 bm 2_other 'Atomic2sExpBatch/16384/(128256/2048|32000/8)/' --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
