#!/usr/bin/env bash
# RAN 2026-11-30 19:46 (results in benchmarks/README.md); the r8 and o4 variants it names were removed after gpu_call37.sh.
# Session 10, call 3 (2 H200s): gpu_call35.sh without the fused scan + scatter (hung at vocab
# 128256), every step under a timeout: the embedding tests (GPU 1, background) and the atomic2s
# experiments r8 (8 listed rows per CTA of the sums) and o4 (4 CTAs of the sums per SM) against the
# default (GPU 0, alternating runs); then the fixed WgradStreamTest, the 2-GPU tests, one FSDP A/B
# pair with the weight-gradient stream.
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
#   //compiler:compile_test //compiler:distributed_test //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
CUDA_VISIBLE_DEVICES=1 t embedding 150 kernels/embedding/embedding_test > "$logs/embedding.summary" 2>&1 &
tpid=$!
for r in 1 2; do
  bm "a$r" 'Backward.*(Atomic2s|Atomic2sR8|Atomic2sO4)Batch/16384/(32000|128256)/(2048|8)/'
done
bm hot 'Backward.*(Atomic2sHot|Atomic2sR8Hot|Atomic2sO4Hot)Batch/16384/(32000|128256)/2048/'
wait $tpid
cat "$logs/embedding.summary"
bm_table
t compile_wgrad 100 compiler/compile_test --gtest_filter='*Wgrad*:*CudaGraph*'
t distributed 150 compiler/distributed_test --gtest_filter='*TwoGpus*'
steps=12
fsdp_1b one_stream
fsdp_1b wgrad --wgrad_stream
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
