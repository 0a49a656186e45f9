#!/usr/bin/env bash
# One H200, ~7 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# The 1b's energy profile (1 s windows) with the shipped energy-ranked GEMM choices, the default,
# against gpu_call109.sh's with the time-ranked ones: where the joules went after the ranking.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
[[ -f .gpu_all.tar.xz ]] && { rm -rf .gpu; tar xJf .gpu_all.tar.xz; }
source benchmarks/gpu_lib.sh
timeout 480 .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=20 --warmup=5 --energy_profile_ms=1000 \
  > "$logs/p1b.log" 2>&1
echo "p1b rc=$?: $(json "$logs/p1b.log") $(grep -E 'rror' "$logs/p1b.log" | tail -1 | cut -c1-200)"
grep -E '^snapshot|^energy profile' "$logs/p1b.log"
sed -n '/^alone:/,$p' "$logs/p1b.log" | grep -v '^{' | head -80
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
