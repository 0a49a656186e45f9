#!/usr/bin/env bash
# One H200, ~7 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# Every cc_test with the shipped GEMM table and the CostMeter in; then the 1b with the shipped
# energy-ranked choices (the default) against --shipped_tuning=0 (time-ranked, tuned afresh),
# S T peer T S S T, 40 steps each.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
benchmarks/gpu_tests.sh run 2>&1 | grep -v '^PASS'
source benchmarks/gpu_lib.sh
ours_1b shipped_a --steps=40
ours_1b time_a --steps=40 --shipped_tuning=0
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
ours_1b time_b --steps=40 --shipped_tuning=0
ours_1b shipped_b --steps=40
ours_1b shipped_c --steps=40
ours_1b time_c --steps=40 --shipped_tuning=0
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
