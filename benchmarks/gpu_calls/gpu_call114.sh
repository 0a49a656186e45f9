#!/usr/bin/env bash
# Prepared 2026-12-04 for a session with 2 H200s (nvidia-h200-x2, ~9 minutes); carry [".gpu_all.tar.xz"]
# (benchmarks/gpu_tests.sh pack). Issue #10's 2-GPU rows, last measured 2026-11-30 17:22 (1b FSDP)
# and 2026-12-01 10:13 (7b), re-measured on main as it now is, each with its FSDP2 peer in the call:
#  1. the 1b FSDP under 25 GiB, ours / peer / ours (12 steps after 4), then bf16 gradients
#     (--gradients=bf16: bf16 buckets reduce-scattered in f32; predicted +1-2%) against f32, BAB;
#  2. the 7b at the default 42 GiB budget (host gradient units, eager) and at 53 GiB, then its peer.
# Then every cc_test, the 2-GPU ones included.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
[[ -f .gpu_all.tar.xz ]] && { rm -rf .gpu; tar xJf .gpu_all.tar.xz; }
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
steps=12 fsdp_1b a
timeout 200 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 1b --compile --fsdp --steps 12 \
  --warmup 4 > "$logs/peer_1b_fsdp.log" 2>&1
echo "peer 1b fsdp x2: $(json "$logs/peer_1b_fsdp.log") $(grep -E 'Error' "$logs/peer_1b_fsdp.log" | tail -1)"
steps=12 fsdp_1b b
steps=12 fsdp_1b bf16_a --gradients=bf16
steps=12 fsdp_1b f32_c
steps=12 fsdp_1b bf16_b --gradients=bf16
for budget in default 53; do
  extra=(); [[ $budget != default ]] && extra=(--memory_budget_gib="$budget")
  SG_COMM_IPC=1 timeout 240 .gpu/run comm/launch --nproc=2 -- "$(pwd)/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=7b --strategy=fsdp --recompute=auto --steps=6 --warmup=3 "${extra[@]}" > "$logs/fsdp_7b_$budget.log" 2>&1
  echo "fsdp 7b budget $budget: $(json "$logs/fsdp_7b_$budget.log") $(grep -E 'rror' "$logs/fsdp_7b_$budget.log" | head -1 | cut -c1-200)"
done
timeout 240 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 7b --compile --fsdp --ac --steps 6 \
  --warmup 3 > "$logs/peer_7b_fsdp.log" 2>&1
echo "peer 7b fsdp x2: $(json "$logs/peer_7b_fsdp.log") $(grep -E 'Error|no energy' "$logs/peer_7b_fsdp.log" | tail -1)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
benchmarks/gpu_tests.sh run 2>&1 | grep -v '^PASS'
echo "== done $(date -u +%FT%TZ)"
