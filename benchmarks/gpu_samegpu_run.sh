#!/usr/bin/env bash
# One GPU-machine call (2 H200s) that compares the memory-bound kernels with their PyTorch peers on
# the SAME GPU, one after the other: GPU 0 runs ours then the peers, GPU 1 (at the same time) the
# peers then ours, so each ratio has both a same-chip pair and an order check. (Earlier calls ran
# ours on GPU 0 and the peers on GPU 1: a chip-to-chip difference would have entered every ratio.)
# Also keeps torch.compile's generated SwiGLU kernels (Triton source and PTX) in $OUT/logs.tgz.
# Build first (here):
#   ../shared/tools/gpu-bundle --flags "-c opt" //kernels/rmsnorm:rmsnorm_benchmark \
#     //kernels/add_rmsnorm:add_rmsnorm_benchmark //kernels/swiglu:swiglu_benchmark \
#     //kernels/rope:rope_benchmark //kernels/cross_entropy:cross_entropy_benchmark \
#     //kernels/embedding:embedding_benchmark
# OURS="name:binary:filter ..." replaces the default list of our benchmarks; EXTRA_ENV is exported.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
B=${B:-.gpu}
export PYTHONUNBUFFERED=1
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
OURS=${OURS:-"rmsnorm:kernels/rmsnorm/rmsnorm_benchmark:BF16Batch/16384/2048|Copy
add_rmsnorm:kernels/add_rmsnorm/add_rmsnorm_benchmark:BF16Batch/16384/2048
swiglu:kernels/swiglu/swiglu_benchmark:BF16Batch/16384/8192
rope:kernels/rope/rope_benchmark:TokensBatch/[48]/
cross_entropy:kernels/cross_entropy/cross_entropy_benchmark:Batch/16384
embedding:kernels/embedding/embedding_benchmark:Batch/16384"}

ours() {  # gpu
  for e in $OURS; do
    IFS=: read -r name bin filter <<< "$e"
    [[ -x $B/bin/$bin ]] || { echo "(missing $bin)"; continue; }
    timeout 90 $B/run "$bin" --benchmark_filter="$filter" --benchmark_min_time=0.1 > "$logs/gpu$1_$name.log" 2>&1 \
      || echo "(gpu$1 $name exited $?)"
  done
}
peers() {  # gpu
  timeout 200 python3 kernels/torch_peer_memory_bound.py --only swiglu,rope,cross_entropy,embedding --batch 10 \
    > "$logs/gpu$1_peer_memory.log" 2>&1 || echo "(gpu$1 peer_memory exited $?)"
  timeout 90 python3 kernels/rmsnorm/rmsnorm_peer.py --batch 20 > "$logs/gpu$1_peer_rmsnorm.log" 2>&1 \
    || echo "(gpu$1 peer_rmsnorm exited $?)"
}
(export CUDA_VISIBLE_DEVICES=0; ours 0; peers 0) &
(export CUDA_VISIBLE_DEVICES=1; peers 1; ours 1) &
wait
if [[ -z ${SKIP_TRITON:-} ]]; then  # torch.compile's SwiGLU kernels, for reading
  start=$(mktemp); sleep 1
  CUDA_VISIBLE_DEVICES=0 TORCH_LOGS=output_code timeout 120 python3 kernels/torch_peer_memory_bound.py --only swiglu \
    --iters 3 > "$logs/inductor_swiglu.log" 2>&1
  find /tmp/torchinductor_* ~/.triton -newer "$start" \( -name '*.ptx' -o -name '*.py' -o -name '*.json' \) 2>/dev/null \
    | head -200 | tar czf "$logs/triton_swiglu.tgz" -T - 2>/dev/null
fi
for g in 0 1; do
  echo "-- GPU $g (ours $([[ $g == 0 ]] && echo first || echo second))"
  cat "$logs"/gpu${g}_*.log 2>/dev/null | grep -E '^BM_' | sed -E 's/ +[0-9.]+ (ns|us|ms) +[0-9.]+ (ns|us|ms) +[0-9]+//; s/manual_time//; s/ +/ /g' | cut -c1-130
  grep -hE 'GB/s' "$logs"/gpu${g}_peer_*.log | sed -E 's/ +/ /g' | cut -c1-130
done
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
