#!/usr/bin/env bash
# One GPU call (2 H200s) for the memory-bound kernels: their CUDA tests on GPU 1 while GPU 0 runs
# the benchmarks named below, then the PyTorch peers on GPU 0 (same chip as ours), then ours once
# more (both orders). SG_BENCH_HOLD=1 rows repeat a benchmark with the batch enqueued behind a held
# stream (kernels/core/benchmark_timing.h).
# Bundle: gpu-bundle --flags "-c opt" //kernels/core:all //kernels/rmsnorm:all //kernels/add_rmsnorm:all \
#   //kernels/embedding:all //kernels/swiglu:all //kernels/adamw:all
# Env: TESTS (test binaries, pkg/name), PEERS (torch_peer_memory_bound.py --only list).
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
B=${B:-.gpu}
TESTS=${TESTS:-kernels/core/core_test kernels/rmsnorm/rmsnorm_test kernels/add_rmsnorm/add_rmsnorm_test kernels/embedding/embedding_test kernels/swiglu/swiglu_test kernels/adamw/adamw_test}
PEERS=${PEERS:-swiglu,embedding,adamw}
strip() {  # name, mean bandwidth, median bandwidth
  grep -E '^BM_' | sed -E 's/min_time:0.100\///; s/\/manual_time//' \
    | sed -E 's/^(BM_[^ ]*) .*mean_TBps=([0-9.]+).*median_TBps=([0-9.]+).*/\1 mean \2 median \3 TB\/s/' | cut -c1-170
}
(export CUDA_VISIBLE_DEVICES=1
 for t in $TESTS; do
   timeout 200 $B/run $t > "$logs/$(basename $t).log" 2>&1
   echo "test $(basename $t) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$logs/$(basename $t).log" | tr '\n' ' ')"
   grep -E '^\[  FAILED  \]|SKIPPED|Failure' "$logs/$(basename $t).log" | head -5
 done > "$logs/tests.txt") &
export CUDA_VISIBLE_DEVICES=0
m="--benchmark_min_time=0.1"
bench() {  # tag, hold, binary, filter
  SG_BENCH_HOLD=$2 timeout 90 $B/run $3 --benchmark_filter="$4" $m > "$logs/$1.log" 2>&1
  echo "-- $1 (hold=$2)"; strip < "$logs/$1.log"
}
{
bench rms 0 kernels/rmsnorm/rmsnorm_benchmark 'Sweep/bwd:1/rows:16384|BF16Batch/16384/|Copy'
bench rms_hold 1 kernels/rmsnorm/rmsnorm_benchmark 'BF16Batch/16384/|Copy'
bench add 0 kernels/add_rmsnorm/add_rmsnorm_benchmark 'Sweep/bwd:1/rows:16384|BF16Batch/16384/'
bench emb 0 kernels/embedding/embedding_benchmark 'Batch/16384/32000/2048'
bench swiglu 0 kernels/swiglu/swiglu_benchmark 'BF16Batch/16384/8192'
bench swiglu_hold 1 kernels/swiglu/swiglu_benchmark 'BF16Batch/16384/8192'
bench adamw 0 kernels/adamw/adamw_benchmark '/1258291200'
bench adamw_hold 1 kernels/adamw/adamw_benchmark '/1258291200'
timeout 150 python3 kernels/torch_peer_memory_bound.py --only "$PEERS" --batch 10 > "$logs/peer.log" 2>&1
echo "-- peers"; grep -vE '^\s*$' "$logs/peer.log" | tail -40 | cut -c1-170
bench swiglu_again 0 kernels/swiglu/swiglu_benchmark 'BF16Batch/16384/8192'
} > "$logs/bench.txt"
wait
cat "$logs/tests.txt" "$logs/bench.txt"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
