#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 last call: the wgmma GEMM (probe, tests) and the fused
# GEMM + RMSNorm benchmark, the embedding / AdamW tests after their clean-ups (GPU 1 for tests,
# GPU 0 for the GEMM benchmark), then the single-GPU 1b step with every new default, ours and the
# torch.compile peer on GPU 0 one after the other.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
B=${B:-.gpu}
export PYTHONUNBUFFERED=1
summary() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; grep -E '^\[  FAILED  \]' "$1" | head -6 | tr '\n' ' '; }
json() { grep -h '^{' "$@" | tail -1 | python3 -c 'import json,sys
try: j=json.loads(sys.stdin.read())
except Exception: print("(no result)"); sys.exit()
print(" ".join(f"{k}={round(j[k],3) if isinstance(j[k],float) else j[k]}" for k in ("tokens_per_s_per_gpu","step_ms_median","peak_gib","mfu","loss_first","loss_last","recompute_swiglu_layers") if k in j))'; }
(export CUDA_VISIBLE_DEVICES=1
 for t in kernels/embedding/embedding_test kernels/adamw/adamw_test; do
   [[ -x $B/bin/$t ]] || continue
   timeout 90 $B/run $t > "$logs/$(basename $t).log" 2>&1; echo "$(basename $t) rc=$? $(summary "$logs/$(basename $t).log")"
 done
 timeout 60 $B/run kernels/wgmma_gemm/wgmma_gemm_test --gtest_filter='*OneTileProbes*' > "$logs/probe.log" 2>&1
 probe=$?
 echo "wgmma probe rc=$probe $(summary "$logs/probe.log")"; grep -E "Failure|Expected|Which is|wrong|mismatch" "$logs/probe.log" | head -8 | cut -c1-200
 if [[ $probe == 0 ]]; then
   for t in kernels/wgmma_gemm/wgmma_gemm_test kernels/gemm_rmsnorm/gemm_rmsnorm_test; do
     timeout 90 $B/run $t > "$logs/$(basename $t).log" 2>&1; echo "$(basename $t) rc=$? $(summary "$logs/$(basename $t).log")"
   done
 fi) > "$logs/gpu1.txt" 2>&1 &
(export CUDA_VISIBLE_DEVICES=0
 g() {  # filter: the GEMM benchmark entries, one process (a trapped wgmma kernel ends only its own)
   timeout 70 $B/run kernels/gemm_rmsnorm/gemm_rmsnorm_benchmark --benchmark_filter="$1" --benchmark_min_time=0.2 >> "$logs/gemm.log" 2>&1
   echo "(gemm rc=$?)"; }
 timeout 60 $B/run kernels/adamw/adamw_benchmark --benchmark_filter='/1258291200' > "$logs/adamw.log" 2>&1
 echo "-- adamw"; grep -E '^BM_' "$logs/adamw.log" | sed -E 's/\/manual_time//; s/ +[0-9]+ ns +[0-9]+ ns +[0-9]+ / /' | cut -c1-150
 g 'BM_Gemm/M:16384.*impl:[02]|BM_GemmRmsNormForward/M:16384.*mode:[01]'
 g 'BM_Gemm/M:16384.*impl:[13]|BM_GemmRmsNormForward/M:16384.*mode:3'
 echo "-- gemm"; grep -E '^BM_' "$logs/gemm.log" | sed -E 's/\/manual_time//; s/ +[0-9]+ ns +[0-9]+ ns +[0-9]+ / /' | cut -c1-160
 timeout 100 $B/run benchmarks/llama_step_benchmark --config=1b --recompute=auto --steps=20 --warmup=5 > "$logs/ours.log" 2>&1
 echo "ours 1b: $(json "$logs/ours.log") $(grep -E 'rror' "$logs/ours.log" | tail -1 | cut -c1-160)"
 timeout 120 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 > "$logs/peer.log" 2>&1
 echo "peer 1b: $(json "$logs/peer.log")") > "$logs/gpu0.txt" 2>&1 &
wait
cat "$logs/gpu1.txt" "$logs/gpu0.txt"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
