#!/usr/bin/env bash
# Prepared for the next session (1 H200), in order of value:
# (1) the LM head in 4 blocks of tokens (--lm_head_chunks=4): the CUDA tests first (the blocked
#     cross-entropy bitwise against one call; the tiny Llama's steps against the unchunked ones, bf16,
#     with and without selective recompute, graph replays), then the 1b at the default 32 GiB budget
#     alternating with the default step: planned on the CPU, auto then needs no SwiGLU recompute
#     (31.61 GiB; the default recomputes it in 3 layers, ~0.55 ms in the trace). Predicted: +0.3% at
#     best, about a wash if the four head GEMMs at M = 4096 lose ~0.5 ms against one at 16384.
# (2) the 1b as 2 micro-batches, auto recompute (planned on the CPU through the data-parallel
#     runtime on a group of one: no recompute, 28.8 GiB);
# (3) the peer, a traced step with the head in blocks, the step's CUDA tests. ~7 minutes; the
#     embedding experiments are gpu_call41.sh.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark
#   //kernels/cross_entropy:cross_entropy_test //compiler:compile_test //compiler:llama_step_test
#   //compiler:lm_head_chunks_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t cross_entropy 60 kernels/cross_entropy/cross_entropy_test
t compile_lm_head 100 compiler/compile_test --gtest_filter='*LmHead*:*CudaGraph*:*Wgrad*'
t lm_head_chunks 100 compiler/lm_head_chunks_test
for i in a b; do
  ours_1b "default_$i"
  ours_1b "lm_head4_$i" --lm_head_chunks=4
done
ours_1b lm_head8 --lm_head_chunks=8
ours_1b micro2_auto --micro_batches=2
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
timeout 90 .gpu/run benchmarks/llama_step_benchmark --config=1b --lm_head_chunks=4 --steps=6 --warmup=3 \
  --trace="$logs/trace_lm_head4.json" > "$logs/traced.log" 2>&1
echo "traced lm_head4 (rc=$?): $(grep -h 'exposed communication' "$logs/traced.log" | tail -1)"
t llama_step_test 150 compiler/llama_step_test --gtest_filter='*Cuda*'
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
