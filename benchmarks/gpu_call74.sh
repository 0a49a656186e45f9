#!/usr/bin/env bash
# Prepared 2026-12-02, not yet run. One H200 (~8 minutes): issue #3's embedding backward with the
# zero fill as a resident grid (SG_EMBEDDING_FILL_PERSIST=1 or 2 CTAs per SM, embedding_atomic.cu's
# ZeroUntouchedResidentKernel) against the default's small independent CTAs, in the same processes
# (random interleaving). Why: the side stream's sums hold all four register-file slots of every SM
# at high priority, so the fill's small CTAs wait until the sums drain; the model (count 5 us, fill
# alone to ~20 us, sums ~50 us, the rest of the fill ~25 us after) gives the measured ~95 us. With
# the fill resident the sums run 3 per SM beside it. Predicted 88-93 us at 16384 of 32000 x 2048
# (3.55-3.75 TB/s); at 128256, where the fill is most of the bytes, no better than 2-3%.
# Then whether the spread between processes is the buffers' placement (a repetition per fresh set).
# First the embedding tests (ResidentZeroFill runs every backward with the knob at 1 and 2).
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t embedding 240 kernels/embedding/embedding_test
export BM_TIMEOUT=150 BM_REPS=4
il=--benchmark_enable_random_interleaving=true
bm 1_32000 'Backward.*Atomic2s(Resident[12])?Batch/16384/32000/2048/' $il
bm 2_32000 'Backward.*Atomic2s(Resident[12])?Batch/16384/32000/2048/' $il
BM_REPS=3 bm 3_128256 'Backward.*Atomic2s(Resident1)?Batch/16384/128256/2048/' $il
BM_REPS=3 bm 4_hot 'Backward.*Atomic2s(Resident1)?HotBatch/16384/32000/2048/' $il
# Placement: 8 repetitions in one process, each on freshly allocated buffers (every repetition's
# time, not only the median), with the SM clock sampled by nvidia-smi while it runs.
nvidia-smi dmon -s pc -d 1 > "$logs/dmon_placement.log" 2>&1 & dmon_pid=$!
BM_REPS=8 bm 5_placement 'Atomic2sPlacementBatch/16384/32000/2048/' --benchmark_report_aggregates_only=false
kill $dmon_pid 2>/dev/null
grep -E '^"BM_[^,]*manual_time",' "$logs/bm_5_placement.csv" | cut -d, -f3 | tr '\n' ' ' | sed 's/^/placement real_time ns: /'; echo
awk '$1 ~ /^[0-9]+$/ {print $NF}' "$logs/dmon_placement.log" | sort -n | uniq -c | tr '\n' ' ' | sed 's/^/sm clock MHz (count): /'; echo
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
