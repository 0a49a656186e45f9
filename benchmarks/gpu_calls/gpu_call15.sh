#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 session 7, fourth call: validation of the shared sm_90 header
# (kernels/core/sm90.h) and the attention family cleanup (every attention / wgmma / embedding CUDA
# test on GPU 1; the scan3 and GEMM benchmarks on GPU 0), then the 1b step with its peer on the
# same GPU (GPU 0), then FSDP over both GPUs (1b under 25 GiB, 7b) with FSDP2 peers through
# gpu_e2e_run.sh, then the 2-GPU step tests.
set -u
out=${OUT:-/tmp/out}; logs=$out/klogs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
summary() { grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$1" | tr '\n' ' '; grep -E '^\[  FAILED  \]' "$1" | head -6 | tr '\n' ' '; }
bm() { grep -E '^BM_' | sed -E 's/\/manual_time//; s/ +[0-9.]+ [mu]s +[0-9.]+ [mu]s +[0-9]+ / /' | cut -c1-170; }
json() { grep -h '^{' "$@" | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","mfu","loss_first","loss_last","recompute","recompute_swiglu_layers") if k in j))'; }
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
(export CUDA_VISIBLE_DEVICES=1
 t() { local name=$1 limit=$2; shift 2; timeout "$limit" .gpu/run "$@" > "$logs/$name.log" 2>&1; echo "$name rc=$? $(summary "$logs/$name.log")"; }
 t attention_test 200 kernels/attention/attention_test
 t attn_probe 60 kernels/attention/attention_wgmma_probe_test
 t wgmma_gemm_test 100 kernels/wgmma_gemm/wgmma_gemm_test
 t wgmma_swiglu_test 100 kernels/wgmma_gemm/wgmma_gemm_swiglu_test
 t gemm_rmsnorm_test 100 kernels/gemm_rmsnorm/gemm_rmsnorm_test
 t embedding_test 120 kernels/embedding/embedding_test
 t llama_step_test 150 compiler/llama_step_test --gtest_filter='*Cuda*'
 t compile_test 120 compiler/compile_test --gtest_filter='*Cuda*'
 t f16_mixed 120 compiler/f16_mixed_precision_test --gtest_filter='*Cuda*:*Gpu*') > "$logs/gpu1.txt" 2>&1 &
(export CUDA_VISIBLE_DEVICES=0
 timeout 60 .gpu/run kernels/embedding/embedding_benchmark --benchmark_min_time=0.1 \
   --benchmark_filter='Backward.*(Atomic|Scan3)Batch/16384/(32000|128256)/2048' > "$logs/emb.log" 2>&1
 echo "-- embedding (rc=$?)"; grep -E '^BM_' "$logs/emb.log" | sed -E 's/^(BM_[^ ]*) .*mean_TBps=([0-9.]+).*/\1 mean \2 TB\/s/' | sed 's/\/manual_time//'
 timeout 60 .gpu/run kernels/gemm_rmsnorm/gemm_rmsnorm_benchmark --benchmark_min_time=0.1 \
   --benchmark_filter='BM_Gemm/M:16384/N:(3072|8192)/K:2048/impl:[04]/' > "$logs/gemm.log" 2>&1
 echo "-- gemm (rc=$?)"; bm < "$logs/gemm.log"
 for w in ours peer ours; do
   if [[ $w == ours ]]; then
     timeout 150 .gpu/run benchmarks/llama_step_benchmark --config=1b --recompute=auto --steps=20 --warmup=5 > "$logs/step_$w.log" 2>&1
   else
     timeout 200 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 > "$logs/step_$w.log" 2>&1
   fi
   echo "1b $w: $(json "$logs/step_$w.log") $(grep -E 'Error|rror:' "$logs/step_$w.log" | tail -1 | cut -c1-150)"
 done) > "$logs/gpu0.txt" 2>&1 &
wait
cat "$logs/gpu1.txt" "$logs/gpu0.txt"
tar czf "$out/kernels_logs.tgz" -C "$out" klogs && rm -rf "$logs"
RUNS=" " CONFIGS=" " SKIP_TESTS=1 SKIP_TRAINER=1 SKIP_CPPP=1 FSDP_RUNS=${FSDP_RUNS:-1b:auto:25:1 7b:auto:42:1} \
  FSDP_PEERS=${FSDP_PEERS:-1b 7b} bash benchmarks/gpu_e2e_run.sh
