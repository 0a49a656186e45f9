#!/usr/bin/env bash
# One H200, ~5 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# Joules a TFLOP of the MLP's GEMMs, ours against torch's in one call: kernels/gemm/gemm_energy.py
# (torch.mm at T 16384, D 2048, F 8192, ~1 s windows back to back), then the 1b tuned afresh by
# joules under the wide policy (600 ms windows), whose metered-choice lines give our cheapest
# cuBLASLt algorithm's joules a call for the same three products.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
[[ -f .gpu_all.tar.xz ]] && { rm -rf .gpu; tar xJf .gpu_all.tar.xz; }
source benchmarks/gpu_lib.sh
timeout 120 python3 kernels/gemm/gemm_energy.py 2>&1 | tee "$logs/torch_gemm_energy.log"
OURS_TIMEOUT=330 ours_1b e_tune --steps=20 --shipped_tuning=0 --autotune_energy_ms=600 --cache_dir="$out/cache"
grep "^metered choice" "$logs/ours_e_tune.log" | sed 's/,batch=1.*align=[0-9/]*//'
timeout 120 python3 kernels/gemm/gemm_energy.py 2>&1 | grep scaled | tee "$logs/torch_gemm_energy_after.log"
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
