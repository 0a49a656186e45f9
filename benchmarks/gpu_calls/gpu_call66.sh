#!/usr/bin/env bash
# 2026-12-01, one H200 (~2.5 minutes): do replayed graphs take the offload plan's eager gain away
# (gpu_call63.sh: eager traced steps 205.2 -> 204.3 ms with 8 offloads in place of 3 SwiGLU
# recomputes; replayed, +0.2-0.5% in one call and a wash in another)? The two single-device plans,
# eager (--cuda_graph=0) and replayed, alternating. Predicted: eager off8 ~0.4% ahead of eager sel3;
# replayed, the two within 0.3%.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
sel3=(--recompute=selective --recompute_swiglu_layers=3)
off8=(--recompute=selective --recompute_swiglu_layers=0 --offload_activations=8)
ours_1b eager_sel3 "${sel3[@]}" --cuda_graph=0
ours_1b eager_off8 "${off8[@]}" --cuda_graph=0
ours_1b graph_sel3 "${sel3[@]}"
ours_1b graph_off8 "${off8[@]}"
ours_1b eager_off8b "${off8[@]}" --cuda_graph=0
ours_1b eager_sel3b "${sel3[@]}" --cuda_graph=0
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
