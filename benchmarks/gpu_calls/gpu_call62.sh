#!/usr/bin/env bash
# 2026-12-01, one H200 (~3 minutes): gpu_call58.sh's FSDP question on one GPU: the 1b as FSDP over a
# group of one with the new 25 GiB plan's recompute (SwiGLU in 1 layer, 12 offloads) against the
# plan before (SwiGLU in 7 layers), alternating, three pairs. Predicted +0.8-1% (gpu_call59.sh: 7
# recomputes cost 1.2%).
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
for i in 1 2 3; do
  fsdp_over_one new$i --recompute=selective --recompute_swiglu_layers=1 --offload_activations=12
  fsdp_over_one before$i --recompute=selective --recompute_swiglu_layers=7
done
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
