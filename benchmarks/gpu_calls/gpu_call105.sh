#!/usr/bin/env bash
# One H200, ~7 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark
# //benchmarks:step_energy_test). The energy profile with every window started from one snapshot
# of the program's memory (gpu_call104: without it the group replays leave NaNs, and the whole
# step on NaNs drew 508 W against 681 W): each group alone, then the whole step without each group
# of >= 1% of the joules (what removing it saves the step), for the 1b and the 124m.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
t step_energy 180 benchmarks/step_energy_test
prof() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" .gpu/run benchmarks/llama_step_benchmark "$@" > "$logs/$name.log" 2>&1
  echo "$name rc=$?: $(json "$logs/$name.log") $(grep -E 'rror' "$logs/$name.log" | tail -1 | cut -c1-200)"
  grep -E '^snapshot|^energy profile' "$logs/$name.log"
  sed -n '/^alone:/,$p' "$logs/$name.log" | grep -v '^{' | head -${ROWS:-34}
}
prof p1b 330 --config=1b --steps=20 --warmup=5 --energy_profile_ms=500
ROWS=26 prof p124m 240 --config=124m --steps=40 --warmup=5 --energy_profile_ms=300
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
