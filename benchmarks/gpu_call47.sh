#!/usr/bin/env bash
# Prepared for a session with 2 H200s (~5 minutes): energy per token of the 1b FSDP step under
# 25 GiB and of FSDP2 + compile, each rank 0's GPU over the timed steps (benchmarks/gpu_energy.h;
# llama_peer.py's EnergyMeter), ours twice around the peer, with the SM clock each saw: is the
# 2-GPU step power-limited too, and what mJ/token would 1.15x need? Then the 7b the same way
# (steps=6: ~0.85 s each; since 2026-12-01 auto takes the deferred optimizer with host gradient
# shards there, which gpu_call48.sh compares with the plan before).
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
fsdp_1b a
timeout 200 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 1b --compile --fsdp --steps 12 \
  > "$logs/peer_1b_fsdp.log" 2>&1
echo "peer 1b fsdp x2: $(json "$logs/peer_1b_fsdp.log") $(grep -E 'Error|no energy' "$logs/peer_1b_fsdp.log" | tail -1)"
fsdp_1b b
SG_COMM_IPC=1 timeout 240 .gpu/run comm/launch --nproc=2 -- "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" \
  --config=7b --strategy=fsdp --recompute=auto --steps=6 --warmup=3 > "$logs/fsdp_7b.log" 2>&1
echo "fsdp 7b: $(json "$logs/fsdp_7b.log") $(grep -E 'rror' "$logs/fsdp_7b.log" | head -1 | cut -c1-200)"
timeout 240 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 7b --compile --fsdp --ac --steps 6 \
  --warmup 3 > "$logs/peer_7b_fsdp.log" 2>&1
echo "peer 7b fsdp x2: $(json "$logs/peer_7b_fsdp.log") $(grep -E 'Error|no energy' "$logs/peer_7b_fsdp.log" | tail -1)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
