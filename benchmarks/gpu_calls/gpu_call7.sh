#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 second call: the wgmma attention backward (v5: probe, its tests,
# then every variant's tests) on GPU 1; on GPU 0 the attention backward benchmarks (v3 vs v5), the
# RMSNorm / add+RMSNorm backward sweeps (shared-memory ring included) and the peers (SDPA,
# RMSNorm / add+RMSNorm, AdamW) on the same GPU after ours.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
B=${B:-.gpu}
export PYTHONUNBUFFERED=1
summary() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; grep -E '^\[  FAILED  \]' "$1" | head -6 | tr '\n' ' '; }
strip() {
  grep -E '^BM_' | sed -E 's/min_time:0.100\///; s/\/manual_time//' \
    | sed -E 's/^(BM_[^ ]*) .*mean_TBps=([0-9.]+).*median_TBps=([0-9.]+).*/\1 mean \2 median \3 TB\/s/' | cut -c1-170
}
(export CUDA_VISIBLE_DEVICES=1
 timeout 60 $B/run kernels/attention/attention_wgmma_probe_test > "$logs/probe.log" 2>&1
 echo "probe rc=$? $(summary "$logs/probe.log")"; grep -E "Failure|error|Expected|Which is" "$logs/probe.log" | head -12
 SG_ATTENTION_TEST_VARIANTS=v5 timeout 150 $B/run kernels/attention/attention_test \
   --gtest_filter='Shapes/AttentionCudaTest.*:AttentionCudaOffsetsTest.*:AttentionCudaMergeTest.*' > "$logs/v5.log" 2>&1
 echo "v5 tests rc=$? $(summary "$logs/v5.log")"; grep -E "^\[  FAILED|error" "$logs/v5.log" | head -8
 timeout 240 $B/run kernels/attention/attention_test > "$logs/all.log" 2>&1
 echo "all attention tests rc=$? $(summary "$logs/all.log")"
 for t in kernels/rmsnorm/rmsnorm_test kernels/add_rmsnorm/add_rmsnorm_test; do
   timeout 100 $B/run $t > "$logs/$(basename $t).log" 2>&1; echo "$(basename $t) rc=$? $(summary "$logs/$(basename $t).log")"
 done) > "$logs/gpu1.txt" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
{
timeout 100 $B/run kernels/attention/attention_benchmark --benchmark_filter='backward/.*variant:(3|5)/' > "$logs/attn.log" 2>&1
echo "-- attention backward (rc=$?)"; grep -E '^BM_' "$logs/attn.log" | sed -E 's/min_time:1.000\///; s/\/manual_time//; s/ +[0-9]+ ns +[0-9]+ ns +[0-9]+ / /' | cut -c1-140
timeout 60 python3 kernels/attention/sdpa_peer.py > "$logs/sdpa.log" 2>&1; echo "-- sdpa"; grep -iE "bwd|backward" "$logs/sdpa.log" | head -8
timeout 150 $B/run kernels/rmsnorm/rmsnorm_benchmark --benchmark_filter='Sweep/bwd:1/rows:16384/.*ctas_sm:0/|BackwardBF16Batch/16384/' --benchmark_min_time=0.1 > "$logs/rms.log" 2>&1
echo "-- rms bwd sweep (rc=$?)"; strip < "$logs/rms.log"
timeout 150 $B/run kernels/add_rmsnorm/add_rmsnorm_benchmark --benchmark_filter='Sweep/bwd:1/rows:16384/.*(threads:64|stages:[1-4])|BackwardBF16Batch/16384/' --benchmark_min_time=0.1 > "$logs/add.log" 2>&1
echo "-- add bwd (rc=$?)"; strip < "$logs/add.log"
timeout 120 python3 kernels/rmsnorm/rmsnorm_peer.py --batch 10 > "$logs/rmspeer.log" 2>&1; echo "-- rmsnorm peer"; grep 16384x2048 "$logs/rmspeer.log"
timeout 100 python3 kernels/torch_peer_memory_bound.py --only adamw --batch 10 > "$logs/adampeer.log" 2>&1; echo "-- adamw peer"; tail -4 "$logs/adampeer.log"
} > "$logs/gpu0.txt" 2>&1
wait
cat "$logs/gpu1.txt" "$logs/gpu0.txt"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
