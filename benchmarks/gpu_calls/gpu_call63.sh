#!/usr/bin/env bash
# 2026-12-01, one H200 (~3 minutes): why offloaded activations cost about what the SwiGLU
# recomputes they replace save (gpu_call60-62.sh). One traced eager step of each plan, the summary
# line (host copies and their exposed part), then trace_diff.py per pair, largest first:
#   single device: SwiGLU in 3 layers against none recomputed + 8 offloads;
#   FSDP over one GPU: SwiGLU in 7 layers against SwiGLU in 1 layer + 12 offloads.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
traced() {
  local tag=$1
  shift
  timeout 120 .gpu/run "$@" --config=1b --steps=3 --warmup=2 --recompute=selective --trace="$logs/$tag.json" \
    > "$logs/$tag.log" 2>&1
  echo "$tag: $(json "$logs/$tag.log") $(grep -E 'rror' "$logs/$tag.log" | head -1 | cut -c1-200)"
  grep -h "exposed communication" "$logs/$tag.log" | head -1 | cut -c1-300
}
one=(comm/launch --nproc=1 -- "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" --strategy=fsdp)
traced single_sel3 benchmarks/llama_step_benchmark --recompute_swiglu_layers=3
traced single_off8 benchmarks/llama_step_benchmark --recompute_swiglu_layers=0 --offload_activations=8
traced fsdp1_sel7 "${one[@]}" --recompute_swiglu_layers=7
traced fsdp1_off12 "${one[@]}" --recompute_swiglu_layers=1 --offload_activations=12
echo "-- single: sel3 -> off8"
python3 benchmarks/trace_diff.py "$logs/single_sel3.json" "$logs/single_off8.json" --top 14 2>&1 | head -20
echo "-- fsdp over one: sel7 -> off12"
python3 benchmarks/trace_diff.py "$logs/fsdp1_sel7.json" "$logs/fsdp1_off12.json" --top 14 2>&1 | head -20
gzip -f "$logs"/*.json
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
