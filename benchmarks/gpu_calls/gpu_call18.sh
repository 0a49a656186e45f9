#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 7, last call: the second round of FSDP memory changes.
# 7b ours then FSDP2's (same call), 1b FSDP under 25 GiB (ours only: its peer ran at 13:27), then
# the 2-GPU step tests the shard layout touches.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
here=$(pwd); steps=${STEPS:-12}
json() { grep -h '^\(\[rank 0\] \)\?{' "$@" | sed 's/^\[rank 0\] //' | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","planned_arena_gib","mfu","loss_first","loss_last","recompute","recompute_swiglu_layers") if k in j))'; }
t() { local name=$1 limit=$2; shift 2; timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | sort -u | tr '\n' ' ')"; grep -E '^\[  FAILED  \]' "$logs/$name.log" | sort -u | head -4; }
ours() {  # cfg recompute budget
  SG_COMM_IPC=1 timeout 150 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config="$1" --strategy=fsdp --recompute="$2" --memory_budget_gib="$3" --steps="$steps" --warmup=4 > "$logs/ours_$1_fsdp.log" 2>&1
  echo "ours $1 fsdp x2 $2 $3: $(json "$logs/ours_$1_fsdp.log") $(grep -E 'rror' "$logs/ours_$1_fsdp.log" | head -1 | cut -c1-200)"
}
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
ours 7b auto 42
timeout 180 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 7b --compile --fsdp --ac --steps "$steps" \
  > "$logs/peer_7b_fsdp.log" 2>&1
echo "peer 7b fsdp x2: $(json "$logs/peer_7b_fsdp.log") $(grep -E 'Error' "$logs/peer_7b_fsdp.log" | tail -1)"
ours 1b auto 25
t distributed_gpu 90 compiler/distributed_test --gtest_filter='DistributedTest.FsdpOnTwoGpusEqualsOneGpu'
t dist_cuda_graph 90 compiler/dist_cuda_graph_test
t micro_batch_gpu 60 compiler/micro_batch_test --gtest_filter='*Gpu*'
t cp_step_gpu 60 compiler/context_parallel/cp_step_test --gtest_filter='*Gpu*'
t tensor_parallel_gpu 60 compiler/tensor_parallel_test --gtest_filter='*Gpu*'
t pp_step_gpu 60 compiler/pipeline/pp_step_test --gtest_filter='*Gpu*'
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
