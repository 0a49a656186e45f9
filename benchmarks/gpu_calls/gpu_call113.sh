#!/usr/bin/env bash
# One H200, ~2 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# The 124m with every GEMM on cuBLASLt's first heuristic choice (SG_AUTOTUNE=0) against the
# autotuned default, ABBA twice, 40 steps each (the 1b: +0.7% with the heuristic, gpu_call111/112).
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
[[ -f .gpu_all.tar.xz ]] && { rm -rf .gpu; tar xJf .gpu_all.tar.xz; }
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
m124() {
  timeout 100 .gpu/run benchmarks/llama_step_benchmark --config=124m --steps=40 --warmup=5 > "$logs/m_$1.log" 2>&1
  echo "124m $1: $(json "$logs/m_$1.log" | cut -d' ' -f1-2,7-8)"
}
m124 tuned_a
SG_AUTOTUNE=0 m124 heur_a
SG_AUTOTUNE=0 m124 heur_b
m124 tuned_b
m124 tuned_c
SG_AUTOTUNE=0 m124 heur_c
echo "== done $(date -u +%FT%TZ)"
