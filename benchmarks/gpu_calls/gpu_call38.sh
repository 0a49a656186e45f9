#!/usr/bin/env bash
# Session 10, call 5 (1 H200): --wgrad_stream on the 124m step (GEMMs of 768 columns, which fill
# the GPU less than the 1b's), alternating with the one-stream step, then the peer; the 1b pair
# again after it.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
ours_124m() {
  local tag=$1
  shift
  timeout 60 .gpu/run benchmarks/llama_step_benchmark --config=124m --steps=30 --warmup=5 "$@" > "$logs/ours124_$tag.log" 2>&1
  echo "ours 124m $tag: $(json "$logs/ours124_$tag.log") $(grep -E 'rror' "$logs/ours124_$tag.log" | tail -1 | cut -c1-160)"
}
for i in a b; do
  ours_124m "one_stream_$i"
  ours_124m "wgrad_$i" --wgrad_stream
done
timeout 100 python3 benchmarks/llama_peer.py --config 124m --compile --steps 30 > "$logs/peer_124m.log" 2>&1
echo "peer 124m: $(json "$logs/peer_124m.log") $(grep -E 'Error' "$logs/peer_124m.log" | tail -1)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
