#!/usr/bin/env bash
# One H200, ~6 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh pack).
# With the GEMMs energy-ranked, is our fused dh GEMM + SwiGLU backward (the default) still worth
# it on the 1b? The unfused step (SG_FUSE_SWIGLU_BWD=0: cuBLASLt's dh GEMM, then the SwiGLU
# backward kernel) tunes its one GEMM problem the shipped table lacks by joules into a cache; then
# fused (F, default) against unfused (U), F U peer U F F U, 40 steps each.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
[[ -f .gpu_all.tar.xz ]] && { rm -rf .gpu; tar xJf .gpu_all.tar.xz; }
source benchmarks/gpu_lib.sh
cu=$out/cache_unfused
SG_FUSE_SWIGLU_BWD=0 OURS_TIMEOUT=200 ours_1b u_tune --steps=40 --autotune_energy_ms=600 --cache_dir="$cu"
grep "^energy tune:" "$logs/ours_u_tune.log" | tail -8
grep "^metered choice" "$logs/ours_u_tune.log" | sed 's/,batch=1.*align=[0-9/]*//' | head -30
ours_1b f_a --steps=40
SG_FUSE_SWIGLU_BWD=0 ours_1b u_a --steps=40 --cache_dir="$cu"
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
SG_FUSE_SWIGLU_BWD=0 ours_1b u_b --steps=40 --cache_dir="$cu"
ours_1b f_b --steps=40
ours_1b f_c --steps=40
SG_FUSE_SWIGLU_BWD=0 ours_1b u_c --steps=40 --cache_dir="$cu"
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
