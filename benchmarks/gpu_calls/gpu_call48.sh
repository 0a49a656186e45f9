#!/usr/bin/env bash
# Prepared for a session with 2 H200s (~7 minutes): the deferred optimizer with gradient shards in
# host memory (CompileOptions::fsdp_host_gradient_units), run so far on one GPU only (gpu_call46, 51-53).
#  1. every 2-GPU FSDP test against one GPU, the new FsdpHostGradientsOnTwoGpusEqualsOneGpu among
#     them (per-parameter collectives, offloaded activations, 6 of 9 units on the host; eager steps);
#  2. the 7b at the default 42 GiB budget (auto: 31 of 35 units on the host, 41.73 GiB planned),
#     then at 53 GiB (the plan before: 52.15 GiB planned, 52.32 measured), then the peer.
#     Predicted: <= 42 GiB, and 12.55 GB each way over PCIe a step; eager steps (copies back);
#     from the one-GPU stand-in (gpu_call53: -2% against the fastest plan), ~9,550-9,650 tokens/s.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch //compiler:distributed_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
t distributed_two_gpus 200 compiler/distributed_test --gtest_filter='*TwoGpus*'
for budget in default 53; do
  extra=(); [[ $budget != default ]] && extra=(--memory_budget_gib="$budget")
  SG_COMM_IPC=1 timeout 240 .gpu/run comm/launch --nproc=2 -- "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=7b --strategy=fsdp --recompute=auto --steps=6 --warmup=3 "${extra[@]}" > "$logs/fsdp_7b_$budget.log" 2>&1
  echo "fsdp 7b budget $budget: $(json "$logs/fsdp_7b_$budget.log") $(grep -E 'rror' "$logs/fsdp_7b_$budget.log" | head -1 | cut -c1-200)"
  grep -h "strategy:" "$logs/fsdp_7b_$budget.log" | head -1 | cut -c1-400
done
timeout 240 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 7b --compile --fsdp --ac --steps 6 \
  --warmup 3 > "$logs/peer_7b_fsdp.log" 2>&1
echo "peer 7b fsdp x2: $(json "$logs/peer_7b_fsdp.log") $(grep -E 'Error|no energy' "$logs/peer_7b_fsdp.log" | tail -1)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
