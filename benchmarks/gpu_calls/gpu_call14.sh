#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 7, third call: the helpers' warp-specialized attention
# backward (SG_ATTN_BWD_VARIANT=ws) and the embedding backward "overlap", tests then benchmarks,
# then the 1b step (auto recompute) with the v5 and ws backwards against the peer on the same GPU.
# GPU 1: tests, then peer + ours (ws backward). GPU 0: benchmarks, then ours (v5), peer, ours (ws).
# Bundle: gpu-bundle --flags "-c opt" //kernels/attention:attention_test //kernels/attention:attention_benchmark \
#   //kernels/embedding:all //benchmarks:llama_step_benchmark //compiler:llama_step_test //compiler:compile_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
steps=${STEPS:-20}
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
summary() { grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$1" | tr '\n' ' '; grep -E '^\[  FAILED  \]' "$1" | head -6 | tr '\n' ' '; }
bm() { grep -E '^BM_' | sed -E 's/\/manual_time//; s/ +[0-9.]+ [mu]s +[0-9.]+ [mu]s +[0-9]+ / /' | cut -c1-170; }
json() { grep -h '^{' "$@" | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","mfu","loss_first","loss_last","recompute") if k in j))'; }
ours() {  # gpu tag bwd-variant
  CUDA_VISIBLE_DEVICES=$1 SG_ATTN_BWD_VARIANT=$3 timeout 150 .gpu/run benchmarks/llama_step_benchmark --config=1b \
    --recompute=auto --steps="$steps" --warmup=5 > "$logs/ours_$2.log" 2>&1
  echo "ours gpu$1 bwd=${3:-v5}: $(json "$logs/ours_$2.log") $(grep -E 'rror' "$logs/ours_$2.log" | tail -1 | cut -c1-160)"
}
peer() {
  CUDA_VISIBLE_DEVICES=$1 timeout 200 python3 benchmarks/llama_peer.py --config 1b --compile --steps "$steps" \
    > "$logs/peer_g$1.log" 2>&1
  echo "peer gpu$1: $(json "$logs/peer_g$1.log") $(grep -E 'Error' "$logs/peer_g$1.log" | tail -1)"
}
(export CUDA_VISIBLE_DEVICES=1
 t() { local name=$1 limit=$2; shift 2; timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1; echo "$name rc=$? $(summary "$logs/$name.log")"; }
 t embedding_test 120 kernels/embedding/embedding_test
 SG_ATTENTION_TEST_VARIANTS=v5/bwd-ws t attn_bwd_ws 150 kernels/attention/attention_test --gtest_filter='*AttentionCuda*'
 SG_ATTENTION_TEST_VARIANTS=v4/wgmma,v4/ws,v5 t attn_rest 150 kernels/attention/attention_test --gtest_filter='*AttentionCuda*'
 t attn_cpu 60 kernels/attention/attention_test --gtest_filter='AttentionCpu*'
 SG_ATTN_BWD_VARIANT=ws t llama_step_ws 150 compiler/llama_step_test --gtest_filter='*Cuda*'
 SG_EMBEDDING_BWD=overlap t compile_overlap 120 compiler/compile_test --gtest_filter='*Cuda*'
 peer 1 b; ours 1 b ws) > "$logs/gpu1.txt" 2>&1 &
(export CUDA_VISIBLE_DEVICES=0
 timeout 90 .gpu/run kernels/embedding/embedding_benchmark --benchmark_min_time=0.1 \
   --benchmark_filter='Backward.*(Atomic|Scan|Overlap|ZeroFill).*Batch/16384/(32000|128256)/2048' > "$logs/emb.log" 2>&1
 echo "-- embedding (rc=$?)"; grep -E '^BM_' "$logs/emb.log" | sed -E 's/^(BM_[^ ]*) .*mean_TBps=([0-9.]+).*median_TBps=([0-9.]+).*/\1 mean \2 median \3 TB\/s/' | sed 's/\/manual_time//' | cut -c1-150
 timeout 90 .gpu/run kernels/attention/attention_benchmark --benchmark_min_time=0.2 --benchmark_filter='backward_v5/' > "$logs/attn.log" 2>&1
 echo "-- attention bwd (rc=$?)"; bm < "$logs/attn.log"
 ours 0 a ""; peer 0; ours 0 c ws) > "$logs/gpu0.txt" 2>&1 &
wait
cat "$logs/gpu1.txt" "$logs/gpu0.txt"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
