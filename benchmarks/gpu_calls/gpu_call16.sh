#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 7, fifth call: the FSDP memory changes (one kept
# residual tensor per layer under full recompute, gradients over SwiGLU's inputs, later backward
# prefetch, reduce-scatter into the gradient shards). A: GPU 1 the single-GPU step tests; GPU 0
# our GEMM before / after the sm90.h move (old binary carried in .gpu-old), then the 1b step and
# its peer. B: the 2-GPU step tests. C: FSDP 7b and 1b (under 25 GiB), ours then FSDP2's.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
here=$(pwd); steps=${STEPS:-15}
cp .gpu-old/gemm_rmsnorm_benchmark .gpu/bin/kernels/gemm_rmsnorm/gemm_rmsnorm_benchmark_old
json() { grep -h '^\(\[rank 0\] \)\?{' "$@" | sed 's/^\[rank 0\] //' | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","mfu","loss_first","loss_last","recompute","recompute_swiglu_layers") if k in j))'; }
t() { local name=$1 limit=$2; shift 2; timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1
  echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | tr '\n' ' ')"; grep -E '^\[  FAILED  \]' "$logs/$name.log" | head -4; }
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
(export CUDA_VISIBLE_DEVICES=1
 t llama_step_test 150 compiler/llama_step_test --gtest_filter='*Cuda*'
 t compile_test 120 compiler/compile_test --gtest_filter='*Cuda*'
 t f16_mixed 120 compiler/f16_mixed_precision_test --gtest_filter='*Cuda*:*Gpu*') > "$logs/gpu1.txt" 2>&1 &
(export CUDA_VISIBLE_DEVICES=0
 for b in gemm_rmsnorm_benchmark_old gemm_rmsnorm_benchmark gemm_rmsnorm_benchmark_old gemm_rmsnorm_benchmark; do
   timeout 40 .gpu/run kernels/gemm_rmsnorm/$b --benchmark_min_time=0.2 \
     --benchmark_filter='BM_Gemm/M:16384/N:(3072|8192)/K:2048/impl:[04]/' > "$logs/$b.log" 2>&1
   echo "$b: $(grep -E '^BM_' "$logs/$b.log" | sed -E 's/.*N:([0-9]+).*impl:([0-9]).*TFLOP\/s=([0-9.]+).*/N\1 impl\2 \3/' | tr '\n' ' ')"
 done
 timeout 150 .gpu/run benchmarks/llama_step_benchmark --config=1b --recompute=auto --steps=20 --warmup=5 > "$logs/ours_1b.log" 2>&1
 echo "1b ours: $(json "$logs/ours_1b.log")"
 timeout 200 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 > "$logs/peer_1b.log" 2>&1
 echo "1b peer: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)") > "$logs/gpu0.txt" 2>&1 &
wait
cat "$logs/gpu1.txt" "$logs/gpu0.txt"
t distributed_gpu 120 compiler/distributed_test --gtest_filter='DistributedTest.FsdpOnTwoGpusEqualsOneGpu'
t dist_cuda_graph 150 compiler/dist_cuda_graph_test
t micro_batch_gpu 100 compiler/micro_batch_test --gtest_filter='*Gpu*'
t cp_step_gpu 100 compiler/context_parallel/cp_step_test --gtest_filter='*Gpu*'
ours() {  # cfg recompute budget
  SG_COMM_IPC=1 timeout 200 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config="$1" --strategy=fsdp --recompute="$2" --memory_budget_gib="$3" --steps="$steps" --warmup=5 > "$logs/ours_$1_fsdp.log" 2>&1
  echo "ours $1 fsdp x2 $2 $3: $(json "$logs/ours_$1_fsdp.log") $(grep -E 'rror' "$logs/ours_$1_fsdp.log" | head -1 | cut -c1-200)"
}
peer() {
  ac=(); [[ $1 == 7b ]] && ac=(--ac)
  timeout 240 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config "$1" --compile --fsdp "${ac[@]}" --steps "$steps" \
    > "$logs/peer_$1_fsdp.log" 2>&1
  echo "peer $1 fsdp x2: $(json "$logs/peer_$1_fsdp.log") $(grep -E 'Error' "$logs/peer_$1_fsdp.log" | tail -1)"
}
ours 7b auto 42; peer 7b; ours 1b auto 25; peer 1b
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
