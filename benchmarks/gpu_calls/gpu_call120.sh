#!/usr/bin/env bash
# One H200, ~5 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# The 124m's GEMMs ranked by joules under the wide policy (the default RerankPolicy: from 40 us, up
# to 8 within 1.3x over 600 ms windows), tuned once into a cache; then energy-ranked against
# time-ranked (--shipped_tuning=0, tuned afresh; the shipped table has no 124m problems anyway),
# E T peer T E E T, 40 steps each.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
[[ -f .gpu_all.tar.xz ]] && { rm -rf .gpu; tar xJf .gpu_all.tar.xz; }
source benchmarks/gpu_lib.sh
ce=$out/cache_energy_124m
m124() {
  timeout "${M_TIMEOUT:-90}" .gpu/run benchmarks/llama_step_benchmark --config=124m --steps=40 --warmup=5 "${@:2}" \
    > "$logs/m_$1.log" 2>&1
  echo "ours 124m $1: $(json "$logs/m_$1.log") $(grep -E 'rror' "$logs/m_$1.log" | tail -1 | cut -c1-160)"
}
M_TIMEOUT=240 m124 e_tune --shipped_tuning=0 --autotune_energy_ms=600 --cache_dir="$ce"
grep -c "^energy tune:" "$logs/m_e_tune.log"
grep "^metered choice" "$logs/m_e_tune.log" | sed 's/,batch=1.*align=[0-9/]*//'
m124 e_a --cache_dir="$ce"
m124 t_a --shipped_tuning=0
timeout 150 python3 benchmarks/llama_peer.py --config 124m --compile --steps 30 --warmup 8 > "$logs/peer_124m.log" 2>&1
echo "peer 124m: $(json "$logs/peer_124m.log") $(grep -E 'Error' "$logs/peer_124m.log" | tail -1)"
m124 t_b --shipped_tuning=0
m124 e_b --cache_dir="$ce"
m124 e_c --cache_dir="$ce"
m124 t_c --shipped_tuning=0
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
