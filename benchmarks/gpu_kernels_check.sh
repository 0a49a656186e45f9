#!/usr/bin/env bash
# One GPU call (2 H200s): the memory-bound kernels' tests on GPU 1 while GPU 0 runs the RMSNorm /
# add+RMSNorm backward sweep at the Llama-1B shape, the defaults of RoPE, cross-entropy and SwiGLU,
# then the PyTorch peers of those on the same GPU (same-chip ratios).
# Bundle: gpu-bundle --flags "-c opt" //kernels/rmsnorm:all //kernels/add_rmsnorm:all \
#   //kernels/rope:all //kernels/cross_entropy:all //kernels/swiglu:all
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
B=${B:-.gpu}
strip() {  # name, mean bandwidth, median bandwidth
  grep -E '^BM_' | sed -E 's/min_time:0.100\///; s/manual_time//' \
    | sed -E 's/^(BM_[^ ]*) .*mean_TBps=([0-9.]+).*median_TBps=([0-9.]+).*/\1 mean \2 median \3 TB\/s/' | cut -c1-170
}
([[ -n ${SKIP_TESTS:-} ]] && exit 0
 export CUDA_VISIBLE_DEVICES=1
 for t in kernels/rmsnorm/rmsnorm_test kernels/add_rmsnorm/add_rmsnorm_test kernels/swiglu/swiglu_test \
     kernels/rope/rope_test kernels/cross_entropy/cross_entropy_test; do
   timeout 150 $B/run $t > "$logs/$(basename $t).log" 2>&1
   echo "test $(basename $t) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$logs/$(basename $t).log" | tr '\n' ' ')"
   grep -E '^\[  FAILED  \]' "$logs/$(basename $t).log" | head -5
 done > "$logs/tests.txt") &
export CUDA_VISIBLE_DEVICES=0
m="--benchmark_min_time=0.1"
timeout 60 $B/run kernels/rmsnorm/rmsnorm_benchmark --benchmark_filter='Sweep/bwd:1/rows:16384|BF16Batch/16384|Copy' $m > "$logs/rms.log" 2>&1
timeout 60 $B/run kernels/add_rmsnorm/add_rmsnorm_benchmark --benchmark_filter='Sweep/bwd:1/rows:16384|BF16Batch/16384' $m > "$logs/add.log" 2>&1
timeout 40 $B/run kernels/swiglu/swiglu_benchmark --benchmark_filter='BF16Batch/16384/8192' $m > "$logs/swiglu.log" 2>&1
timeout 40 $B/run kernels/rope/rope_benchmark --benchmark_filter='BF16Batch/8/2048/32/8/64/' $m > "$logs/rope.log" 2>&1
timeout 40 $B/run kernels/cross_entropy/cross_entropy_benchmark --benchmark_filter='BF16Batch/16384/32000' $m > "$logs/ce.log" 2>&1
timeout 120 python3 kernels/torch_peer_memory_bound.py --only swiglu,rope,cross_entropy --batch 10 > "$logs/peer.log" 2>&1
wait
cat "$logs/tests.txt" 2>/dev/null
for f in rms add swiglu rope ce; do echo "-- $f"; strip < "$logs/$f.log"; done
grep -E 'compile' "$logs/peer.log"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
