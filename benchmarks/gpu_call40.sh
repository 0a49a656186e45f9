#!/usr/bin/env bash
# Prepared for the next session (1 H200). (1) The 1b step as 2 micro-batches without any recompute
# (planned on the CPU: 28.83 GiB through the data-parallel runtime on a group of one, against 34.34
# GiB for one pass without recompute and 31.59 with the default's selective recompute), alternating
# with the default step, then the peer: does dropping the recompute pay for GEMMs at M = 8192 and
# the gradient accumulation? (2) Nsight Compute on the embedding backward's kernels at the issue #3
# shape (each kernel alone: duration, DRAM throughput, occupancy), to see how far the listed rows'
# sums run from the zero fill's 4.4 TB/s.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
for i in a b; do
  ours_1b "default_$i"
  ours_1b "micro2_none_$i" --micro_batches=2 --recompute=none
done
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
timeout 120 /usr/local/cuda/bin/ncu --target-processes all --kernel-name regex:'Count|Scan|Scatter|SortSum|ZeroUntouched' \
  --launch-skip 30 --launch-count 6 --section SpeedOfLight --section Occupancy --csv \
  .gpu/run kernels/embedding/embedding_benchmark --benchmark_filter='Atomic2sBatch/16384/32000/2048/' \
  --benchmark_repetitions=1 > "$logs/ncu_embedding.csv" 2> "$logs/ncu_embedding.err"
echo "ncu rc=$?: $(grep -c . "$logs/ncu_embedding.csv") lines"
grep -E '"Duration"|"DRAM Throughput"|"Achieved Occupancy"' "$logs/ncu_embedding.csv" | cut -d, -f5,13-16 | head -30
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
