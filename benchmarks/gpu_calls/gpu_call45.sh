#!/usr/bin/env bash
# Run 2026-12-01 (results in benchmarks/README.md; the knobs it measured are removed). Prepared then (1 H200, ~5 minutes): GEMM autotuning at the power limit. The 1b
# step runs at 700 W with the SM clock near 1.5 GHz (gpu_call43/44), but the tuner times each
# cuBLASLt candidate over 5 calls right after a synchronization, at boost clocks, where another tile
# shape may win. SG_GEMM_TUNE_MS=100 runs each candidate ~100 ms untimed, then times ~50 ms of calls
# (kernels/gemm/gemm_cublaslt.cc): the choice then reflects each candidate's own power draw.
# Predicted: 0 to +2% tokens/s and mJ/token lower by the same, if the sustained winners differ.
# The tuner's tests with the knob first; then default / sustained alternating twice, the peer.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark //kernels/gemm:gemm_autotune_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1)"
SG_GEMM_TUNE_MS=20 t autotune_sustained 60 kernels/gemm/gemm_autotune_test
for i in a b; do
  ours_1b "default_$i"
  SG_GEMM_TUNE_MS=100 ours_1b "sustained_$i"
done
timeout 110 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error|no energy' "$logs/peer_1b.log" | tail -1)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
