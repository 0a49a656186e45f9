#!/usr/bin/env bash
# One H200, ~3 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# The order reversed (BAAB) on the same machine right after gpu_call111.sh.
# The 1b with every GEMM on cuBLASLt's first heuristic choice (SG_AUTOTUNE=0) against the
# autotuned default, ABBA, 40 steps each: kernels/gemm/gemm_energy.py found torch's weight-gradient
# GEMM ~8% cheaper a TFLOP than our autotuned one in the 1b's energy profile (gpu_call109.sh).
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
[[ -f .gpu_all.tar.xz ]] && { rm -rf .gpu; tar xJf .gpu_all.tar.xz; }
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
SG_AUTOTUNE=0 ours_1b heur_c --steps=40
ours_1b tuned_c --steps=40
ours_1b tuned_d --steps=40
SG_AUTOTUNE=0 ours_1b heur_d --steps=40
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
