#!/usr/bin/env bash
# One H200, ~5 minutes; carry [".gpu_all.tar.xz", ".gpu_old_step"]: the full pack with the attention's
# fewer instructions (Sw128DescAdvance, a warp-uniform warpgroup, the v5 backward's lse in the log2
# domain; gpu_call128.sh: the backward 3.0% faster a call), and llama_step_benchmark at 2b43709
# (before them). The 1b, new / old / peer / new / old, 30 steps each; then every cc_test.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
[[ -f .gpu_all.tar.xz ]] && { rm -rf .gpu; tar xJf .gpu_all.tar.xz; }
source benchmarks/gpu_lib.sh
old_1b() {
  timeout 120 .gpu_old_step/run benchmarks/llama_step_benchmark --config=1b --steps=30 --warmup=5 > "$logs/old_$1.log" 2>&1
  echo "old 1b $1: $(json "$logs/old_$1.log") $(grep -E 'rror' "$logs/old_$1.log" | tail -1 | cut -c1-160)"
}
ours_1b a --steps=30
old_1b a
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
ours_1b b --steps=30
old_1b b
benchmarks/gpu_tests.sh run 2>&1 | grep -v '^PASS' | tail -12
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
