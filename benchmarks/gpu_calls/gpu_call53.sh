#!/usr/bin/env bash
# 2026-12-01 (1 H200, ~2 minutes): FSDP steps whose host units are copied back now stay eager
# (gpu_call52: 845 ms eager against 907 replayed). The one-GPU CUDA test of the deferred path, then
# the 7b over a group of one with 16 host units at the default (graph requested): predicted ~845 ms,
# ~9,700 tokens/s (against 9,030-9,080 replayed), the explanation saying why it is eager.
# Bundle: as gpu_call51.sh
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1)"
t distributed_one_gpu 150 compiler/distributed_test --gtest_filter='*OneGpu*'
timeout 150 .gpu/run comm/launch --nproc=1 -- "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" \
  --config=7b --strategy=fsdp --recompute=full --fsdp_host_gradient_units=16 --steps=6 --warmup=3 > "$logs/one_7b_h16.log" 2>&1
echo "fsdp-of-one 7b, 16 host units: $(json "$logs/one_7b_h16.log") $(grep -E 'rror' "$logs/one_7b_h16.log" | head -1 | cut -c1-200)"
grep -ho "CUDA graph[^;]*\|eager ([^)]*)" "$logs/one_7b_h16.log" | head -1
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
