#!/usr/bin/env bash
# Run 2026-11-30 23:28-23:44 on an experiment build (removed: not adopted; results in
# benchmarks/README.md, Kernels). The embedding backward's "singles" path (kernels/embedding/embedding_atomic.cu; issue #3's last
# 1-2%): rows with one token copied by the fill on the caller's stream right after the count, only
# rows of two tokens or more summed on the side stream. The embedding tests (every bitwise
# comparison runs atomic2s with and without singles), the capture test, then the default (singles)
# against SG_EMBEDDING_SINGLES=0 alternating, plain and hot, at vocab 32000 and 128256 and dim 8;
# the 1b step's CUDA tests. ~3 minutes. (First run, 23:28: the fill stored two adjacent float4 per
# thread and ran at half speed: 2.18 TB/s at 32000, 1.93 at 128256; now one float4 per thread.)
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
#   //kernels/embedding:embedding_capture_first_test //compiler:llama_step_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t embedding 150 kernels/embedding/embedding_test
t capture_first 60 kernels/embedding/embedding_capture_first_test
export BM_TIMEOUT=100
for r in 1 2; do
  bm "singles_$r" 'Backward.*(Atomic2s|Atomic2sNoSingles)Batch/16384/32000/2048/'
done
bm large 'Backward.*(Atomic2s|Atomic2sNoSingles)Batch/16384/(128256/2048|32000/8)/'
bm hot 'Backward.*(Atomic2sHot|Atomic2sNoSinglesHot)Batch/16384/32000/2048/'
bm_table
# t llama_step_test 150 compiler/llama_step_test --gtest_filter='*Cuda*'
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
