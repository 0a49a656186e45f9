#!/usr/bin/env bash
# Prepared for the next session (1 H200, ~4 minutes): issue #3's last 2%. The embedding tests (the
# bitwise comparisons include the sums at 3 and 5 CTAs per SM), then atomic2s's sums at 5 CTAs per
# SM (SG_EMBEDDING_SUM_CTAS=5: 48 registers with ~200 B of spills; 3 -> 4 gained 2%) against the
# default, alternating, plain and with a hot id; then Nsight Compute on the backward's kernels at the
# issue's shape (each kernel alone: duration, DRAM throughput, occupancy). Then the attention
# kernels timed as the peer is (30 calls back to back; the per-call figures quoted so far synchronize
# after each call, whose idle gaps may let the clocks rise) next to the per-call figures, and SDPA
# flash right after on the same GPU; the SM clock and power during the attention benchmark and
# during a 1b step run (nvidia-smi dmon).
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
#   //kernels/attention:attention_benchmark //benchmarks:llama_step_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t embedding 120 kernels/embedding/embedding_test
for r in 1 2; do
  bm "sum_ctas_$r" 'Backward.*(Atomic2s|Atomic2sCtas5)Batch/16384/32000/2048/'
done
bm hot 'Backward.*(Atomic2sHot|Atomic2sCtas5Hot)Batch/16384/32000/2048/'
bm_table
timeout 120 /usr/local/cuda/bin/ncu --target-processes all --kernel-name regex:'Count|Scan|Scatter|SortSum|ZeroUntouched' \
  --launch-skip 30 --launch-count 6 --section SpeedOfLight --section Occupancy --csv \
  .gpu/run kernels/embedding/embedding_benchmark --benchmark_filter='Atomic2sBatch/16384/32000/2048/' \
  --benchmark_repetitions=1 > "$logs/ncu_embedding.csv" 2> "$logs/ncu_embedding.err"
echo "ncu rc=$?: $(grep -c . "$logs/ncu_embedding.csv") lines"
grep -E '"Duration"|"DRAM Throughput"|"Achieved Occupancy"' "$logs/ncu_embedding.csv" | cut -d, -f5,13-16 | head -30
# SM clock and power while each runs (nvidia-smi dmon, one sample a second): is the step's
# attention slower than its benchmark because the step runs at lower clocks? (dmon -s pc columns:
# gpu, pwr, gtemp, mtemp, mclk, pclk: the SM clock is the last.)
dmon() { nvidia-smi dmon -s pc -d 1 > "$logs/dmon_$1.log" 2>&1 & echo $!; }
dmon_summary() {  # name: mean power (W) and SM clock (MHz) over the samples
  awk '$1 ~ /^[0-9]+$/ {p += $2; c += $NF; n++} END {if (n) printf "%s: %d samples, power %.0f W, sm clock %.0f MHz\n", name, n, p/n, c/n}' \
    name="$1" "$logs/dmon_$1.log"
}
pid=$(dmon attention)
timeout 150 .gpu/run kernels/attention/attention_benchmark \
  --benchmark_filter='BM_AttentionCudaDefault/(forward|backward)(_batch)?/D:(64|128)/causal:1/f16:0' \
  > "$logs/attention.log" 2>&1
echo "attention rc=$?"; kill $pid 2>/dev/null; dmon_summary attention
grep -E '^BM_' "$logs/attention.log" | sed 's/  */ /g' | cut -c1-160
pid=$(dmon step)
ours_1b clocks
kill $pid 2>/dev/null; dmon_summary step
timeout 150 python3 kernels/attention/sdpa_peer.py > "$logs/sdpa.log" 2>&1
echo "sdpa rc=$?"; grep -E 'causal=1' "$logs/sdpa.log"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
