#!/usr/bin/env bash
# Ran 2026-12-02 05:46-05:48 (results: benchmarks/README.md; its knobs were removed before
# committing). Prepared 05:40. One H200, ~6 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt"
# //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark).
# Issue #3, after gpu_call82 (the chain on the caller's stream: no gain at dim 2048, -12% at dim 8).
# New knob SG_EMB_SUMS_SMEM: dynamic shared memory per sums CTA so only 3 (53248) or 2 (71680) fit
# an SM, leaving registers and thread slots for the fill's CTAs beside them (at 4 per SM the sums
# take the whole register file, so the two streams alternate on each SM instead of sharing it).
# Predicted: 90-93 us at 32000 x 2048 if the fill's stores then run beside the sums' loads; the
# larger carveout (smaller L1) may cost what it gains. Also the 124m's dim 768.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
export BM_TIMEOUT=200 BM_REPS=3
SG_EMB_CHAIN=caller SG_EMB_TRIGGER=7 SG_EMB_SUMS_SMEM=53248 t emb_caller7 120 kernels/embedding/embedding_test
bm 1_32000 'Atomic2sExpBatch/16384/32000/2048/(0|3|4|7|8|9|10)/' --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2
BM_REPS=2 bm 2_other 'Atomic2sExpBatch/16384/(128256/2048/(0|4|7|9)|32000/768/(0|4|7|9)|128256/8/(0|4))/' --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
