#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30, the session's last: the wgmma GEMM variants (TMA-store
# epilogue, 2-CTA clusters) and the Llama-block fused GEMM + RMSNorm, the embedding backward
# variants (tests on GPU 1, benchmarks on GPU 0), then one traced 1b step (its Chrome trace kept).
# Env: EMB_FILTER (the embedding benchmark entries).
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
B=${B:-.gpu}
summary() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; grep -E '^\[  FAILED  \]' "$1" | head -6 | tr '\n' ' '; }
bm() { grep -E '^BM_' | sed -E 's/\/manual_time//; s/ +[0-9]+ ns +[0-9]+ ns +[0-9]+ / /; s/ +[0-9.]+ us +[0-9.]+ us +[0-9]+ / /' | cut -c1-170; }
(export CUDA_VISIBLE_DEVICES=1
 t() { local name=$1; shift; timeout 100 $B/run "$@" > "$logs/$name.log" 2>&1; echo "$name rc=$? $(summary "$logs/$name.log")"; }
 t embedding_test kernels/embedding/embedding_test
 t rmsnorm_test kernels/rmsnorm/rmsnorm_test
 t add_rmsnorm_test kernels/add_rmsnorm/add_rmsnorm_test
 t wgmma_gemm_test kernels/wgmma_gemm/wgmma_gemm_test
 t gemm_rmsnorm_test kernels/gemm_rmsnorm/gemm_rmsnorm_test) > "$logs/gpu1.txt" 2>&1 &
(export CUDA_VISIBLE_DEVICES=0
 timeout 60 $B/run kernels/embedding/embedding_benchmark --benchmark_min_time=0.1 \
   --benchmark_filter="${EMB_FILTER:-Backward.*Batch/16384/(32000|128256)/2048}" > "$logs/emb.log" 2>&1
 echo "-- embedding (rc=$?)"; grep -E '^BM_' "$logs/emb.log" | sed -E 's/^(BM_[^ ]*) .*mean_TBps=([0-9.]+).*median_TBps=([0-9.]+).*/\1 mean \2 median \3 TB\/s/' | sed 's/\/manual_time//' | cut -c1-150
 timeout 90 $B/run kernels/gemm_rmsnorm/gemm_rmsnorm_benchmark --benchmark_min_time=0.1 \
   --benchmark_filter='(BM_Gemm/M:16384/N:(3072|8192)/K:2048/impl:[0345]|BM_GemmRmsNormForward/M:16384/N:(3072|8192)/K:2048/mode:[0345]|BM_LlamaBlockForward/M:16384/N:(3072|8192)/K:2048/mode:[0-3])/' \
   > "$logs/gemm.log" 2>&1
 echo "-- gemm (rc=$?)"; bm < "$logs/gemm.log"
 timeout 90 $B/run benchmarks/llama_step_benchmark --config=1b --recompute=auto --steps=10 --warmup=3 \
   --trace="$logs/trace_1b.json" > "$logs/ours.log" 2> "$logs/ours.err"
 echo "ours 1b traced (rc=$?): $(grep -E '^step ' "$logs/ours.err" | tail -1) $(grep -oE '"tokens_per_s_per_gpu":[0-9.]+' "$logs/ours.log")") > "$logs/gpu0.txt" 2>&1 &
wait
cat "$logs/gpu1.txt" "$logs/gpu0.txt"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
