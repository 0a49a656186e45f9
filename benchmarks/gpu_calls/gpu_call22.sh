#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 8, fourth call. mem8: 7b FSDP with the kept residual sums
# offloaded to pinned host memory (all under the 42 GiB default; 20 under 53.15 GiB) and its peer,
# 1b FSDP under 25 GiB (no offloads planned), every 2-GPU step test and the capture of the copy
# stream. emb1cta (GPU 1 while GPU 0 is idle at the start): the embedding backward with its index
# prepared by one CTA, ids loaded 16 a thread at once, against the chain; its tests.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch //compiler:compile_test
#   //compiler:{distributed,dist_cuda_graph,micro_batch,tensor_parallel}_test //compiler/context_parallel:cp_step_test
#   //compiler/pipeline:pp_step_test //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
here=$(pwd); steps=${STEPS:-10}
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
json() { grep -h '^\(\[rank 0\] \)\?{' "$@" | sed 's/^\[rank 0\] //' | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","planned_arena_gib","mfu","loss_first","loss_last","recompute","recompute_swiglu_layers") if k in j))'; }
t() { local name=$1 limit=$2; shift 2; timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | sort -u | tr '\n' ' ')"; grep -E '^\[  FAILED  \]' "$logs/$name.log" | sort -u | head -4; }
fsdp() {  # tag cfg budget
  SG_COMM_IPC=1 timeout 170 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config="$2" --strategy=fsdp --recompute=auto --memory_budget_gib="$3" --steps="$steps" --warmup=4 > "$logs/fsdp_$1.log" 2>&1
  echo "ours $2 fsdp x2 auto $3 ($1): $(json "$logs/fsdp_$1.log") $(grep -iE 'offload' "$logs/fsdp_$1.log" | head -1 | cut -c1-160) $(grep -E 'rror' "$logs/fsdp_$1.log" | head -1 | cut -c1-200)"; }
(export CUDA_VISIBLE_DEVICES=1
 t embedding_test 120 kernels/embedding/embedding_test
 timeout 100 .gpu/run kernels/embedding/embedding_benchmark \
   --benchmark_filter='Backward.*(Atomic|AtomicChain|AtomicHot|AtomicChainHot)Batch/16384/(32000|128256)/(8|2048)' > "$logs/bm_emb.log" 2>&1
 echo "embedding (rc=$?):"; grep -E '^BM_' "$logs/bm_emb.log" | awk '{for(i=1;i<=NF;i++) if($i ~ /bytes_per_second/) t=$i; print "  " $1, $2, $3, t}') > "$logs/gpu1.txt" 2>&1 &
(export CUDA_VISIBLE_DEVICES=0; t compile_offload 120 compiler/compile_test --gtest_filter='*CudaGraph*:*Offload*:*Cuda*') > "$logs/gpu0.txt" 2>&1 &
wait; cat "$logs/gpu1.txt" "$logs/gpu0.txt"
fsdp a 7b 42
timeout 200 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 7b --compile --fsdp --ac --steps "$steps" \
  > "$logs/peer_7b_fsdp.log" 2>&1
echo "peer 7b fsdp x2: $(json "$logs/peer_7b_fsdp.log") $(grep -E 'Error' "$logs/peer_7b_fsdp.log" | tail -1)"
fsdp b 7b 53.15
fsdp c 1b 25
t distributed_gpu 150 compiler/distributed_test --gtest_filter='*TwoGpus*'
t dist_cuda_graph 90 compiler/dist_cuda_graph_test
t micro_batch_gpu 60 compiler/micro_batch_test --gtest_filter='*Gpu*'
t cp_step_gpu 60 compiler/context_parallel/cp_step_test --gtest_filter='*Gpu*'
t tensor_parallel_gpu 60 compiler/tensor_parallel_test --gtest_filter='*Gpu*'
t pp_step_gpu 60 compiler/pipeline/pp_step_test --gtest_filter='*Gpu*'
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
