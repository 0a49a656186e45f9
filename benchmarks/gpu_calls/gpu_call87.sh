#!/usr/bin/env bash
# Ran 2026-12-02 18:31:01-18:33:38 (results: benchmarks/README.md;
# its knob was removed before committing). Prepared 18:29.
# One H200; carry [".gpu"] (gpu-bundle --flags "-c opt"
# //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark).
# Issue #3, after gpu_call86 (no knob of three gained). The touched rows' sums store each thread's
# 8 f32 sums as two float4 at 16 bytes apart, so each store instruction of a warp writes half of
# every 32-byte sector over 1 KB (the second instruction the other halves): twice the L2 write
# requests of a fill's contiguous stores for the same bytes. SG_EMB_SPLIT=1 (embedding_cuda.cuh):
# a thread's columns as 4c .. 4c + 3 and dim / 2 + 4c .. + 3, whole sectors per instruction, 8-byte
# loads. Predicted: if the sums' L2 write requests are what the two streams' shared traffic pays,
# 1-4% at 32000 x 2048 (the sums' 85 MB of stores against the fill's 177 MB); nothing otherwise.
# Variants interleaved in one process (ExpBatch/n/vocab/dim/v: v & 1 split, v & 2 hot), three
# processes at 32000 x 2048.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
SG_EMB_SPLIT=1 t emb_split 150 kernels/embedding/embedding_test
export BM_TIMEOUT=300 BM_REPS=3
I='--benchmark_enable_random_interleaving=true'
bm 1_a 'ExpBatch/16384/32000/2048/(0|1)/' $I --benchmark_min_time=0.2
bm 1_b 'ExpBatch/16384/32000/2048/(0|1)/' $I --benchmark_min_time=0.2
bm 1_c 'ExpBatch/16384/32000/2048/(0|1)/' $I --benchmark_min_time=0.2
BM_REPS=2 bm 2_other 'ExpBatch/16384/(128256/2048/(0|1|2|3)|32000/2048/(2|3)|32000/768/(0|1)|32000/8/(0|1))/' $I --benchmark_min_time=0.2
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
