#!/usr/bin/env bash
# One H200, ~8 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark
# //kernels/attention:attention_test //kernels/attention:attention_benchmark).
# The v5 attention backward with dP^T = V dO^T issued beside S^T = K Q^T, so P's exponentials run
# under it (SG_ATTN_BWD_V5_ORDER=overlap; bf16 D64 fits 255 registers without a spill): its CUDA
# tests, the kernel against the default order (ABBA, separate processes), then the 1b step both ways.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
SG_ATTN_BWD_V5_ORDER=overlap SG_ATTENTION_TEST_VARIANTS=v5 t test_v5_overlap 150 kernels/attention/attention_test --gtest_filter='*AttentionCuda*'
bwd() {  # TAG ORDER
  SG_ATTN_BWD_V5_ORDER=$2 timeout 60 .gpu/run kernels/attention/attention_benchmark \
    --benchmark_filter='BM_AttentionCuda/backward/D:(64|128)/causal:1/variant:5/|BM_AttentionCudaDefault/backward_batch/D:64/causal:1/f16:0' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > "$logs/bwd_$1.log" 2>&1
  echo "bwd $1:"; grep -E '_median' "$logs/bwd_$1.log" | tr -s ' ' | cut -c1-230
}
bwd default_a default; bwd overlap_a overlap; bwd overlap_b overlap; bwd default_b default
step() {  # TAG ORDER
  SG_ATTN_BWD_V5_ORDER=$2 timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=30 --warmup=5 \
    > "$logs/step_$1.log" 2>&1
  echo "1b $1: $(json "$logs/step_$1.log")" | sed -E 's/ (planned_arena_gib|mfu|recompute|recompute_swiglu_layers|lm_head_chunks|offload_activations|fsdp_host_gradient_units|offload_host_gib|cuda_graph)=[^ ]*//g'
}
step default_a default; step overlap_a overlap; step overlap_b overlap; step default_b default
# Where the default order's cycles go: Nsight Compute on one backward launch (D64 causal), if it runs.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
if [[ -n "$NCU" ]]; then
  for o in default overlap; do
    SG_ATTN_BWD_V5_ORDER=$o timeout 120 "$NCU" --kernel-name regex:AttentionBackwardV5 --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section Occupancy \
      --target-processes all .gpu/run kernels/attention/attention_benchmark --benchmark_filter='BM_AttentionCuda/backward/D:64/causal:1/variant:5/' \
      > "$logs/ncu_$o.txt" 2>&1
    echo "ncu $o rc=$?"; grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued|Stall|Tensor|ERR_|Executed Ipc" "$logs/ncu_$o.txt" | head -24
  done
fi
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
