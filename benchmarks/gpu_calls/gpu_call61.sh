#!/usr/bin/env bash
# 2026-12-01, one H200 (~4 minutes): the 1b single-device step under the 32 GiB default with
# ChooseRecompute's new order (selective without SwiGLU recompute, the fewest kept activations
# offloaded: 6, 31.59 GiB planned) against the plan before (SwiGLU recomputed in 3 layers, 31.76 GiB
# measured), alternating on one GPU, with the torch.compile peer between. Predicted from
# gpu_call60.sh (8 offloads): +0.2-0.5% and ~0.2 GiB less; the same losses.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
before=(--recompute=selective --recompute_swiglu_layers=3)
ours_1b new_a
ours_1b before_a "${before[@]}"
timeout 110 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error|no energy' "$logs/peer_1b.log" | tail -1)"
ours_1b before_b "${before[@]}"
ours_1b new_b
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
