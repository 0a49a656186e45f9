#!/usr/bin/env bash
# Prepared for the next session (2 H200s): --wgrad_stream on the 1b FSDP step under 25 GiB (the
# weight-gradient matmuls on their own stream, joined before each unit's reduce-scatter),
# alternating with the one-stream step, then FSDP2's; every GEMM planned for fewer SMs (SG_GEMM_SMS);
# the 2-GPU comparison with it (and without).
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch //compiler:distributed_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
here=$(pwd); steps=${STEPS:-12}
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
fsdp() {  # tag [flags...]
  local tag=$1; shift
  SG_COMM_IPC=1 timeout 150 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=1b --strategy=fsdp --recompute=auto --memory_budget_gib=25 --steps="$steps" --warmup=4 "$@" > "$logs/fsdp_$tag.log" 2>&1
  echo "fsdp 1b 25 $tag: $(json "$logs/fsdp_$tag.log") $(grep -E 'rror' "$logs/fsdp_$tag.log" | head -1 | cut -c1-200)"
}
t distributed_wgrad 150 compiler/distributed_test --gtest_filter='*TwoGpus*'
for i in a b; do
  fsdp "one_stream_$i"
  fsdp "wgrad_$i" --wgrad_stream
done
# Every GEMM planned for 116 of the 132 SMs (SG_GEMM_SMS), leaving room to the IPC collectives'
# reduction blocks (32) that run beside the step's GEMMs: does the +2.9 ms of slowed GEMMs shrink?
SG_GEMM_SMS=116 fsdp gemm_sms116
SG_GEMM_SMS=116 fsdp wgrad_gemm_sms116 --wgrad_stream
timeout 200 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 1b --compile --fsdp --steps "$steps" \
  > "$logs/peer_1b_fsdp.log" 2>&1
echo "peer 1b fsdp x2: $(json "$logs/peer_1b_fsdp.log") $(grep -E 'Error' "$logs/peer_1b_fsdp.log" | tail -1)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
