#!/usr/bin/env bash
# One H200, ~9 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# Every cc_test (the test helpers' device sync, the GEMM's metered variants); then the 1b tuned with
# cuBLASLt configurations beside the heuristic's list (--autotune_energy_variants=48: other cluster
# shapes, tiles and custom options of its first two algorithms) under the wide energy policy, and
# those choices against the shipped table (the default), V S peer S V, 40 steps each.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
benchmarks/gpu_tests.sh run 2>&1 | grep -v '^PASS'
source benchmarks/gpu_lib.sh
cv=$out/cache_variants
OURS_TIMEOUT=330 ours_1b var_tune --steps=40 --shipped_tuning=0 --autotune_energy_ms=600 --autotune_energy_variants=48 \
  --cache_dir="$cv"
grep -c "^energy tune:" "$logs/ours_var_tune.log"
grep "^metered choice" "$logs/ours_var_tune.log" | sed 's/,batch=1.*align=[0-9/]*//'
ours_1b var_a --steps=40 --cache_dir="$cv"
ours_1b shipped_a --steps=40
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
ours_1b shipped_b --steps=40
ours_1b var_b --steps=40 --cache_dir="$cv"
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
