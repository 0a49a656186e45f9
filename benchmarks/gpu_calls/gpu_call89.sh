#!/usr/bin/env bash
# Ran 2026-12-02 18:47:35-18:49:46 (results: benchmarks/README.md; its second part stopped on the
# "graph" CSV counter, removed since). Prepared 18:46.
# One H200, ~3 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt"
# //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark).
# Issue #3: the embedding backward as a compiled step runs it. The trainer replays the whole step
# as one CUDA graph, instantiated without node priorities (compiler/executor.cc: only with
# SG_WGRAD_PRIORITY), so atomic2s's launch priorities (the chain's greatest, the fill's least) are
# dropped in the replay. New benchmarks: the 10-call batch captured once and replayed
# (Atomic2sGraph), and the same keeping the node priorities (Atomic2sGraphPriority), beside the
# stream batch (Atomic2sBatch), interleaved in one process, two processes. Predicted: the graph's
# edges are cheaper than the stream's event waits and launches (1-3 us a call faster with the
# priorities kept); without them the fill's CTAs may take the SMs ahead of the chain's (slower).
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
export BM_TIMEOUT=300 BM_REPS=3
I='--benchmark_enable_random_interleaving=true'
bm 1_a 'Atomic2s(Batch|Graph|GraphPriority)/16384/32000/2048/' $I --benchmark_min_time=0.2
bm 1_b 'Atomic2s(Batch|Graph|GraphPriority)/16384/32000/2048/' $I --benchmark_min_time=0.2
BM_REPS=2 bm 2_other 'Atomic2s(Batch|Graph|GraphPriority)/16384/(128256/2048|32000/768|32000/8|128256/8)/' $I --benchmark_min_time=0.2
bm_table
t emb 150 kernels/embedding/embedding_test
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
