#!/usr/bin/env bash
# Run 2026-12-01 04:47 (results in benchmarks/README.md; the knob is removed). 1 H200, ~6 minutes: issue #3's embedding backward with SG_EMBEDDING_REGSORT=1 / 2
# (kernels/embedding/embedding_atomic.cu): a CTA of the touched rows' sums whose runs all hold at
# most 3 positions (98% of them at 16384 tokens over 32000 rows) sorts them in registers instead of
# SortRuns' warp sort, barrier and reload (65% of the CTAs have a run of two or more); 1: the
# general path inlined (40 bytes spilled), 2: out of line (no spill). Predicted: 96 -> 92-94 us
# (3.5-3.6 TB/s) if the sort's two extra round trips and barrier hold the sums back; no change if,
# as v3's shorter chain suggested, the sums are bound by the bytes in flight. The embedding tests
# (bitwise, with both modes), then the modes against the default, alternating, plain, dim 8, hot,
# 128256.
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t embedding 150 kernels/embedding/embedding_test
export BM_TIMEOUT=100
for r in 1 2; do
  bm "reg_$r" 'Backward.*(Atomic2s|Atomic2sReg1|Atomic2sReg2)Batch/16384/32000/(2048|8)/'
done
bm hot 'Backward.*(Atomic2sHot|Atomic2sReg1Hot|Atomic2sReg2Hot)Batch/16384/32000/2048/'
BM_TIMEOUT=150 bm large 'Backward.*(Atomic2s|Atomic2sReg2)Batch/16384/128256/2048/'
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
