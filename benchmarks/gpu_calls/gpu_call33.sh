#!/usr/bin/env bash
# Prepared for the next session's first GPU call (1 H200): --wgrad_stream (the weight-gradient
# matmuls on a stream of their own, overlapping the backward's data-gradient chain: SwiGLU, norm and
# RoPE backwards, the data-gradient GEMMs) on the 1b step at the default budget, alternating with the
# one-stream step on one GPU, then the peer; its knobs (SG_WGRAD_JOIN_MATMULS, SG_WGRAD_PRIORITY,
# SG_WGRAD_SMS);
# the CUDA tests of the split (against the one-stream step, eager and CUDA-graph replays); one
# traced step with it.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //compiler:compile_test
#   //compiler:llama_step_test //kernels/gemm:gemm_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t compile_wgrad 120 compiler/compile_test --gtest_filter='*Wgrad*:*CudaGraph*'
for i in a b; do
  ours_1b "one_stream_$i"
  ours_1b "wgrad_stream_$i" --wgrad_stream
done
# The knobs: joins later (4 matmuls on), and either stream first for the SMs (graph node priority).
SG_WGRAD_JOIN_MATMULS=4 ours_1b wgrad_join4 --wgrad_stream
SG_WGRAD_PRIORITY=compute ours_1b wgrad_compute_first --wgrad_stream
SG_WGRAD_PRIORITY=wgrad ours_1b wgrad_wgrad_first --wgrad_stream
# The weight-gradient GEMMs planned for fewer SMs (cuBLASLt's SM-count target), the rest left to
# the compute stream's kernels: 116 and 100 of the 132.
SG_WGRAD_SMS=116 ours_1b wgrad_sms116 --wgrad_stream
SG_WGRAD_SMS=100 ours_1b wgrad_sms100 --wgrad_stream
t gemm_sm_count 60 kernels/gemm/gemm_test --gtest_filter='*SmCount*:*SecondStream*'
SG_WGRAD_PRIORITY=compute t compile_wgrad_priority 120 compiler/compile_test --gtest_filter='*Wgrad*' 
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
timeout 90 .gpu/run benchmarks/llama_step_benchmark --config=1b --wgrad_stream --steps=6 --warmup=3 \
  --trace="$logs/trace_wgrad.json" > "$logs/traced.log" 2>&1
echo "traced (rc=$?): $(grep -h 'exposed communication' "$logs/traced.log" | tail -1)"
t llama_step_test 150 compiler/llama_step_test --gtest_filter='*Cuda*'
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
