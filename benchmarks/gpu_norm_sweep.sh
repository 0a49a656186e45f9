#!/usr/bin/env bash
# One GPU call (2 H200s): the RMSNorm / add+RMSNorm launch sweep (thread-block clusters for the
# backward's weight-gradient rows, programmatic dependent launch for the forward) and the SwiGLU
# fast-math flat kernel next to the default and torch.compile, all on GPU 0 one after the other,
# while GPU 1 runs the three kernels' tests.
# Bundle: gpu-bundle --flags "-c opt" //kernels/rmsnorm:all //kernels/add_rmsnorm:all //kernels/swiglu:all
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
B=${B:-.gpu}
strip() { grep -E '^BM_' | sed -E 's/ +[0-9.]+ (ns|us|ms) +[0-9.]+ (ns|us|ms) +[0-9]+//; s/manual_time//; s/ +/ /g' | cut -c1-170; }
(export CUDA_VISIBLE_DEVICES=1
 for t in kernels/rmsnorm/rmsnorm_test kernels/add_rmsnorm/add_rmsnorm_test kernels/swiglu/swiglu_test; do
   timeout 150 $B/run $t > "$logs/$(basename $t).log" 2>&1
   echo "test $(basename $t) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$logs/$(basename $t).log" | tr '\n' ' ')"
   grep -E '^\[  FAILED  \]|Failure|error' "$logs/$(basename $t).log" | head -5
 done > "$logs/tests.txt") &
export CUDA_VISIBLE_DEVICES=0
timeout 120 $B/run kernels/rmsnorm/rmsnorm_benchmark --benchmark_filter='Sweep|BF16Batch/16384|Copy' --benchmark_min_time=0.1 > "$logs/rms.log" 2>&1
timeout 120 $B/run kernels/add_rmsnorm/add_rmsnorm_benchmark --benchmark_filter='Sweep|BF16Batch/16384' --benchmark_min_time=0.1 > "$logs/add.log" 2>&1
timeout 60 $B/run kernels/swiglu/swiglu_benchmark --benchmark_filter='BF16(Fast)?Batch/16384/' --benchmark_min_time=0.1 > "$logs/swiglu.log" 2>&1
timeout 150 python3 kernels/torch_peer_memory_bound.py --only swiglu --batch 10 > "$logs/peer.log" 2>&1
wait
cat "$logs/tests.txt"
echo "-- rmsnorm"; strip < "$logs/rms.log"
echo "-- add_rmsnorm"; strip < "$logs/add.log"
echo "-- swiglu"; strip < "$logs/swiglu.log"; grep -E 'compile' "$logs/peer.log"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
