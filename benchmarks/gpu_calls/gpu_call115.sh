#!/usr/bin/env bash
# One H200, ~8 minutes; carry [".gpu"] (gpu-bundle of the tests below and llama_step_benchmark).
# GEMM algorithms ranked by joules a call at the power limit (--autotune_energy_ms, EnergyCostMeter):
# the 1b tunes once with 1 s windows into a cache, then energy-ranked / time-ranked choices ABAB
# from their caches, 40 steps each, and the peer; the same for the 124m at the end.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
t gpu_energy 60 benchmarks/gpu_energy_test
t tuning_table 30 kernels/autotune/tuning_table_test
t gemm_autotune 120 kernels/gemm/gemm_autotune_test
ce=$out/cache_energy; ct=/tmp/cache_time
OURS_TIMEOUT=420 ours_1b energy_tune --steps=40 --autotune_energy_ms=1000 --cache_dir="$ce"
grep -c "^energy tune:" "$logs/ours_energy_tune.log"
grep "^metered choice" "$logs/ours_energy_tune.log" | head -40
ours_1b time_a --steps=40 --cache_dir="$ct"
ours_1b energy_a --steps=40 --cache_dir="$ce"
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
ours_1b energy_b --steps=40 --cache_dir="$ce"
ours_1b time_b --steps=40 --cache_dir="$ct"
ce1=$out/cache_energy_124m; ct1=/tmp/cache_time_124m
OURS_TIMEOUT=200 ours_1b e124_tune --config=124m --steps=40 --autotune_energy_ms=1000 --cache_dir="$ce1"
grep "^metered choice" "$logs/ours_e124_tune.log" | head -10
ours_1b t124_a --config=124m --steps=40 --cache_dir="$ct1"
ours_1b e124_a --config=124m --steps=40 --cache_dir="$ce1"
ours_1b e124_b --config=124m --steps=40 --cache_dir="$ce1"
ours_1b t124_b --config=124m --steps=40 --cache_dir="$ct1"
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
