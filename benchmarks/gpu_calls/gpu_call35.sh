#!/usr/bin/env bash
# RAN 2026-11-30 19:34 and timed out (600 s): BM atomic2s_ss at vocab 128256 hung twice (200 s each); at 32000 it
# measured 96.9-97.2 us against atomic2s 97.1-97.6 (no gain). The ss variant was removed; gpu_call36.sh redoes the rest.
# Session 10, call 2 (2 H200s): embedding backward experiments on atomic2s (issue #3: 3.39-3.41 TB/s
# at vocab 32000 against 3.5): the scan and scatter fused into one kernel (ss), 8 listed rows per
# CTA of the sums (r8), 4 CTAs of the sums per SM (o4), combined; every variant's tests first. Then
# the fixed WgradStreamTest on the GPU, the 2-GPU FSDP test with the weight-gradient stream, and its
# FSDP A/B (one pair).
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
#   //compiler:compile_test //compiler:distributed_test //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
export BM_TIMEOUT=200 BM_REPS=5
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
CUDA_VISIBLE_DEVICES=1 t embedding 200 kernels/embedding/embedding_test &
tpid=$!
for r in 1 2; do
  bm "a$r" 'Backward.*(Atomic2s|Atomic2sSs|Atomic2sR8|Atomic2sSsR8|Atomic2sO4|Atomic2sSsO4)Batch/16384/(32000|128256)/(2048|8)/'
done
bm hot 'Backward.*(Atomic2sHot|Atomic2sSsR8Hot)Batch/16384/(32000|128256)/2048/'
bm zero 'ZeroFillBatch/16384/32000/2048/'
wait $tpid
bm_table
t compile_wgrad 120 compiler/compile_test --gtest_filter='*Wgrad*:*CudaGraph*'
t distributed 200 compiler/distributed_test --gtest_filter='*TwoGpus*'
steps=12
fsdp_1b one_stream
fsdp_1b wgrad --wgrad_stream
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
