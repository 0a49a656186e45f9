#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 8, fifth call: 7b FSDP with the kept residual sums
# offloaded to pinned host memory (copies now queued without a host synchronization, capturable),
# its peer in the same call, and the 2-GPU FSDP tests including the offload comparison.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch //compiler:distributed_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
here=$(pwd); steps=${STEPS:-10}
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
json() { grep -h '^\(\[rank 0\] \)\?{' "$@" | sed 's/^\[rank 0\] //' | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","planned_arena_gib","mfu","loss_first","loss_last","recompute","cuda_graph") if k in j))'; }
t() { local name=$1 limit=$2; shift 2; timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | sort -u | tr '\n' ' ')"; grep -E '^\[  FAILED  \]' "$logs/$name.log" | sort -u | head -4; }
t distributed_gpu 120 compiler/distributed_test --gtest_filter='*TwoGpus*'
SG_COMM_IPC=1 timeout 170 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
  --config=7b --strategy=fsdp --recompute=auto --memory_budget_gib=42 --steps="$steps" --warmup=4 > "$logs/fsdp_7b.log" 2>&1
echo "ours 7b fsdp x2 auto 42: $(json "$logs/fsdp_7b.log") $(grep -E 'rror' "$logs/fsdp_7b.log" | head -1 | cut -c1-200)"
timeout 200 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 7b --compile --fsdp --ac --steps "$steps" \
  > "$logs/peer_7b_fsdp.log" 2>&1
echo "peer 7b fsdp x2: $(json "$logs/peer_7b_fsdp.log") $(grep -E 'Error' "$logs/peer_7b_fsdp.log" | tail -1)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
