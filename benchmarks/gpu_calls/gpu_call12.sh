#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 7, first call: the four helper branches' first H200 run.
# GPU 1: tests (embedding scan3, attention v4/ws and v4/wsi each in its own process, wgmma GEMM and
# its SwiGLU epilogue, the compiler's fused MLP, the step tests with SG_FUSE_MLP=1).
# GPU 0: benchmarks (embedding backward, attention forward variants, GEMM, MLP up + SwiGLU), then the
# 1b step with SG_FUSE_MLP=0 / 1 / 0 on the same GPU.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
B=${B:-.gpu}
summary() { grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$1" | tr '\n' ' '; grep -E '^\[  FAILED  \]' "$1" | head -6 | tr '\n' ' '; }
bm() { grep -E '^BM_' | sed -E 's/\/manual_time//; s/ +[0-9]+ ns +[0-9]+ ns +[0-9]+ / /; s/ +[0-9.]+ us +[0-9.]+ us +[0-9]+ / /' | cut -c1-190; }
json() { grep -h '^{' "$@" | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","loss_first","loss_last") if k in j))'; }
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
(export CUDA_VISIBLE_DEVICES=1
 t() { local name=$1 limit=$2; shift 2; timeout "$limit" $B/run "$@" > "$logs/$name.log" 2>&1; echo "$name rc=$? $(summary "$logs/$name.log")"; }
 t embedding_test 100 kernels/embedding/embedding_test
 SG_ATTENTION_TEST_VARIANTS=v4/ws t attn_ws 120 kernels/attention/attention_test --gtest_filter='*AttentionCuda*'
 SG_ATTENTION_TEST_VARIANTS=v4/wsi t attn_wsi 120 kernels/attention/attention_test --gtest_filter='*AttentionCuda*'
 t attn_probe 60 kernels/attention/attention_wgmma_probe_test
 t wgmma_gemm_test 100 kernels/wgmma_gemm/wgmma_gemm_test
 t wgmma_swiglu_test 100 kernels/wgmma_gemm/wgmma_gemm_swiglu_test
 t gemm_rmsnorm_test 100 kernels/gemm_rmsnorm/gemm_rmsnorm_test
 t mlp_fusion_test 150 compiler/mlp_fusion_test --gtest_filter='MlpFusionTest.Cuda*'
 SG_FUSE_MLP=1 t llama_step_fused 150 compiler/llama_step_test --gtest_filter='*Cuda*'
 SG_FUSE_MLP=1 t compile_fused 120 compiler/compile_test --gtest_filter='*Cuda*') > "$logs/gpu1.txt" 2>&1 &
(export CUDA_VISIBLE_DEVICES=0
 timeout 90 $B/run kernels/embedding/embedding_benchmark --benchmark_min_time=0.1 \
   --benchmark_filter='Backward.*(Scan|ZeroFill|Atomic).*Batch/16384/(32000|128256)/2048' > "$logs/emb.log" 2>&1
 echo "-- embedding (rc=$?)"; grep -E '^BM_' "$logs/emb.log" | sed -E 's/^(BM_[^ ]*) .*mean_TBps=([0-9.]+).*median_TBps=([0-9.]+).*/\1 mean \2 median \3 TB\/s/' | sed 's/\/manual_time//' | cut -c1-150
 timeout 90 $B/run kernels/attention/attention_benchmark --benchmark_min_time=0.2 \
   --benchmark_filter='forward_v4/.*variant:10[489]' > "$logs/attn.log" 2>&1
 echo "-- attention fwd (rc=$?)"; bm < "$logs/attn.log"
 timeout 60 $B/run kernels/gemm_rmsnorm/gemm_rmsnorm_benchmark --benchmark_min_time=0.1 \
   --benchmark_filter='BM_Gemm/M:16384/N:(3072|8192)/K:2048/impl:[34]/' > "$logs/gemm.log" 2>&1
 echo "-- gemm (rc=$?)"; bm < "$logs/gemm.log"
 timeout 90 $B/run kernels/wgmma_gemm/wgmma_gemm_swiglu_benchmark --benchmark_min_time=0.1 > "$logs/swigemm.log" 2>&1
 echo "-- mlp up + swiglu (rc=$?)"; bm < "$logs/swigemm.log"
 for f in 0 1 0 1; do
   SG_FUSE_MLP=$f timeout 120 $B/run benchmarks/llama_step_benchmark --config=1b --recompute=selective --steps=15 --warmup=4 \
     > "$logs/step_f$f.log" 2>&1
   echo "step 1b selective SG_FUSE_MLP=$f (rc=$?): $(json "$logs/step_f$f.log") $(grep -E 'rror' "$logs/step_f$f.log" | tail -1 | cut -c1-160)"
 done) > "$logs/gpu0.txt" 2>&1 &
wait
cat "$logs/gpu1.txt" "$logs/gpu0.txt"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
