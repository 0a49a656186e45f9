#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 9, third call: the 1b FSDP step under 25 GiB, A/B on
# one machine: the bucket packing without the whole-bucket zero fill (only gaps zeroed) and compute
# waiting for the packing after the 2nd matmul from the reduce-scatter's issue (was the 1st), each
# alone and together (SG_EXP_* switches of this build), and the IPC reduction grid (16 vs 32
# blocks); then the 2-GPU FSDP comparisons against one GPU, and one traced step.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //comm:launch //compiler:distributed_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
here=$(pwd); steps=${STEPS:-12}
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
fsdp() {  # tag [env...]
  local tag=$1; shift
  env SG_COMM_IPC=1 "$@" timeout 150 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
    --config=1b --strategy=fsdp --recompute=auto --memory_budget_gib=25 --steps="$steps" --warmup=4 > "$logs/fsdp_$tag.log" 2>&1
  echo "fsdp 1b 25 $tag: $(json "$logs/fsdp_$tag.log") $(grep -E 'rror' "$logs/fsdp_$tag.log" | head -1 | cut -c1-200)"
}
fsdp new_a
fsdp old SG_EXP_ZERO_ALL=1 SG_EXP_PACKED_WAIT=1
fsdp nozero_wait1 SG_EXP_PACKED_WAIT=1
fsdp blocks16 SG_COMM_IPC_BLOCKS=16
fsdp new_b
fsdp old_b SG_EXP_ZERO_ALL=1 SG_EXP_PACKED_WAIT=1
t distributed_gpu 150 compiler/distributed_test --gtest_filter='*TwoGpus*'
SG_COMM_IPC=1 timeout 120 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
  --config=1b --strategy=fsdp --recompute=auto --memory_budget_gib=25 --steps=3 --warmup=2 \
  --trace="$logs/trace_fsdp.json" > "$logs/fsdp_traced.log" 2>&1
echo "traced fsdp (rc=$?): $(grep -h 'exposed communication' "$logs/fsdp_traced.log" | head -2 | tr '\n' ' ')"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
