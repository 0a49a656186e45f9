#!/usr/bin/env bash
# 2026-12-01 (1 H200, ~2 minutes): gpu_call51 found the decoupled copies back gaining in a traced
# eager step (880 -> 835 ms, no forward waits left) but not in the replayed CUDA graph (907 ms,
# 827 without host units). Is it the graph? The same 7b runs with --cuda_graph=false (eager
# steps): predicted ~835-845 ms with 16 host units if the graph serializes the copies behind the
# forward, ~905 if not.
# Bundle: as gpu_call51.sh
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1)"
for h in 16 0; do
  timeout 150 .gpu/run comm/launch --nproc=1 -- "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=7b --strategy=fsdp --recompute=full --fsdp_host_gradient_units=$h --steps=5 --warmup=2 \
    --cuda_graph=false > "$logs/eager_7b_h$h.log" 2>&1
  echo "fsdp-of-one 7b eager, $h host units: $(json "$logs/eager_7b_h$h.log") $(grep -E 'rror' "$logs/eager_7b_h$h.log" | head -1 | cut -c1-200)"
done
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
