#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30 third kernels call: the one-kernel embedding backward ("scan")
# against the atomic and sorted paths (tests on GPU 1, benchmarks on GPU 0), the RMSNorm /
# add+RMSNorm backward sweeps at both Llama widths (to pick the defaults), then FSDP 1b on both GPUs
# (ours, then FSDP2 + compile) via gpu_e2e_run.sh.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
B=${B:-.gpu}
summary() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; grep -E '^\[  FAILED  \]' "$1" | head -6 | tr '\n' ' '; }
strip() {
  grep -E '^BM_' | sed -E 's/min_time:0.100\///; s/\/manual_time//' \
    | sed -E 's/^(BM_[^ ]*) .*mean_TBps=([0-9.]+).*median_TBps=([0-9.]+).*/\1 mean \2 median \3 TB\/s/' | cut -c1-170
}
(export CUDA_VISIBLE_DEVICES=1
 for t in kernels/embedding/embedding_test kernels/rmsnorm/rmsnorm_test kernels/add_rmsnorm/add_rmsnorm_test; do
   timeout 150 $B/run $t > "$logs/$(basename $t).log" 2>&1; echo "$(basename $t) rc=$? $(summary "$logs/$(basename $t).log")"
 done) > "$logs/gpu1.txt" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
m="--benchmark_min_time=0.1"
{
timeout 120 $B/run kernels/embedding/embedding_benchmark --benchmark_filter='Batch/16384/(32000|128256)/(2048|8)' $m > "$logs/emb.log" 2>&1
echo "-- embedding (rc=$?)"; strip < "$logs/emb.log"
timeout 170 $B/run kernels/rmsnorm/rmsnorm_benchmark --benchmark_filter='Sweep/bwd:1/.*ctas_sm:0/.*stages:0|BackwardBF16Batch/(16384/2048|8192/4096)' $m > "$logs/rms.log" 2>&1
echo "-- rms bwd (rc=$?)"; strip < "$logs/rms.log"
timeout 170 $B/run kernels/add_rmsnorm/add_rmsnorm_benchmark --benchmark_filter='Sweep/bwd:1/.*ctas_sm:0/.*pdl:1/stages:0|Sweep/bwd:1/.*threads:256.*stages:2|BackwardBF16Batch/(16384/2048|8192/4096)' $m > "$logs/add.log" 2>&1
echo "-- add bwd (rc=$?)"; strip < "$logs/add.log"
} > "$logs/gpu0.txt" 2>&1
wait
cat "$logs/gpu1.txt" "$logs/gpu0.txt"
tar czf "$out/kernels_logs.tgz" -C "$out" logs && rm -rf "$logs"
unset CUDA_VISIBLE_DEVICES  # both GPUs for FSDP (its first run forgot this: FSDP saw one GPU)
RUNS=" " CONFIGS=" " SKIP_TESTS=1 SKIP_TRAINER=1 SKIP_CPPP=1 FSDP_RUNS=${FSDP_RUNS:-1b:auto:25:1} FSDP_PEERS=${FSDP_PEERS:-1b} \
  bash benchmarks/gpu_e2e_run.sh
