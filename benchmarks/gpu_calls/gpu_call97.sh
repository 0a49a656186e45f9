#!/usr/bin/env bash
# One H200, ~4 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark).
# The 1b under the default 32 GiB budget: the default plan (selective, SwiGLU recomputed in 3 layers)
# against --offload_first with the LM head in 4 blocks of tokens (no recompute, the fewest kept
# activations in pinned host memory: the blocked head's ~0.9 GiB may bring it under 32 GiB, where
# offload_first alone planned 32.5), alternating; then the peer.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
for r in a b; do
  ours_1b default_$r --steps=30
  ours_1b off4_$r --steps=30 --offload_first --lm_head_chunks=4
done
ours_1b off8_a --steps=30 --offload_first --lm_head_chunks=8
grep -h 'planned\|strategy\|recompute' "$logs"/ours_off4_a.log "$logs"/ours_off8_a.log | grep -v '^{' | head -6
timeout 110 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error|no energy' "$logs/peer_1b.log" | tail -1)"
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
