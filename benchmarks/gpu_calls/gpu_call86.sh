#!/usr/bin/env bash
# Ran 2026-12-02 18:19:57-18:25:41 (results: benchmarks/README.md;
# its knobs were removed before committing). Prepared 18:19.
# One H200; carry [".gpu"] (gpu-bundle --flags "-c opt"
# //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark).
# Issue #3, the embedding backward's last ~1% (94.5-95.2 us at 16384 of 32000 x 2048; the line is
# 94.2). Three knobs (EXPERIMENT lines in embedding_atomic.cu), every variant interleaved in one
# process (BM_EmbeddingBackwardExpBatch/n/vocab/dim/variant):
#  - the early fill's size (SG_EMB_EARLY_BYTES): since the chain moved to the caller's stream a
#    larger early fill no longer delays it; the memory sits nearly idle from the count's start to
#    the fork's fill (~4-6 us). Predicted: 8-16 MB early 1-2 us faster (93-94 us), 24 MB no better
#    (40% of the early rows are written twice);
#  - SG_EMB_SUMS8: 8 listed rows per sums CTA at the same 4 CTAs per SM (heads raw, ids and runs in
#    shared memory; 64 registers, no spill for bf16), half the CTAs for the same bytes. Predicted:
#    0-3% if the per-CTA index chain and sort barrier are what the sums' rate pays; nothing if not
#    (the lean sums' result suggests the bytes in flight are not it);
#  - the fill's CTA size (SG_EMB_FILL_VECS 512 / 2048 against 1024, chosen in the old layout).
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader | head -1)"
SG_EMB_SUMS8=1 SG_EMB_EARLY_BYTES=16777216 t emb_sums8_early16 150 kernels/embedding/embedding_test
SG_EMB_FILL_VECS=512 t emb_fill512 150 kernels/embedding/embedding_test
export BM_TIMEOUT=300 BM_REPS=3
I='--benchmark_enable_random_interleaving=true'
bm 1_32000 'ExpBatch/16384/32000/2048/' $I --benchmark_min_time=0.2
BM_REPS=2 bm 2_other 'ExpBatch/16384/(128256/2048/(0|3|4|5|7|8|11|12)|32000/768/(0|3|4|7)|32000/8/(0|7)|128256/8/(0|7))/' $I --benchmark_min_time=0.2
bm 3_32000b 'ExpBatch/16384/32000/2048/(0|3|4|5|7|8)/' $I --benchmark_min_time=0.2
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
