#!/usr/bin/env bash
# 2026-12-01 (1 H200, ~5 minutes): the deferred optimizer's PCIe cost on one GPU, as a stand-in
# while no 2-GPU machine is lent. The 7b as FSDP over a group of one (the same per-GPU batch, 2 x
# 4096, and full recompute as on 2 GPUs), with the gradient shards of 16 units in host memory
# (16 x 0.81 GB = 12.9 GB each way a step, the 2-GPU plan's 31 half-units moved 12.55) against
# none. Predicted: the copies back run in the ~0.21 s forward at ~50 GB/s (0.26 s), so 0.05-0.1 s
# exposed: ~9,000-9,500 tokens/s against ~9,800-10,000; the device peak 10.5-11 GiB lower.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1)"
for h in 16 0; do
  timeout 240 .gpu/run comm/launch --nproc=1 -- "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=7b --strategy=fsdp --recompute=full --fsdp_host_gradient_units=$h --steps=6 --warmup=3 \
    > "$logs/one_7b_h$h.log" 2>&1
  echo "fsdp-of-one 7b, $h host units: $(json "$logs/one_7b_h$h.log") $(grep -E 'rror' "$logs/one_7b_h$h.log" | head -1 | cut -c1-200)"
  grep -h "planned:\|strategy:" "$logs/one_7b_h$h.log" | head -2 | cut -c1-300
done
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
