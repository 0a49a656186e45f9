#!/usr/bin/env bash
# One H200, ~5 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# bf16 weight gradients on a second machine: the 1b as f32 / auto (bf16) / peer / auto / f32 /
# f32 / auto, 40 steps each (every pair in both orders).
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
[[ -f .gpu_all.tar.xz ]] && { rm -rf .gpu; tar xJf .gpu_all.tar.xz; }
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
ours_1b f32_a --steps=40 --gradients=f32
ours_1b bf16_a --steps=40
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
ours_1b bf16_b --steps=40
ours_1b f32_b --steps=40 --gradients=f32
ours_1b f32_c --steps=40 --gradients=f32
ours_1b bf16_c --steps=40
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
