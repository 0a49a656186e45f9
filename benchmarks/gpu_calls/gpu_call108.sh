#!/usr/bin/env bash
# One H200, ~9 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark
# //compiler:llama_step_test). CompileOptions::bf16_gradients: the CUDA step tests, then the 1b as
# default / bf16 gradients / peer / bf16 gradients / default (40 steps each), then bf16 gradients
# with the default's recompute (SwiGLU in 3 layers) to split the bytes from the recompute.
# (Run 2026-12-04 03:08 as --bf16_gradients, the flag's first name; the default was then f32.)
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
t llama_step_test 240 compiler/llama_step_test
grep -E "^\[  (FAILED|SKIPPED)|Bf16|fused SwiGLU" "$logs/llama_step_test.log" | head -12
ours_1b a --steps=40 --gradients=f32
ours_1b bf16_a --steps=40 --gradients=bf16
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
ours_1b bf16_b --steps=40 --gradients=bf16
ours_1b b --steps=40 --gradients=f32
ours_1b bf16_r3 --steps=40 --gradients=bf16 --recompute=selective --recompute_swiglu_layers=3
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
