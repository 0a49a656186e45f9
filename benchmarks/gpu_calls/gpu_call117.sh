#!/usr/bin/env bash
# One H200, ~5 minutes; carry [".gpu", ".gpu_caches"] (the energy-ranked caches of gpu_call115.sh
# (narrow) and gpu_call116.sh (wide)).
# Does the energy ranking hold on another machine? time-ranked (tuned fresh in the first run) /
# narrow / wide, interleaved T N W T N W N T, 40 steps each, and the peer.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
ct=/tmp/cache_time; cn=/tmp/cache_narrow; cw=/tmp/cache_wide
rm -rf "$ct" "$cn" "$cw"; cp -r .gpu_caches/energy_1b "$cn"; cp -r .gpu_caches/wide_1b "$cw"
ours_1b time_a --steps=40 --cache_dir="$ct"
ours_1b narrow_a --steps=40 --cache_dir="$cn"
ours_1b wide_a --steps=40 --cache_dir="$cw"
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
ours_1b time_b --steps=40 --cache_dir="$ct"
ours_1b narrow_b --steps=40 --cache_dir="$cn"
ours_1b wide_b --steps=40 --cache_dir="$cw"
ours_1b narrow_c --steps=40 --cache_dir="$cn"
ours_1b time_c --steps=40 --cache_dir="$ct"
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
