#!/usr/bin/env bash
# One H200, ~5 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark).
# gpu_call95 measured the compiler's fused SwiGLU backward a wash at the 1b step (79,656 on against
# 79,668 off, +-0.7% between repeats). Three more pairs, 40 timed steps each, alternating, with the
# JSON's count of fused steps; then the peer.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
for r in a b c; do
  SG_FUSE_SWIGLU_BWD=0 ours_1b off_$r --steps=40
  ours_1b on_$r --steps=40
done
timeout 110 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error|no energy' "$logs/peer_1b.log" | tail -1)"
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
