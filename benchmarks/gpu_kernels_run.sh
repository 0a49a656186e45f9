#!/usr/bin/env bash
# One GPU-machine call: every bundled test, the kernel benchmarks and their PyTorch peers, and the
# 2-GPU comm test/benchmark when two GPUs are present. Full logs go to $OUT; a short table ends it.
# Build first (here): ../shared/tools/gpu-bundle --flags "-c opt" //kernels/... //comm:launch \
#   //comm:collectives_benchmark //comm:device_collectives_test //compiler:compile_test
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
B=${B:-.gpu}  # the bundle directory
export PYTHONUNBUFFERED=1
ngpu=$(nvidia-smi -L | wc -l)
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$ngpu"
GPU_TEST_TIMEOUT=240 $B/run-tests > "$out/tests.log" 2>&1
grep -E '^(PASS|FAIL) |passed, ' "$out/tests.log"
bench() {  # name binary args...
  local name=$1; shift
  timeout 120 $B/run "$@" --benchmark_min_time=0.1 > "$out/$name.log" 2>&1 || echo "($name exited $?)"
}
bench rmsnorm kernels/rmsnorm/rmsnorm_benchmark
bench add_rmsnorm kernels/add_rmsnorm/add_rmsnorm_benchmark
bench elementwise kernels/elementwise/elementwise_benchmark
bench swiglu kernels/swiglu/swiglu_benchmark
bench rope kernels/rope/rope_benchmark
bench embedding kernels/embedding/embedding_benchmark
bench cross_entropy kernels/cross_entropy/cross_entropy_benchmark
bench adamw kernels/adamw/adamw_benchmark
bench gemm kernels/gemm/gemm_benchmark --benchmark_filter='algo:0'
bench gemm_tuned kernels/gemm/gemm_benchmark --benchmark_filter='algo:1'  # autotuned cuBLASLt algorithms
bench gemm_rmsnorm kernels/gemm_rmsnorm/gemm_rmsnorm_benchmark
bench attention kernels/attention/attention_benchmark
cat "$out"/{rmsnorm,add_rmsnorm,elementwise,swiglu,rope,embedding,cross_entropy,adamw,gemm,gemm_tuned,gemm_rmsnorm,attention}.log \
  | grep -E '^BM_' | sed -E 's/ +[0-9.]+ (ns|us|ms) +[0-9.]+ (ns|us|ms) +[0-9]+//' > "$out/ours.txt"
timeout 200 python3 kernels/torch_peer_memory_bound.py > "$out/peer_memory.log" 2>&1 || echo "(peer_memory exited $?)"
timeout 120 python3 kernels/rmsnorm/rmsnorm_peer.py > "$out/peer_rmsnorm.log" 2>&1 || echo "(peer_rmsnorm exited $?)"
timeout 120 python3 kernels/gemm/torch_gemm_peer.py > "$out/peer_gemm.log" 2>&1 || echo "(peer_gemm exited $?)"
timeout 120 python3 kernels/attention/sdpa_peer.py > "$out/peer_sdpa.log" 2>&1 || echo "(peer_sdpa exited $?)"
if [[ $ngpu -ge 2 && -x $B/bin/comm/launch ]]; then
  timeout 240 $B/run comm/device_collectives_test > "$out/comm_test.log" 2>&1; echo "comm device test rc=$?"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/comm_test.log" | head -5
  timeout 300 $B/run comm/launch --nproc=2 -- "$(pwd)/$B/bin/comm/collectives_benchmark" --benchmark_filter=Device \
    > "$out/comm_bench.log" 2>&1; echo "comm bench rc=$?"
  grep -E 'rank 0.*BM_' "$out/comm_bench.log" | sed -E 's/ +[0-9.]+ (ns|us|ms) +[0-9.]+ (ns|us|ms) +[0-9]+//' > "$out/comm.txt"
fi
cat "$out/ours.txt"
grep -hE "GB/s|TFLOP" "$out"/peer_*.log | head -60
echo "== done $(date -u +%FT%TZ)"
