#!/usr/bin/env bash
# One GPU call (2 H200s): SwiGLU bf16 16384 x 8192 forward/backward in batch timing, the default
# (flat) kernel and the grid-stride fallback (SG_SWIGLU_KERNEL=grid), on GPU 0, while GPU 1 runs the
# torch peer (eager / torch.compile); then swiglu_test (it covers both itself).
# Bundle: gpu-bundle --flags "-c opt" //kernels/swiglu:swiglu_benchmark //kernels/swiglu:swiglu_test
(CUDA_VISIBLE_DEVICES=1 timeout 150 python3 kernels/torch_peer_memory_bound.py --only swiglu --batch 10 > /tmp/peer.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0
timeout 60 .gpu/run kernels/swiglu/swiglu_benchmark --benchmark_filter='BF16(Grid)?Batch/16384/8192' > /tmp/b.log 2>&1
grep -E '^BM_' /tmp/b.log | sed -E 's/ +[0-9.]+ (ns|us|ms) +[0-9.]+ (ns|us|ms) +[0-9]+//; s/manual_time//' | cut -c1-150
timeout 120 .gpu/run kernels/swiglu/swiglu_test > /tmp/t.log 2>&1; echo "swiglu_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' /tmp/t.log | tr '\n' ' ')"
wait; grep -iE "swiglu" /tmp/peer.log | head -8
