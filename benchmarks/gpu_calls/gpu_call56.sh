#!/usr/bin/env bash
# Prepared 2026-12-01 for the next session (1 H200, ~4 minutes): can the FSDP deferred optimizer's
# steps be replayed as graphs again, with their copies back outside the graph?
#  1. the graph-overlap probe (gpu_call55.sh): chain_outside_graph against the chain in the graph
#     (23.87 ms) and eager (20.4);
#  2. SG_FSDP_COPIES_OUTSIDE_GRAPH=1 (the copies back and the host units' updates run eagerly before
#     each launch of a graph of the rest, waited for through external event-wait nodes): the CUDA
#     test against the single-device step (graph replayed), then the 7b over one GPU with 16 host
#     units with the knob and without (eager, 839.6 ms at 05:17).
# Predicted: if the probe's variant overlaps (~20.4 ms), the 7b at ~825-830 ms with the knob
# (graph: -1.6% against eager, as without host units); then make it the default.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks/graph_overlap:graph_overlap_benchmark
#         //benchmarks:llama_step_benchmark //comm:launch //compiler:distributed_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1)"
timeout 60 .gpu/run benchmarks/graph_overlap/graph_overlap_benchmark 2>&1 | grep "^BM_" |
  sed 's/ \+[0-9]* ns \+[0-9]* ns \+3//'
t outside_one_gpu 150 compiler/distributed_test --gtest_filter='*OutsideTheGraphOnOneGpu*:*HostGradientsOnOneGpu*'
for knob in 1 0; do
  SG_FSDP_COPIES_OUTSIDE_GRAPH=$knob timeout 150 .gpu/run comm/launch --nproc=1 -- \
    "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" --config=7b --strategy=fsdp --recompute=full \
    --fsdp_host_gradient_units=16 --steps=6 --warmup=3 > "$logs/one_7b_outside$knob.log" 2>&1
  echo "7b over one GPU, 16 host units, outside=$knob: $(json "$logs/one_7b_outside$knob.log") $(grep -E 'rror' "$logs/one_7b_outside$knob.log" | head -1 | cut -c1-200)"
done
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
