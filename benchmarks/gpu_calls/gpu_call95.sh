#!/usr/bin/env bash
# One H200, ~5 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //compiler:llama_step_test
# //compiler:compile_test //kernels/wgmma_gemm:wgmma_gemm_swiglu_test //benchmarks:llama_step_benchmark).
# After gpu_call94: the compiler lowers each layer's swiglu_backward and its dh matmul into the fused
# WgmmaGemmSwiGluBackward (on by default). The tests (the CUDA step against the CPU step, fused and
# unfused), then the 1b step with the fusion off (SG_FUSE_SWIGLU_BWD=0) and on, interleaved, and the peer.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
t step 300 compiler/llama_step_test
grep -E 'arena|fused' "$logs/step.log" | head -6
t swiglu 300 kernels/wgmma_gemm/wgmma_gemm_swiglu_test
t compile 300 compiler/compile_test
SG_FUSE_SWIGLU_BWD=0 ours_1b off_a
ours_1b on_a
timeout 110 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error|no energy' "$logs/peer_1b.log" | tail -1)"
ours_1b on_b
SG_FUSE_SWIGLU_BWD=0 ours_1b off_b
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
