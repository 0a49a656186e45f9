#!/usr/bin/env bash
# One H200, ~5 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark).
# gpu_call98: the traced eager 1b step is 2.95 ms shorter with the compiler's fused SwiGLU backward
# (the MLP backward 1.5 ms), and the 124m step +0.7% in two pairs; gpu_call95-96's replayed 1b: -0.15%.
# More replayed pairs, in ABBA order: the 1b (40 steps) and the 124m (40 steps), without / with it.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
run() {  # TAG FUSE CONFIG
  SG_FUSE_SWIGLU_BWD=$2 timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=$3 --steps=40 --warmup=5 \
    > "$logs/$1.log" 2>&1
  echo "$3 $1: $(json "$logs/$1.log")" | sed -E 's/ (planned_arena_gib|mfu|loss_first|recompute|recompute_swiglu_layers|lm_head_chunks|offload_activations|fsdp_host_gradient_units|offload_host_gib|cuda_graph)=[^ ]*//g'
}
for r in a b; do
  run 1b_off_${r}1 0 1b; run 1b_on_${r}1 1 1b; run 1b_on_${r}2 1 1b; run 1b_off_${r}2 0 1b
done
for r in a b; do
  run m_off_${r}1 0 124m; run m_on_${r}1 1 124m; run m_on_${r}2 1 124m; run m_off_${r}2 0 124m
done
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
