#!/usr/bin/env bash
# One H200, ~3 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack). Prepared 2026-12-04
# for the next session, not yet run: every cc_test on the GPU with step_energy's re-measured short
# windows (gpu_call129.sh: 85 passed, step_energy_test failed its window check once), then
# step_energy_test 5 more times, then the 1b against the peer, O P O.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
benchmarks/gpu_tests.sh run 2>&1 | grep -v '^PASS' | tail -12
source benchmarks/gpu_lib.sh
for i in 1 2 3 4 5; do t "step_energy_$i" 120 benchmarks/step_energy_test; done
ours_1b a --steps=30
peer_1b
ours_1b b --steps=30
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
