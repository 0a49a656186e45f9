#!/usr/bin/env bash
# One H200, ~3 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# Every cc_test at HEAD (the first full run since 2026-12-02: the v5 overlap order, step_energy and
# its NodeFlops refactor are new), and the first run of sdpa_peer.py --energy.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
timeout 120 python3 kernels/attention/sdpa_peer.py --energy 2>&1 | tail -8
benchmarks/gpu_tests.sh run 2>&1 | tail -100 | grep -v '^PASS' 
grep -c '^PASS' "$out/results.txt"
echo "== done $(date -u +%FT%TZ)"
