#!/usr/bin/env bash
# One GPU-machine call on 2 H200s for the Llama-1B figures: the attention kernels (tests over every
# variant, benchmark vs SDPA), the 1b step on GPU 0 under several recompute policies / attention
# variants while the torch.compile peer runs on GPU 1, then FSDP on both GPUs (ours, then FSDP2),
# then the ring vs NCCL collectives. Logs go to $OUT; one short line per item is printed.
# Build first (here):
#   ../shared/tools/gpu-bundle --flags "-c opt" //kernels/attention:attention_test \
#     //kernels/attention:attention_benchmark //benchmarks:llama_step_benchmark //comm:launch \
#     //comm:collectives_benchmark
# Knobs: RUNS="none:v2 selective:v3 ..." (recompute:attention variant), STEPS, SKIP_ATTN=1,
# SKIP_FSDP=1, SKIP_COMM=1, TRACE=1 (a Chrome trace of the first run).
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
here=$(pwd)
steps=${STEPS:-20}
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
json() { grep '^{' "$1" | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","mfu","loss_first","loss_last","recompute","world") if k in j))'; }

# GPU 1: the single-GPU peer, then the attention tests. GPU 0: our 1b runs.
(CUDA_VISIBLE_DEVICES=1 timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps "$steps" \
   > "$out/peer_1b.log" 2>&1
 if [[ -z ${SKIP_ATTN:-} ]]; then
   CUDA_VISIBLE_DEVICES=1 timeout 150 .gpu/run kernels/attention/attention_test > "$out/attention_test.log" 2>&1
 fi) &
first=1
for r in ${RUNS:-none:v2 selective:v2 selective:v3}; do
  rc=${r%%:*}; variant=${r##*:}
  extra=()
  [[ -n ${TRACE:-} && $first == 1 ]] && extra=(--trace="$out/trace_1b.json")
  first=0
  CUDA_VISIBLE_DEVICES=0 SG_ATTENTION_KERNEL=$variant timeout 100 .gpu/run benchmarks/llama_step_benchmark \
    --config=1b --recompute="$rc" --steps="$steps" --warmup=5 "${extra[@]}" > "$out/ours_1b_${rc}_$variant.log" 2>&1
  echo "ours 1b $rc $variant: $(json "$out/ours_1b_${rc}_$variant.log") $(grep -E 'error|Error|step [0-9.]+ ms' "$out/ours_1b_${rc}_$variant.log" | tail -2)"
done
wait
echo "peer 1b: $(json "$out/peer_1b.log") $(grep -E 'Error' "$out/peer_1b.log" | tail -1)"
if [[ -z ${SKIP_ATTN:-} ]]; then
  echo "attention_test: $(grep -E '^\[  (PASSED|FAILED) ' "$out/attention_test.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$out/attention_test.log" | head -8
  CUDA_VISIBLE_DEVICES=0 timeout 100 .gpu/run kernels/attention/attention_benchmark --benchmark_min_time=0.1 \
    --benchmark_counters_tabular=true > "$out/attention_bench.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout 100 python3 kernels/attention/sdpa_peer.py > "$out/sdpa_peer.log" 2>&1
  wait
fi
if [[ -z ${SKIP_FSDP:-} ]]; then
  timeout 120 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" --config=1b \
    --strategy=fsdp --recompute="${FSDP_RECOMPUTE:-auto}" --steps="$steps" --warmup=5 > "$out/ours_1b_fsdp.log" 2>&1
  echo "ours 1b fsdp x2: $(json "$out/ours_1b_fsdp.log") $(grep -iE 'error' "$out/ours_1b_fsdp.log" | head -2)"
  timeout 170 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 1b --compile --fsdp --steps "$steps" \
    > "$out/peer_1b_fsdp.log" 2>&1
  echo "peer 1b fsdp x2: $(json "$out/peer_1b_fsdp.log") $(grep -E 'Error' "$out/peer_1b_fsdp.log" | tail -1)"
fi
if [[ -z ${SKIP_COMM:-} ]]; then
  timeout 150 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/comm/collectives_benchmark" --benchmark_filter=Device \
    --benchmark_min_time=0.05 > "$out/comm_bench.log" 2>&1
  echo "comm bench rc=$?"
fi
echo "== done $(date -u +%FT%TZ)"
