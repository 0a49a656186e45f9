#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 8, first call: two branches measured together.
# qkvmerge: the 1b step with q/k/v as one GEMM (SG_FUSE_QKV=1) against the unfused step, both on GPU 0
# in alternation, the peer once, and the single-GPU step tests with the fused GEMM on GPU 1.
# mem7b3: 7b FSDP (per-parameter collectives chosen by the memory budget) with its peer, 1b FSDP under
# 25 GiB, every 2-GPU step test, and the pipeline seed that failed at 13:49 replayed on the binary from
# before that session's memory changes (.gpu-old).
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch
#   //compiler:{distributed,dist_cuda_graph,micro_batch,tensor_parallel,llama_step,matmul_group,compile}_test
#   //compiler/context_parallel:cp_step_test //compiler/pipeline:pp_step_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
here=$(pwd); steps=${STEPS:-16}
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
json() { grep -h '^\(\[rank 0\] \)\?{' "$@" | sed 's/^\[rank 0\] //' | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","planned_arena_gib","mfu","loss_first","loss_last","recompute","recompute_swiglu_layers") if k in j))'; }
t() { local name=$1 limit=$2; shift 2; timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | sort -u | tr '\n' ' ')"; grep -E '^\[  FAILED  \]' "$logs/$name.log" | sort -u | head -4; }
single() {  # tag fuse
  CUDA_VISIBLE_DEVICES=0 SG_FUSE_QKV=$2 timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=1b --recompute=auto \
    --steps=20 --warmup=5 > "$logs/single_$1.log" 2>&1
  echo "ours 1b gpu0 auto qkv=$2 ($1): $(json "$logs/single_$1.log") $(grep -E 'rror' "$logs/single_$1.log" | tail -1 | cut -c1-160)"; }
fsdp() {  # cfg budget
  SG_COMM_IPC=1 timeout 170 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config="$1" --strategy=fsdp --recompute=auto --memory_budget_gib="$2" --steps="$steps" --warmup=4 > "$logs/fsdp_$1.log" 2>&1
  echo "ours $1 fsdp x2 auto $2: $(json "$logs/fsdp_$1.log") $(grep -E 'rror' "$logs/fsdp_$1.log" | head -1 | cut -c1-200)"; }
(single a0 0; single a1 1; single b0 0; single b1 1
 CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 > "$logs/peer_1b.log" 2>&1
 echo "peer 1b gpu0: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)") > "$logs/gpu0.txt" 2>&1 &
(export CUDA_VISIBLE_DEVICES=1 SG_FUSE_QKV=1
 t llama_step_qkv 150 compiler/llama_step_test --gtest_filter='*Cuda*'
 t compile_qkv 120 compiler/compile_test --gtest_filter='*Cuda*'
 t matmul_group 120 compiler/matmul_group_test) > "$logs/gpu1.txt" 2>&1 &
wait
cat "$logs/gpu0.txt" "$logs/gpu1.txt"
fsdp 7b 42
timeout 180 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 7b --compile --fsdp --ac --steps "$steps" \
  > "$logs/peer_7b_fsdp.log" 2>&1
echo "peer 7b fsdp x2: $(json "$logs/peer_7b_fsdp.log") $(grep -E 'Error' "$logs/peer_7b_fsdp.log" | tail -1)"
fsdp 1b 25
t distributed_gpu 120 compiler/distributed_test --gtest_filter='*TwoGpus*'
t dist_cuda_graph 90 compiler/dist_cuda_graph_test
t micro_batch_gpu 60 compiler/micro_batch_test --gtest_filter='*Gpu*'
t cp_step_gpu 60 compiler/context_parallel/cp_step_test --gtest_filter='*Gpu*'
t tensor_parallel_gpu 60 compiler/tensor_parallel_test --gtest_filter='*Gpu*'
t pp_step_gpu 60 compiler/pipeline/pp_step_test --gtest_filter='*Gpu*'
if [ -x .gpu/bin/compiler/pipeline/pp_step_test_old ]; then
  for b in pp_step_test_old pp_step_test; do
    SG_TEST_SEED=5025775103667804482 timeout 60 .gpu/run compiler/pipeline/$b --gtest_filter='*Gpu*' > "$logs/seed_$b.log" 2>&1
    echo "pp seed replay $b rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' "$logs/seed_$b.log" | head -2 | tr '\n' ' ') $(grep -E 'grad_norm evaluates' "$logs/seed_$b.log" | head -2 | cut -c1-200 | tr '\n' ' ')"
  done
fi
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
