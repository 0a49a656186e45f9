#!/usr/bin/env bash
# 2026-12-01, one H200 (~3 minutes): offloaded activations in place of SwiGLU recompute on the 1b
# single-device step. Under the 32 GiB default auto recomputes SwiGLU in 3 layers (31.76 GiB);
# selective recompute without it fits with the first 8 kept activations in host memory (31.27 GiB
# planned). Alternating pairs, the same GPU. Predicted: +0.3-0.5% (three recomputes at ~0.17% each,
# gpu_call59.sh) if the offloads' copies hide, as the 1b's 17 did (gpu_call54.sh); the losses equal.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
single() {
  local tag=$1
  shift
  timeout 100 .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=20 --warmup=5 "$@" > "$logs/single_$tag.log" 2>&1
  echo "1b $tag: $(json "$logs/single_$tag.log") $(grep -E 'rror' "$logs/single_$tag.log" | head -1 | cut -c1-200)"
}
off=(--recompute=selective --recompute_swiglu_layers=0 --offload_activations=8)
single default_a
single off8_a "${off[@]}"
single default_b
single off8_b "${off[@]}"
single sel0_no_offload --recompute=selective --recompute_swiglu_layers=0
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
