#!/usr/bin/env bash
# One GPU-machine call (2 H200s) that checks a batch of new work: the single-GPU tests in ONE_GPU
# run on GPU 1 while GPU 0 runs the benchmarks in BENCH ("pkg/name:filter ..."); then the tests in
# TWO_GPU (each "pkg/name:gtest_filter", "*" for all) with both GPUs. Each entry is one line of the
# summary; logs go into $OUT/logs.tgz. Binaries come from a gpu-bundle in .gpu.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
B=${B:-.gpu}
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
t() {  # limit "pkg/name:filter"
  local limit=$1 bin=${2%%:*} filter=${2#*:} name
  name=$(basename "$bin")_$(echo "$filter" | tr -c 'A-Za-z0-9' '_' | cut -c1-30)
  [[ -x $B/bin/$bin ]] || { echo "test $bin: not bundled"; return; }
  timeout "$limit" $B/run "$bin" --gtest_filter="$filter" > "$logs/$name.log" 2>&1
  echo "test $bin [$filter] rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|graph vs eager|explanation|CUDA graph' "$logs/$name.log" | head -6 | cut -c1-220
}
( export CUDA_VISIBLE_DEVICES=1; for e in ${ONE_GPU:-}; do t 150 "$e"; done ) > "$logs/one_gpu.txt" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
for e in ${BENCH:-}; do
  timeout 90 $B/run "${e%%:*}" --benchmark_filter="${e#*:}" > "$logs/bench_$(basename "${e%%:*}").log" 2>&1
done
wait
cat "$logs/one_gpu.txt"
unset CUDA_VISIBLE_DEVICES
for e in ${TWO_GPU:-}; do t 180 "$e"; done
cat "$logs"/bench_*.log 2>/dev/null | grep -E '^BM_' | sed -E 's/ +[0-9.]+ (ns|us|ms) +[0-9.]+ (ns|us|ms) +[0-9]+//; s/manual_time//' \
  | cut -c1-150
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
