#!/usr/bin/env bash
# Run 2026-12-01 05:30 (results in benchmarks/README.md: no difference). 1 H200, ~2.5 minutes: do replayed CUDA graphs run host copies behind compute in
# general? gpu_call51-53 found the deferred optimizer's copies back overlapping the forward in
# eager steps (845 ms) but not replayed (907 ms). The activation offloads' copies also rely on that
# overlap: the 1b with --offload_first under 32.8 GiB (no recompute, 17 activations offloaded: 2.0
# GiB each way a step) was 0.6-0.8% slower than selective recompute, replayed (2026-11-30 17:07).
# Here graph / eager for that plan and for the default. Predicted, if graphs serialize the copies:
# offload_first eager faster than replayed by more than the default's eager / graph gap (~0.3%).
# Bundle: as gpu_call51.sh (llama_step_benchmark)
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1)"
for g in true false; do
  ours_1b "offload_graph_$g" --memory_budget_gib=32.8 --offload_first --cuda_graph=$g
  ours_1b "default_graph_$g" --cuda_graph=$g
done
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
