#!/usr/bin/env bash
# One GPU call (2 H200s), 2026-11-30: the AdamW kernel variants (tests on GPU 1, benchmarks and the
# torch peers on GPU 0), the RMSNorm tests with the new backward default, then FSDP over both GPUs
# (1b under 25 GiB, 7b with recompute; ours, then FSDP2 + compile) through gpu_e2e_run.sh.
set -u
out=${OUT:-/tmp/out}; logs=$out/klogs; mkdir -p "$logs"
B=${B:-.gpu}
summary() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; grep -E '^\[  FAILED  \]' "$1" | head -6 | tr '\n' ' '; }
strip() {
  grep -E '^BM_' | sed -E 's/\/manual_time//' \
    | sed -E 's/^(BM_[^ ]*) +([0-9.]+ [mu]?s) .*mean_TBps=([0-9.]+).*median_TBps=([0-9.]+).*/\1 \2 mean \3 median \4 TB\/s/' | cut -c1-170
}
V='grid8_u1|res_u1|res_u2|tile_u1|tile_u2|tile_u4|tile_u2_cs|tile_u2_stcs|tile_u2_na|tile_u2_v8|flat_u1|flat_u2|flat_u2_cs|flat_u2_v8'
(export CUDA_VISIBLE_DEVICES=1
 for t in kernels/adamw/adamw_test kernels/rmsnorm/rmsnorm_test; do
   timeout 150 $B/run $t > "$logs/$(basename $t).log" 2>&1; echo "$(basename $t) rc=$? $(summary "$logs/$(basename $t).log")"
 done) > "$logs/gpu1.txt" 2>&1 &
(export CUDA_VISIBLE_DEVICES=0
 timeout 200 $B/run kernels/adamw/adamw_benchmark --benchmark_filter="F32Grad(NoCopy)?/(($V)/)?1258291200" > "$logs/adamw.log" 2>&1
 echo "-- adamw (rc=$?)"; strip < "$logs/adamw.log"
 timeout 150 python3 kernels/torch_peer_memory_bound.py --only adamw --batch 5 > "$logs/peer.log" 2>&1
 echo "-- peer (rc=$?)"; grep -E "AdamW|rror" "$logs/peer.log" | cut -c1-170) > "$logs/gpu0.txt" 2>&1 &
wait
cat "$logs/gpu1.txt" "$logs/gpu0.txt"
tar czf "$out/kernels_logs.tgz" -C "$out" klogs && rm -rf "$logs"
RUNS=" " CONFIGS=" " SKIP_TESTS=1 SKIP_TRAINER=1 SKIP_CPPP=1 FSDP_RUNS=${FSDP_RUNS:-1b:auto:25:1 7b:auto:42:1} \
  FSDP_PEERS=${FSDP_PEERS:-1b 7b} bash benchmarks/gpu_e2e_run.sh
