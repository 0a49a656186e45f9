#!/usr/bin/env bash
# Prepared 2026-12-01 for the next session (1 H200, under a minute; gpu_call56.sh includes it): the graph-overlap probe with
# its new variant, the copy chain (copies and the short kernels that free the slots) enqueued
# eagerly before each launch of a graph of the compute alone, whose waits are external event-wait
# nodes (cudaEventWaitExternal). The 05:40 runs: chain in the graph 23.87 ms, eager 20.4, ideal
# 19.2. Predicted: ~20.4 if external waits keep the overlap; then the FSDP deferred optimizer's
# copies back could move out of the captured step the same way (compiler/fsdp.cc) and its steps
# be replayed again (~1.6% at 7b over one GPU).
# Bundle: gpu-bundle --flags "-c opt" //benchmarks/graph_overlap:graph_overlap_benchmark
set -u
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout 120 .gpu/run benchmarks/graph_overlap/graph_overlap_benchmark 2>&1 | grep "^BM_" |
  sed 's/ \+[0-9]* ns \+[0-9]* ns \+3//'
echo "== done $(date -u +%FT%TZ)"
