#!/usr/bin/env bash
# Ran 2026-12-02 03:27 (all passed: 5, 11 and 5 tests). The early fill inside CUDA-graph captures and the Llama steps (the 124m-shape
# table, 98 MB, takes it by default). Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test
# //compiler:compile_test //compiler:llama_step_test; carry [".gpu"].
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ)"
SG_EMBEDDING_EARLY_FILL=1 t emb_graph_early 100 kernels/embedding/embedding_test --gtest_filter='*Graph*:*Atomic2s*:*EarlyFill*'
t llama_step 150 compiler/llama_step_test
t compile 150 compiler/compile_test --gtest_filter='*Cuda*'
echo "== done $(date -u +%FT%TZ)"
