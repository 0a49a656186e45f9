#!/usr/bin/env bash
# RAN 2026-11-30 19:50 (results in benchmarks/README.md); the r8 and o4 variants it names were removed after it.
# Session 10, call 4 (1 H200): the atomic2s experiments at the issue #3 shape only (16384 tokens,
# vocab 32000, dim 2048; the benchmark's host-side setup of a 128256-row table took most of
# gpu_call36.sh's 60 s per run): default, r8 (8 listed rows per CTA of the sums), o4 (4 CTAs of the
# sums per SM), alternating, then with a hot id; the WgradStreamTest on the GPU in bf16 (its first
# fix kept f32, which has no CUDA attention kernel).
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_benchmark //compiler:compile_test
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
export BM_TIMEOUT=100
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t compile_wgrad 100 compiler/compile_test --gtest_filter='*Wgrad*'
for r in 1 2; do
  bm "a$r" 'Backward.*(Atomic2s|Atomic2sR8|Atomic2sO4)Batch/16384/32000/2048/'
done
bm hot 'Backward.*(Atomic2sHot|Atomic2sR8Hot|Atomic2sO4Hot)Batch/16384/32000/2048/'
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
