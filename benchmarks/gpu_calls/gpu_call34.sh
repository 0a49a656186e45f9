#!/usr/bin/env bash
# Prepared for the next session (2 H200s): --wgrad_stream on the 1b FSDP step under 25 GiB (the
# weight-gradient matmuls on their own stream, joined before each unit's reduce-scatter),
# alternating with the one-stream step, then FSDP2's; every GEMM planned for fewer SMs (SG_GEMM_SMS);
# the 2-GPU comparison with it (and without).
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch //compiler:distributed_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
steps=${STEPS:-12}
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
t distributed_wgrad 150 compiler/distributed_test --gtest_filter='*TwoGpus*'
for i in a b; do
  fsdp_1b "one_stream_$i"
  fsdp_1b "wgrad_$i" --wgrad_stream
done
# Every GEMM planned for 116 of the 132 SMs (SG_GEMM_SMS), leaving room to the IPC collectives'
# reduction blocks (32) that run beside the step's GEMMs: does the +2.9 ms of slowed GEMMs shrink?
SG_GEMM_SMS=116 fsdp_1b gemm_sms116
SG_GEMM_SMS=116 fsdp_1b wgrad_gemm_sms116 --wgrad_stream
timeout 200 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 1b --compile --fsdp --steps "$steps" \
  > "$logs/peer_1b_fsdp.log" 2>&1
echo "peer 1b fsdp x2: $(json "$logs/peer_1b_fsdp.log") $(grep -E 'Error' "$logs/peer_1b_fsdp.log" | tail -1)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
