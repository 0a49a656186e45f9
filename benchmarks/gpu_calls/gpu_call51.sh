#!/usr/bin/env bash
# 2026-12-01 (1 H200, ~4 minutes): the host units' copies back decoupled from the forward. The
# 05:00 trace of gpu_call50's 7b (FSDP over a group of one, 16 host units) showed each unit's copy
# back (0.81 GB, 14.2 ms: 57 GB/s) issued only once the unit two before it was updated, just
# before that unit's gather: no copy before 121 ms of the forward, then ~9.5 ms waited per host
# layer. Now every host unit is copied back from the step's start and updated on a stream of its
# own, the comm stream waiting only for its update. Predicted: the 14 copies (~185 ms) finish
# before the forward reaches the output layer (~205 ms): 902 ms -> ~825-835 ms a step (the run
# without host units: 823 ms), i.e. ~9,800-9,950 tokens/s. First the one-GPU CUDA test of the
# deferred path (copies, events, streams in a captured graph), then 16 host units / none.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch //compiler:distributed_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1)"
t distributed_one_gpu 150 compiler/distributed_test --gtest_filter='*OneGpu*'
for h in 16 0; do
  timeout 200 .gpu/run comm/launch --nproc=1 -- "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=7b --strategy=fsdp --recompute=full --fsdp_host_gradient_units=$h --steps=6 --warmup=3 \
    > "$logs/one_7b_h$h.log" 2>&1
  echo "fsdp-of-one 7b, $h host units: $(json "$logs/one_7b_h$h.log") $(grep -E 'rror' "$logs/one_7b_h$h.log" | head -1 | cut -c1-200)"
done
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
