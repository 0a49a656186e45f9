#!/usr/bin/env bash
# One H200, ~7 minutes; carry [".gpu", ".gpu_caches"] (gpu-bundle of llama_step_benchmark; the 1b's
# energy-ranked cache from gpu_call115.sh in .gpu_caches/energy_1b).
# A wider energy ranking: the heuristic's top 16 timed, up to 8 within 1.3x of the fastest
# re-ranked over 600 ms windows, GEMMs from 40 us; then narrow (gpu_call115's 4 within 1.15x from
# 150 us) / wide / peer / wide / narrow, 40 steps each.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
cn=/tmp/cache_narrow; rm -rf "$cn"; cp -r .gpu_caches/energy_1b "$cn"
cw=$out/cache_wide
OURS_TIMEOUT=450 ours_1b wide_tune --steps=40 --autotune_energy_ms=600 --autotune_energy_within=1.3 \
  --autotune_energy_candidates=8 --autotune_energy_min_us=40 --cache_dir="$cw"
grep -c "^energy tune:" "$logs/ours_wide_tune.log"
grep "^metered choice" "$logs/ours_wide_tune.log" | sed 's/,batch=1.*align=[0-9/]*//' | head -40
ours_1b narrow_a --steps=40 --cache_dir="$cn"
ours_1b wide_a --steps=40 --cache_dir="$cw"
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
ours_1b wide_b --steps=40 --cache_dir="$cw"
ours_1b narrow_b --steps=40 --cache_dir="$cn"
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
