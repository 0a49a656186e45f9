#!/usr/bin/env bash
# 2026-12-01, 2 H200s (~9 minutes): gpu_call56.sh's one-GPU questions on GPU 0 (the graph-overlap
# probe, the copies back outside the replayed graph: CUDA tests and the 7b over one GPU, knob 1 vs 0),
# then gpu_call47.sh's 1b FSDP half (ours, the peer, ours: tokens/s, memory, mJ/token).
# Bundle: gpu-bundle --flags "-c opt" //benchmarks/graph_overlap:graph_overlap_benchmark
#         //benchmarks:llama_step_benchmark //comm:launch //compiler:distributed_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
CUDA_VISIBLE_DEVICES=0 OUT=$out bash benchmarks/gpu_call56.sh 2>&1 | grep -v "^== done"
mkdir -p "$logs"
fsdp_1b a
timeout 200 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 1b --compile --fsdp --steps 12 \
  > "$logs/peer_1b_fsdp.log" 2>&1
echo "peer 1b fsdp x2: $(json "$logs/peer_1b_fsdp.log") $(grep -E 'Error|no energy' "$logs/peer_1b_fsdp.log" | tail -1)"
fsdp_1b b
tar czf "$out/logs2.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
