#!/usr/bin/env bash
# One H200, ~2 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //kernels/attention:attention_benchmark).
# Where the attention backward's integer instructions are (gpu_call125.sh: ~20 warp instructions a
# score, most of them LOP3 / IMAD / ISETP): Nsight Compute's source page, SASS with each
# instruction's executed count (SourceCounters), for AttentionBackwardV5Kernel and WsFwdKernel at
# the 1b's shape (D64 causal bf16), clocks left alone.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
filt='BM_AttentionCudaDefault/%s/D:64/causal:1/f16:0'
src() {  # src NAME KERNEL PHASE
  timeout 200 ncu --clock-control none --target-processes all -k "regex:$2" --launch-skip 3 --launch-count 1 \
    --section SourceCounters --page source --print-source sass --csv \
    .gpu/run kernels/attention/attention_benchmark --benchmark_filter="$(printf "$filt" "$3")" \
    > "$logs/src_$1.csv" 2> "$logs/src_$1.err"
  echo "src $1 rc=$? $(wc -l < "$logs/src_$1.csv") lines"
  head -3 "$logs/src_$1.csv" | cut -c1-300
}
src bwd AttentionBackwardV5Kernel backward
src fwd WsFwdKernel forward
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
