#!/usr/bin/env bash
# One H200, ~10 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# Every cc_test with bf16 weight gradients in (the trainer's and the benchmark's --gradients=auto),
# then the 124m as auto (bf16) / f32 / peer / f32 / auto, then the 1b's energy profile with bf16
# gradients at 1 s windows, against gpu_call106.sh's with f32 gradients.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
benchmarks/gpu_tests.sh run 2>&1 | grep -v '^PASS'
source benchmarks/gpu_lib.sh
m124() {
  timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=124m --steps=40 --warmup=5 "${@:2}" > "$logs/m_$1.log" 2>&1
  echo "ours 124m $1: $(json "$logs/m_$1.log")"
}
m124 auto_a
m124 f32_a --gradients=f32
timeout 150 python3 benchmarks/llama_peer.py --config 124m --compile --steps 30 --warmup 8 > "$logs/peer_124m.log" 2>&1
echo "peer 124m: $(json "$logs/peer_124m.log") $(grep -E 'Error' "$logs/peer_124m.log" | tail -1)"
m124 f32_b --gradients=f32
m124 auto_b
timeout 400 .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=20 --warmup=5 --energy_profile_ms=1000 \
  > "$logs/p1b.log" 2>&1
echo "p1b rc=$?: $(json "$logs/p1b.log") $(grep -E 'rror' "$logs/p1b.log" | tail -1 | cut -c1-200)"
grep -E '^snapshot|^energy profile' "$logs/p1b.log"
sed -n '/^alone:/,$p' "$logs/p1b.log" | grep -v '^{' | head -70
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
