#!/usr/bin/env bash
# 2026-12-01, 2 H200s (~6 minutes): the 1b FSDP step under 25 GiB. ChooseRecompute's new order
# (selective with SwiGLU recomputed in 1 layer and the fewest kept activations offloaded: 12, 24.65
# GiB planned, replayed graph) against the plan before (SwiGLU recomputed in 7 layers, 24.64 GiB
# planned, 24.82 measured) and against selective without SwiGLU recompute with the gradient shards of
# all 19 units in host memory (24.58 GiB planned, 2.06 GiB each way over PCIe, eager steps), with
# FSDP2 + compile between (tokens/s, memory, mJ/token). Predicted: the new plan +0.8-1% (6
# SwiGLU recomputes fewer at ~0.17% each, gpu_call59.sh; offloads hidden, gpu_call60.sh); the host
# plan up to +1.2% if its copies back (~39 ms each way) hide behind the ~65 ms forward, a loss if not.
# Then (~3 minutes) where the 7b's 3.3% at 42 GiB goes (gpu_call48.sh: 9,307 against 9,628 tokens/s
# for the 53 GiB plan): one traced eager step of each plan, then trace_diff.py, largest first.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
host=(--recompute=selective --recompute_swiglu_layers=0 --fsdp_host_gradient_units=19)
before=(--recompute=selective --recompute_swiglu_layers=7)
fsdp_1b new_a
fsdp_1b before_a "${before[@]}"
fsdp_1b host_a "${host[@]}"
timeout 200 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 1b --compile --fsdp --steps 12 \
  > "$logs/peer_1b_fsdp.log" 2>&1
echo "peer 1b fsdp x2: $(json "$logs/peer_1b_fsdp.log") $(grep -E 'Error|no energy' "$logs/peer_1b_fsdp.log" | tail -1)"
fsdp_1b host_b "${host[@]}"
fsdp_1b before_b "${before[@]}"
fsdp_1b new_b
grep -h "strategy:" "$logs/fsdp_host_a.log" | head -1 | cut -c1-400
for budget in 42 53; do
  SG_COMM_IPC=1 timeout 200 .gpu/run comm/launch --nproc=2 -- "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=7b --strategy=fsdp --recompute=auto --memory_budget_gib=$budget --steps=3 --warmup=2 \
    --trace="$logs/trace_7b_$budget.json" > "$logs/trace_7b_$budget.log" 2>&1
  echo "7b $budget GiB traced: $(json "$logs/trace_7b_$budget.log") $(grep -E 'rror' "$logs/trace_7b_$budget.log" | head -1 | cut -c1-200)"
  grep -h "exposed\|summary" "$logs/trace_7b_$budget.log" | grep -v '^\[rank 0\] {' | head -2 | cut -c1-300
done
python3 benchmarks/trace_diff.py "$logs/trace_7b_53.json" "$logs/trace_7b_42.json" 2>&1 | head -25
gzip -f "$logs"/trace_7b_*.json
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
