#!/usr/bin/env bash
# One GPU-machine call (2 H200s) for the kernels and comm: our kernel benchmarks on GPU 0 while GPU 1
# runs the PyTorch peers and then the single-GPU kernel tests; then the 2-GPU comm test and the ring
# vs NCCL benchmark. Every log goes into $OUT/logs.tgz (one file: the device tool returns few); a
# short table is printed.
# Build first (here):
#   ../shared/tools/gpu-bundle --flags "-c opt" //kernels/... //comm:launch //comm:collectives_benchmark \
#     //comm:device_collectives_test //comm:reduce_test //compiler:autotune_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
B=${B:-.gpu}  # the bundle directory
export PYTHONUNBUFFERED=1
here=$(pwd)
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"

(  # GPU 1: the peers, then the tests
  export CUDA_VISIBLE_DEVICES=1
  timeout 150 python3 kernels/torch_peer_memory_bound.py --batch 10 > "$logs/peer_memory.log" 2>&1
  timeout 60 python3 kernels/rmsnorm/rmsnorm_peer.py --batch 20 > "$logs/peer_rmsnorm.log" 2>&1
  if [[ -z ${SKIP_GEMM:-} ]]; then
    timeout 60 python3 kernels/gemm/torch_gemm_peer.py > "$logs/peer_gemm.log" 2>&1
    timeout 60 python3 kernels/attention/sdpa_peer.py > "$logs/peer_sdpa.log" 2>&1
  fi
  for t in ${TESTS:-kernels/rmsnorm/rmsnorm_test kernels/add_rmsnorm/add_rmsnorm_test kernels/rope/rope_test \
      kernels/embedding/embedding_test kernels/cross_entropy/cross_entropy_test kernels/swiglu/swiglu_test \
      kernels/elementwise/elementwise_test kernels/adamw/adamw_test kernels/gemm/gemm_test \
      kernels/gemm/gemm_autotune_test comm/reduce_test compiler/autotune_test}; do
    [[ -x $B/bin/$t ]] || continue
    timeout 120 $B/run "$t" > "$logs/test_$(basename "$t").log" 2>&1
    echo "test $(basename "$t") rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$logs/test_$(basename "$t").log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$logs/test_$(basename "$t").log" | head -3
  done > "$logs/tests_summary.txt"
) &

export CUDA_VISIBLE_DEVICES=0
bench() {  # name seconds binary args...
  local name=$1 limit=$2; shift 2
  [[ -x $B/bin/$1 ]] || return
  timeout "$limit" $B/run "$@" --benchmark_min_time=0.05 > "$logs/$name.log" 2>&1 || echo "($name exited $?)"
}
bench rmsnorm 60 kernels/rmsnorm/rmsnorm_benchmark --benchmark_filter='BF16|Copy'
bench rmsnorm_sweep 150 kernels/rmsnorm/rmsnorm_benchmark --benchmark_filter='Sweep'
bench add_rmsnorm 60 kernels/add_rmsnorm/add_rmsnorm_benchmark --benchmark_filter='BF16'
bench add_rmsnorm_sweep 150 kernels/add_rmsnorm/add_rmsnorm_benchmark --benchmark_filter='Sweep'
bench rope 40 kernels/rope/rope_benchmark --benchmark_filter=BF16
bench embedding 40 kernels/embedding/embedding_benchmark --benchmark_filter=Backward
bench cross_entropy 40 kernels/cross_entropy/cross_entropy_benchmark --benchmark_filter='BF16/16384'
bench swiglu 40 kernels/swiglu/swiglu_benchmark --benchmark_filter='BF16'
bench adamw 40 kernels/adamw/adamw_benchmark
[[ -n ${SKIP_GEMM:-} ]] || bench gemm 120 kernels/gemm/gemm_benchmark --benchmark_filter='M:16384' --benchmark_counters_tabular=true
wait
cat "$logs/tests_summary.txt"

if [[ $(nvidia-smi -L | wc -l) -ge 2 && -z ${SKIP_COMM:-} ]]; then
  unset CUDA_VISIBLE_DEVICES
  timeout 120 $B/run comm/device_collectives_test > "$logs/comm_test.log" 2>&1
  echo "comm device test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$logs/comm_test.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$logs/comm_test.log" | head -5
  timeout 150 $B/run comm/launch --nproc=2 -- "$here/$B/bin/comm/collectives_benchmark" --benchmark_filter=Device \
    > "$logs/comm_bench.log" 2>&1; echo "comm bench rc=$?"
  grep -E 'rank 0\] Bench' "$logs/comm_bench.log" | sed -E 's/.*Bench\/Device_//; s/\/iterations.*algbw_GBps=([0-9.]+).*busbw_GBps=([0-9.]+).*/ algbw \1 busbw \2/' \
    | sed -E 's/.*ERROR OCCURRED/ ERROR/'
  # COMM_SWEEP="chunk_mib:max_chunk_mib:chunks:window ..." reruns the ring and send/recv entries
  # with each device-pipeline setting (ProcessGroupOptions' device_* fields).
  for c in ${COMM_SWEEP:-}; do
    IFS=: read -r cm mm ch wi <<< "$c"
    SG_BENCH_CHUNK_MIB=$cm SG_BENCH_MAX_CHUNK_MIB=$mm SG_BENCH_CHUNKS=$ch SG_BENCH_WINDOW=$wi \
      timeout 100 $B/run comm/launch --nproc=2 -- "$here/$B/bin/comm/collectives_benchmark" \
      --benchmark_filter="${COMM_SWEEP_FILTER:-Device_(RingAllReduce|RingAllGather|SendRecv)/(67108864|134217728|268435456|536870912)}" \
      > "$logs/comm_sweep_$c.log" 2>&1
    grep -E 'rank 0\] Bench' "$logs/comm_sweep_$c.log" | sed -E "s/.*Bench\/Device_/sweep $c /; s/\/iterations.*algbw_GBps=([0-9.]+).*/ algbw \1/"
  done
fi
# Our figures (benchmark name and its bandwidth / FLOP counters), then the peers'.
cat "$logs"/{rmsnorm,add_rmsnorm,rope,embedding,cross_entropy,swiglu,adamw}.log 2>/dev/null | grep -E '^BM_' \
  | sed -E 's/ +[0-9.]+ (ns|us|ms) +[0-9.]+ (ns|us|ms) +[0-9]+//' > "$logs/ours.txt"
for f in rmsnorm_sweep add_rmsnorm_sweep; do  # the best configuration per direction
  grep -E '^BM_' "$logs/$f.log" 2>/dev/null | sed -E 's/ +[0-9.]+ (ns|us|ms) +[0-9.]+ (ns|us|ms) +[0-9]+//' \
    | python3 -c 'import sys,re
rows={}
for l in sys.stdin:
  m=re.search(r"bwd:(\d)/rows:(\d+).*?([0-9.]+)(T|G)/s",l)
  if not m: continue
  v=float(m.group(3))*(1000 if m.group(4)=="T" else 1)
  rows.setdefault((m.group(1),m.group(2)),[]).append((v,re.sub(r"\s+"," ",l.strip())))
for k in sorted(rows):
  for v,l in sorted(rows[k],reverse=True)[:4]: print("top", l[:200])'
done
cut -c1-160 "$logs/ours.txt"
grep -hE 'GB/s|TB/s|TFLOP' "$logs"/peer_*.log | cut -c1-160 | head -40
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
