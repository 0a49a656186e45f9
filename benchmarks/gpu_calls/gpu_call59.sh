#!/usr/bin/env bash
# 2026-12-01, one H200 (~4 minutes): a one-GPU stand-in for gpu_call58.sh's question (host gradient
# shards in place of SwiGLU recompute). The 1b as FSDP over a group of one (4.11 GiB of gradient
# shards, twice a 2-GPU rank's, each way over PCIe a ~205 ms step):
#   d: selective recompute without SwiGLU recompute, no host units (34.6 GiB planned; graph);
#   c: the same with all 19 units' gradient shards on the host (31.0 GiB planned; eager steps);
#   b: selective with SwiGLU recomputed in 7 layers, no host units (the 2-GPU plan's recompute; graph);
# and the single-device default (strategy none, 31.76 GiB) for scale. c against d is the copies'
# cost at twice the 2-GPU bytes, b against d the 7 SwiGLU recomputes'. Predicted: b 1.5-2% under
# d; c within 1% of d if the copies hide behind the forward.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
sel=(--recompute=selective)
fsdp_over_one d1 "${sel[@]}" --recompute_swiglu_layers=0
fsdp_over_one c1 "${sel[@]}" --recompute_swiglu_layers=0 --fsdp_host_gradient_units=19
fsdp_over_one b1 "${sel[@]}" --recompute_swiglu_layers=7
fsdp_over_one c2 "${sel[@]}" --recompute_swiglu_layers=0 --fsdp_host_gradient_units=19
fsdp_over_one d2 "${sel[@]}" --recompute_swiglu_layers=0
fsdp_over_one b2 "${sel[@]}" --recompute_swiglu_layers=7
timeout 100 .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=12 --warmup=4 > "$logs/single.log" 2>&1
echo "1b single device default: $(json "$logs/single.log")"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
