#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 9, seventh call: "atomic2s" with the listed rows' runs
# and first positions written by the scatter (one round trip before the dout loads) against the
# previous atomic2s (SG_EXP_EMB_LISTED=0) and "atomic"; every embedding test in both modes; the
# step's tests and the 2-GPU FSDP tests with atomic2s forced; the 1b step with and without it.
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
#   //compiler:llama_step_test //compiler:distributed_test //compiler:dist_cuda_graph_test
#   //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
here=$(pwd)
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
bm() {  # name filter [env...]
  local name=$1 filter=$2; shift 2
  env "$@" timeout 150 .gpu/run kernels/embedding/embedding_benchmark --benchmark_filter="$filter" > "$logs/$name.log" 2>&1
  echo "$name (rc=$?):"; grep -E '^BM_' "$logs/$name.log" | awk '{l=$1; for(i=2;i<=NF;i++) if($i ~ /median_TBps/) l=l" "$i; print "  " l}'
}
(export CUDA_VISIBLE_DEVICES=1
 t embedding_test_listed 150 kernels/embedding/embedding_test
 SG_EXP_EMB_LISTED=0 t embedding_test_prev 150 kernels/embedding/embedding_test) > "$logs/gpu1.txt" 2>&1 &
(export CUDA_VISIBLE_DEVICES=0
 bm listed 'Backward.*(Atomic|Atomic2s|ZeroFill)Batch/16384/(32000|128256)/(8|2048)/'
 bm prev 'Backward.*Atomic2sBatch/16384/(32000|128256)/2048/' SG_EXP_EMB_LISTED=0
 bm listed_hot 'Backward.*Atomic2sHotBatch/16384/'
 bm listed_again 'Backward.*(Atomic|Atomic2s)Batch/16384/32000/2048/') > "$logs/gpu0.txt" 2>&1 &
wait; cat "$logs/gpu1.txt" "$logs/gpu0.txt"
export SG_EMBEDDING_BWD=atomic2s
t llama_step_atomic2s 150 compiler/llama_step_test --gtest_filter='*Cuda*'
t distributed_atomic2s 150 compiler/distributed_test --gtest_filter='*TwoGpus*'
t dist_cuda_graph_atomic2s 120 compiler/dist_cuda_graph_test
(export CUDA_VISIBLE_DEVICES=0
 for e in atomic2s atomic; do
   SG_EMBEDDING_BWD=$e timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=16 --warmup=4 > "$logs/step_$e.log" 2>&1
   echo "1b default, embedding $e: $(json "$logs/step_$e.log")"
 done)
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
