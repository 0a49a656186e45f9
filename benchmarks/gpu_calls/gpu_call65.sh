#!/usr/bin/env bash
# 2026-12-01, one H200 (~3 minutes): the CUDA tests the executor's capture path touches, after the
# outside-graph steps were removed (Executor::RunEager with no step filter): CudaGraphReplayEqualsEager
# and the other CUDA cases of compile_test, the distributed CUDA-graph tests, the Llama CUDA step
# tests, and every one-GPU distributed test (FSDP over a group of one, deferred optimizer included).
# Bundle: gpu-bundle --flags "-c opt" //compiler:compile_test //compiler:dist_cuda_graph_test
#         //compiler:llama_step_test //compiler:distributed_test //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
t compile 120 compiler/compile_test
t dist_cuda_graph 120 compiler/dist_cuda_graph_test
t llama_step_cuda 150 compiler/llama_step_test --gtest_filter='*Cuda*'
t distributed_one_gpu 200 compiler/distributed_test --gtest_filter='*OneGpu*'
grep -h "SKIPPED\|skip" "$logs"/*.log | sort | uniq -c | head -8
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
