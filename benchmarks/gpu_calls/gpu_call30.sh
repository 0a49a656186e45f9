#!/usr/bin/env bash
# One GPU call (1 H200), 2026-11-30 session 9, sixth call: the embedding backward "atomic2s" with its
# side stream's sums over a compacted list of the rows with tokens (every CTA gets four such rows),
# against "atomic", "scan3" and the zero fill, at vocab 32000 and 128256, hot ids; every embedding
# test; the step's CUDA tests with atomic2s forced (SG_EMBEDDING_BWD), captured into the step's graph.
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test
#   //kernels/embedding:embedding_benchmark //compiler:llama_step_test //compiler:compile_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t embedding_test 150 kernels/embedding/embedding_test
bm() {  # name filter [env...]
  local name=$1 filter=$2; shift 2
  env "$@" timeout 150 .gpu/run kernels/embedding/embedding_benchmark --benchmark_filter="$filter" > "$logs/$name.log" 2>&1
  echo "$name (rc=$?):"; grep -E '^BM_' "$logs/$name.log" | awk '{l=$1; for(i=2;i<=NF;i++) if($i ~ /TBps/) l=l" "$i; print "  " l}'
}
bm emb 'Backward.*(Atomic|Atomic2s|Scan3|ZeroFill)Batch/16384/(32000|128256)/(8|2048)/'
bm emb_hot 'Backward.*(Atomic|Atomic2s|Scan3)HotBatch/16384/'
bm emb_again 'Backward.*(Atomic|Atomic2s)Batch/16384/32000/2048/'
export SG_EMBEDDING_BWD=atomic2s
t llama_step_atomic2s 150 compiler/llama_step_test --gtest_filter='*Cuda*'
t compile_atomic2s 150 compiler/compile_test --gtest_filter='*Cuda*'
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
