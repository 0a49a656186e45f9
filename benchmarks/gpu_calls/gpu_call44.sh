#!/usr/bin/env bash
# Energy per token in the benchmarks' own JSON (benchmarks/gpu_energy.h; llama_peer.py's
# EnergyMeter): the meter's GPU test, then the 1b step, the peer, the 1b step, one H200. ~3 minutes.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //benchmarks:gpu_energy_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1)"
t gpu_energy 30 benchmarks/gpu_energy_test
ours_1b a
timeout 110 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error|no energy' "$logs/peer_1b.log" | tail -1)"
ours_1b b
grep -h "no energy" "$logs"/*.log | head -2
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
