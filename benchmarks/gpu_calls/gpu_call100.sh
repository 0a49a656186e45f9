#!/usr/bin/env bash
# One H200, ~5 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# After gpu_call99 (124m +0.45% with the compiler's fused SwiGLU backward, the 1b within noise): the
# fusion on by default (CompileOptions::swiglu_backward_gemm). Every test on the GPU with it, then the
# 124m and 1b defaults once each (their JSON's count of fused steps).
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
benchmarks/gpu_tests.sh run > "$out/suite.txt" 2>&1; grep -E "^FAIL|passed,|^==" "$out/suite.txt"
source benchmarks/gpu_lib.sh
for c in 124m 1b; do
  timeout 100 .gpu/run benchmarks/llama_step_benchmark --config=$c --steps=30 --warmup=5 > "$logs/$c.log" 2>&1
  echo "$c default: $(json "$logs/$c.log")"
done
echo "== done $(date -u +%FT%TZ)"
