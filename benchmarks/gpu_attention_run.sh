#!/usr/bin/env bash
# One GPU-machine call (2 H200s) for the attention forward variants (kernels/attention/attention_fwd_v4.h):
# GPU 1 runs the correctness tests (each wgmma variant in its own process: a faulting kernel takes
# its CUDA context down) and then PyTorch's SDPA peer; GPU 0 runs the benchmarks, plus the
# memory-bound kernels named in EXTRA_BENCH ("pkg/name:filter ..."). Logs go into $OUT/logs.tgz.
# Build first (here):
#   ../shared/tools/gpu-bundle //kernels/attention:attention_test //kernels/attention:attention_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
B=${B:-.gpu}
export PYTHONUNBUFFERED=1
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
summary() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; grep -E '^\[  FAILED  \]' "$1" | head -4 | tr '\n' ' '; }
(
  export CUDA_VISIBLE_DEVICES=1
  SG_ATTENTION_TEST_VARIANTS=${MMA_VARIANTS:-v3} \
    timeout 240 $B/run kernels/attention/attention_test > "$logs/test_mma.log" 2>&1
  echo "test mma rc=$? $(summary "$logs/test_mma.log")"
  for v in ${WGMMA_VARIANTS:-wgmma ws}; do
    SG_ATTENTION_TEST_VARIANTS=v4/$v timeout 90 $B/run kernels/attention/attention_test --gtest_filter='*AttentionCuda*' \
      > "$logs/test_$v.log" 2>&1
    echo "test $v rc=$? $(summary "$logs/test_$v.log")"
  done
  timeout 90 python3 kernels/attention/sdpa_peer.py > "$logs/peer_sdpa.log" 2>&1
) > "$logs/gpu1.txt" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
timeout 150 $B/run kernels/attention/attention_benchmark --benchmark_filter='forward/' \
  > "$logs/bench_mma.log" 2>&1 || echo "(mma bench exited $?)"
for v in 100 101; do
  timeout 60 $B/run kernels/attention/attention_benchmark --benchmark_filter="forward_v4/.*variant:$v/" \
    > "$logs/bench_$v.log" 2>&1 || echo "(bench $v exited $?)"
done
for e in ${EXTRA_BENCH:-}; do
  timeout 60 $B/run "${e%%:*}" --benchmark_filter="${e#*:}" > "$logs/extra_$(basename "${e%%:*}").log" 2>&1
done
wait
cat "$logs/gpu1.txt"
cat "$logs"/bench_*.log "$logs"/extra_*.log 2>/dev/null | grep -E '^BM_' \
  | sed -E 's/ +[0-9.]+ (ns|us|ms) +[0-9.]+ (ns|us|ms) +[0-9]+//; s/manual_time//' | cut -c1-150
grep -hE 'TFLOP|ms' "$logs/peer_sdpa.log" | head -20
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
