#!/usr/bin/env bash
# 2026-12-01, 2 H200s (~5 minutes): the 1b FSDP step under 25 GiB with the deferred optimizer in
# place of SwiGLU recompute. Auto's plan (selective, SwiGLU recomputed in 7 of 16 layers, 24.64
# GiB planned, replayed graph) against selective recompute without SwiGLU recompute and the
# gradient shards of all 19 units in host memory (--recompute_swiglu_layers=0
# --fsdp_host_gradient_units=19: 24.58 GiB planned, 2.06 GiB each way over PCIe a ~215 ms step,
# eager), alternating, with FSDP2 + compile between (tokens/s, memory, mJ/token for both;
# the 7b's were measured in gpu_call48.sh). Predicted: up to +1.2% if the copies back (~39 ms each
# way) hide behind the ~65 ms forward (gpu_call59.sh: the 7 SwiGLU recomputes cost 1.2% on one GPU;
# there the copies, twice these bytes, cost 7.8%), a loss if they do not.
# Then (~3 minutes) where the 7b's 3.3% at 42 GiB goes (gpu_call48.sh: 9,307 against 9,628 tokens/s
# for the 53 GiB plan): one traced eager step of each plan, then trace_diff.py, largest first.
# SHORT=1: the tests and the four 1b runs only (~5 minutes; no peer, no 7b traces).
# First the 2-GPU CUDA tests of the capture path (not run since the outside-graph steps were removed).
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch
#         //compiler:distributed_test //compiler:dist_cuda_graph_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
t distributed_two_gpus 200 compiler/distributed_test --gtest_filter='*TwoGpus*'
t dist_cuda_graph 150 compiler/dist_cuda_graph_test
host=(--recompute=selective --recompute_swiglu_layers=0 --fsdp_host_gradient_units=19)
fsdp_1b a
fsdp_1b host_a "${host[@]}"
if [[ ${SHORT:-0} != 1 ]]; then
  timeout 200 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 1b --compile --fsdp --steps 12 \
    > "$logs/peer_1b_fsdp.log" 2>&1
  echo "peer 1b fsdp x2: $(json "$logs/peer_1b_fsdp.log") $(grep -E 'Error|no energy' "$logs/peer_1b_fsdp.log" | tail -1)"
fi
fsdp_1b host_b "${host[@]}"
fsdp_1b b
grep -h "strategy:" "$logs/fsdp_host_a.log" | head -1 | cut -c1-400
for budget in 42 53; do
  [[ ${SHORT:-0} == 1 ]] && break
  SG_COMM_IPC=1 timeout 200 .gpu/run comm/launch --nproc=2 -- "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=7b --strategy=fsdp --recompute=auto --memory_budget_gib=$budget --steps=3 --warmup=2 \
    --trace="$logs/trace_7b_$budget.json" > "$logs/trace_7b_$budget.log" 2>&1
  echo "7b $budget GiB traced: $(json "$logs/trace_7b_$budget.log") $(grep -E 'rror' "$logs/trace_7b_$budget.log" | head -1 | cut -c1-200)"
  grep -h "exposed\|summary" "$logs/trace_7b_$budget.log" | grep -v '^\[rank 0\] {' | head -2 | cut -c1-300
done
[[ ${SHORT:-0} == 1 ]] || python3 benchmarks/trace_diff.py "$logs/trace_7b_53.json" "$logs/trace_7b_42.json" 2>&1 | head -25
gzip -f "$logs"/trace_7b_*.json 2>/dev/null
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
