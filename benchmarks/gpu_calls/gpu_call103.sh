#!/usr/bin/env bash
# One H200, ~6 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark
# //benchmarks:step_energy_test //benchmarks:gpu_energy_test). The compiled step's energy by group
# of schedule steps (--energy_profile_ms): which groups hold the 1b's and the 124m's joules at the
# power cap, at what watts, clock, temperature and GEMM TFLOP/s, and how the groups' sum compares
# with the whole step replayed the same way and with the timed steps. Then whether temperature moves
# the 1b's tokens/s: a cold short run, a 40 s run, a hot short run.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
t gpu_energy 60 benchmarks/gpu_energy_test
t step_energy 180 benchmarks/step_energy_test
ours_1b cold --steps=20
ours_1b long --steps=200
ours_1b hot --steps=20
ours_1b profile --steps=30 --energy_profile_ms=1000
sed -n '/energy profile/,$p' "$logs/ours_profile.log" | grep -v '^{' | head -60
nvidia-smi --query-gpu=temperature.gpu --format=csv,noheader
timeout 150 .gpu/run benchmarks/llama_step_benchmark --config=124m --steps=40 --warmup=5 --energy_profile_ms=500 \
  > "$logs/m_profile.log" 2>&1
echo "ours 124m profile: $(json "$logs/m_profile.log") $(grep -E 'rror' "$logs/m_profile.log" | tail -1 | cut -c1-160)"
sed -n '/energy profile/,$p' "$logs/m_profile.log" | grep -v '^{' | head -45
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
