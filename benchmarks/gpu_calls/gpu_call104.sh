#!/usr/bin/env bash
# One H200, ~4 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark).
# (Ran against the benchmark as it was between ea6f191 and c1a2772, before the snapshot; today's
# --energy_profile_ms prints other lines, which gpu_call106.sh reads.)
# gpu_call103 found the 1b's whole step, replayed as one single-stream graph after the group
# profile, at 169 ms / 545 W / 1950 MHz against the timed steps' 206 ms / 692 W / 1515 MHz. Here the
# whole step is replayed before the groups too (the state the timed steps left), with the loss
# before and after each replay window: is the fast replay real work on sane numbers?
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
ours_1b profile --steps=20 --energy_profile_ms=500
grep -E '^whole step|^energy profile' "$logs/ours_profile.log"
sed -n '/^     J   share/,$p' "$logs/ours_profile.log" | grep -v '^{' | head -14
timeout 150 .gpu/run benchmarks/llama_step_benchmark --config=124m --steps=40 --warmup=5 --energy_profile_ms=300 \
  > "$logs/m_profile.log" 2>&1
echo "ours 124m profile: $(json "$logs/m_profile.log") $(grep -E 'rror' "$logs/m_profile.log" | tail -1 | cut -c1-160)"
grep -E '^whole step|^energy profile' "$logs/m_profile.log"
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
