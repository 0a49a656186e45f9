#!/usr/bin/env bash
# One H200, ~1 minute; carry [".gpu", ".gpu_old"] as gpu_call127.sh, whose batch benchmarks ran out of
# time (each batch iteration of 30 calls reported one call's time, so min_time 1 s took ~40 s).
# Old against new backward, O N O N, per call (bf16, causal, D64 and D128), then Nsight Compute's
# executed instructions of the new D64 causal backward (old: 353.5 M warp instructions, 1.02 ms).
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
bench() {  # bench TAG DIR
  timeout 40 "$2"/run kernels/attention/attention_benchmark \
    --benchmark_filter='BM_AttentionCudaDefault/backward/D:(64|128)/causal:1/f16:0' \
    --benchmark_format=csv > "$logs/bm_$1.csv" 2> "$logs/bm_$1.err"
  echo "bench $1 rc=$? $(grep -E '^"BM' "$logs/bm_$1.csv" | cut -d, -f1,3 | sed 's/BM_AttentionCudaDefault.backward.//; s/.f16:0.min_time:1.000.manual_time//' | tr '\n' ' ')"
}
bench old1 .gpu_old; bench new1 .gpu; bench old2 .gpu_old; bench new2 .gpu
timeout 60 ncu --clock-control none --target-processes all -k "regex:AttentionBackwardV5Kernel" --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section InstructionStats --section ComputeWorkloadAnalysis \
  .gpu/run kernels/attention/attention_benchmark --benchmark_filter="BM_AttentionCudaDefault/backward/D:64/causal:1/f16:0" \
  > "$logs/ncu_bwd.txt" 2>&1
echo "ncu bwd rc=$?: $(grep -E ' Duration|SM Frequency|Executed Instructions  |Issue Slots Busy' "$logs/ncu_bwd.txt" | tr -s ' ' | tr '\n' ';')"
echo "== done $(date -u +%FT%TZ)"
