#!/usr/bin/env bash
# One GPU-machine call (2 H200s) for the device collectives: the 2-GPU comm tests (ring over NCCL,
# NCCL native, the CUDA IPC path, deadlines), then collectives_benchmark's device rows (ring, IPC,
# NCCL native and send/recv in one process pair, so every ratio is same-call), then the IPC rows
# again under each setting in IPC_SWEEP ("blocks:copy[:splits] ..."; copy = sm | ce; splits = copy-engine
# copies of 16 MiB and more split over that many streams).
# Build here, then carry .gpu (or an archive of it, unpacked first):
#   ../shared/tools/gpu-bundle --flags "-c opt" //comm:launch //comm:collectives_benchmark \
#     //comm:device_collectives_test //comm:device_graph_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
here=$(pwd)
B=.gpu
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
row() { grep -E 'rank 0\] Bench' "$1" | sed -E "s/.*Bench\/Device_/$2/; s/\/iterations.*algbw_GBps=([0-9.]+[kMG]?).*busbw_GBps=([0-9.]+[kMG]?).*/ algbw \1 busbw \2/; s/\/iterations.*ERROR/ ERROR/" ; }
if [[ -z ${SKIP_TESTS:-} ]]; then
  for t in ${TESTS:-comm/device_collectives_test comm/device_graph_test}; do
    name=$(basename "$t")
    timeout 200 $B/run "$t" > "$logs/$name.log" 2>&1
    echo "test $name rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$logs/$name.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]|rank 0 after|device algorithm|WaitStream returned|next all_reduce|teardown' "$logs/$name.log" | head -8 | cut -c1-300
  done
fi
if [[ -z ${SKIP_BENCH:-} ]]; then
  timeout 240 $B/run comm/launch --nproc=2 -- "$here/$B/bin/comm/collectives_benchmark" \
    --benchmark_filter="${FILTER:-Device}" > "$logs/comm_bench.log" 2>&1; echo "comm bench rc=$?"
  row "$logs/comm_bench.log" ""
  for c in ${IPC_SWEEP:-}; do
    IFS=: read -r blocks copy splits <<< "$c"
    SG_COMM_IPC_BLOCKS=$blocks SG_COMM_IPC_COPY=$copy SG_COMM_IPC_COPY_SPLITS=${splits:-1} timeout 100 $B/run comm/launch --nproc=2 -- \
      "$here/$B/bin/comm/collectives_benchmark" --benchmark_filter='Device_Ipc' > "$logs/ipc_$c.log" 2>&1
    row "$logs/ipc_$c.log" "sweep $c "
  done
fi
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
