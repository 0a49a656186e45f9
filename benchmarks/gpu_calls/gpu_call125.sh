#!/usr/bin/env bash
# One H200, ~3 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //kernels/attention:attention_benchmark).
# Part 2 of gpu_call124.sh, whose bundle lacked the benchmark: Nsight Compute's pipe utilization and
# executed-instruction mix of our D64 causal attention forward (WsFwdKernel) and backward
# (AttentionBackwardV5Kernel) at the 1b's shape (B 8, S 2048, 32 query / 8 kv heads), clocks left
# alone, and the kernels' SASS, to set against the cuBLAS GEMM profiled in gpu_call124.sh.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis"
prof() {  # prof NAME KERNEL-REGEX COMMAND...
  local name=$1 k=$2
  shift 2
  timeout 180 ncu --clock-control none --target-processes all -k "regex:$k" --launch-skip 3 --launch-count 1 \
    $sections --print-details all "$@" > "$logs/ncu_$name.txt" 2>&1
  echo "ncu $name rc=$?"
  grep -E 'Duration|SM Frequency|Compute \(SM\) Throughput|Executed Ipc A|Issue Slots Busy' "$logs/ncu_$name.txt" | head -8
}
filt='BM_AttentionCudaDefault/%s/D:64/causal:1/f16:0'
prof bwd AttentionBackwardV5Kernel .gpu/run kernels/attention/attention_benchmark \
  --benchmark_filter="$(printf "$filt" backward)"
prof fwd WsFwdKernel .gpu/run kernels/attention/attention_benchmark --benchmark_filter="$(printf "$filt" forward)"
cuobjdump -sass .gpu/bin/kernels/attention/attention_benchmark > "$logs/attention_sass.txt" 2>&1
echo "sass rc=$? $(wc -l < "$logs/attention_sass.txt") lines"
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
