#!/usr/bin/env bash
# Prepared for the next session's first GPU call (1 H200): --offload_first on the 1b step. Under a
# 32.8 GiB budget auto plans selective recompute; with --offload_first no recompute plus 17 activations
# offloaded to pinned host memory (2.0 GiB each way per step). Alternating on one GPU, then the no-
# recompute reference and the peer, one traced step (its summary line shows the exposed host-copy
# time), and the CUDA tests of the offload path.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //compiler:compile_test
#   //compiler:llama_step_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
ours() {  # tag args...
  local tag=$1; shift
  timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=20 --warmup=5 "$@" > "$logs/ours_$tag.log" 2>&1
  echo "ours 1b $tag: $(json "$logs/ours_$tag.log") $(grep -E 'rror' "$logs/ours_$tag.log" | tail -1 | cut -c1-160)"
}
t compile_offload 120 compiler/compile_test --gtest_filter='*Offload*:*Cuda*'
for i in a b; do
  ours "auto_$i" --recompute=auto --memory_budget_gib=32.8
  ours "offload_first_$i" --recompute=auto --memory_budget_gib=32.8 --offload_first=true
done
ours none --recompute=none
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
timeout 90 .gpu/run benchmarks/llama_step_benchmark --config=1b --recompute=auto --memory_budget_gib=32.8 \
  --offload_first=true --steps=6 --warmup=3 --trace="$logs/trace_offload.json" > "$logs/traced.log" 2>&1
echo "traced (rc=$?): $(grep -h 'host copies\|exposed communication' "$logs/traced.log" | tail -1)"
t llama_step_test 150 compiler/llama_step_test --gtest_filter='*Cuda*'
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
