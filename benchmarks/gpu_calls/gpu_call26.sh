#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 9, second call. GPU 1 alone: the attention benchmark on
# random inputs (it had timed all-zero q/k/v/dout, which let the clocks run higher than a step's),
# SDPA on the same GPU; the embedding backward with and without SG_BENCH_HOLD (the stream held while
# each batch is enqueued, so host launch gaps drop out: is the index preparation device time or
# host time?); AdamW on random data. Then both GPUs: the 1b FSDP step under 25 GiB, FSDP2's, and one
# traced FSDP step (its exposed-communication line).
# Bundle: gpu-bundle --flags "-c opt" //kernels/attention:attention_benchmark
#   //kernels/embedding:embedding_benchmark //kernels/adamw:adamw_benchmark
#   //benchmarks:llama_step_benchmark //comm:launch
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
here=$(pwd); steps=${STEPS:-12}
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
bm() {  # name filter binary [env...]
  local name=$1 filter=$2 bin=$3; shift 3
  env "$@" timeout 120 .gpu/run "$bin" --benchmark_filter="$filter" > "$logs/$name.log" 2>&1
  echo "$name (rc=$?):"; grep -E '^BM_' "$logs/$name.log" | awk '{l=$1; for(i=2;i<=NF;i++) if($i ~ /TFLOP|TBps|bytes_per/) l=l" "$i; print "  " l}'
}
(export CUDA_VISIBLE_DEVICES=1
 bm attn 'BM_AttentionCudaDefault/.*/D:(64|128)/causal:1/f16:0' kernels/attention/attention_benchmark
 timeout 120 python3 kernels/attention/sdpa_peer.py > "$logs/sdpa.log" 2>&1; echo "sdpa:"; sed 's/^/  /' "$logs/sdpa.log" | grep -v Warn | head -8
 f='Backward.*(Atomic|ZeroFill)Batch/16384/32000/(8|2048)/'
 bm emb_nohold "$f" kernels/embedding/embedding_benchmark
 bm emb_hold "$f" kernels/embedding/embedding_benchmark SG_BENCH_HOLD=1
 bm adamw 'BM_AdamWStepBF16Grad/1258291200|BM_GradNorm' kernels/adamw/adamw_benchmark) > "$logs/gpu1.txt" 2>&1
cat "$logs/gpu1.txt"
SG_COMM_IPC=1 timeout 170 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
  --config=1b --strategy=fsdp --recompute=auto --memory_budget_gib=25 --steps="$steps" --warmup=4 > "$logs/fsdp_1b.log" 2>&1
echo "ours 1b fsdp x2 auto 25: $(json "$logs/fsdp_1b.log") $(grep -E 'rror' "$logs/fsdp_1b.log" | head -1 | cut -c1-200)"
timeout 200 torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 1b --compile --fsdp --steps "$steps" \
  > "$logs/peer_1b_fsdp.log" 2>&1
echo "peer 1b fsdp x2: $(json "$logs/peer_1b_fsdp.log") $(grep -E 'Error' "$logs/peer_1b_fsdp.log" | tail -1)"
SG_COMM_IPC=1 timeout 120 .gpu/run comm/launch --nproc=2 -- "$here/.gpu/bin/benchmarks/llama_step_benchmark" \
  --config=1b --strategy=fsdp --recompute=auto --memory_budget_gib=25 --steps=3 --warmup=2 \
  --trace="$logs/trace_fsdp.json" > "$logs/fsdp_traced.log" 2>&1
echo "traced fsdp (rc=$?): $(grep -h 'exposed communication' "$logs/fsdp_traced.log" | head -2 | tr '\n' ' ')"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
