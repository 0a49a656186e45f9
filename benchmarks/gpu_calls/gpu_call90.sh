#!/usr/bin/env bash
# Ran 2026-12-02 20:26:25-20:29:43 (results: benchmarks/README.md). Prepared 20:20 (no machine could be
# started then; run at 20:26).
# One H200, ~5 minutes; carry [".gpu_all.tar.xz"] (benchmarks/gpu_tests.sh
# pack's bundle with //kernels/embedding:embedding_benchmark added to its targets).
# After gpu_call89 (the embedding backward replayed as a CUDA graph: 90.0-90.1 us, 88.4-88.6 with
# the node priorities kept, against 94.0 as stream calls): the executor now instantiates every
# captured step with node priorities (compiler/executor.cc kNodePriority). Every test on the GPU
# (compile_test and llama_step_test replay captured steps), then the graph benchmarks at the other
# shapes (gpu_call89's second part stopped on a CSV counter) and two more processes at 32000 x 2048.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
benchmarks/gpu_tests.sh run > "$out/suite.txt" 2>&1; grep -E "^FAIL|passed,|^==" "$out/suite.txt"
source benchmarks/gpu_lib.sh
export BM_TIMEOUT=300 BM_REPS=3
I='--benchmark_enable_random_interleaving=true'
bm 1_a 'Atomic2s(Batch|Graph|GraphPriority)/16384/32000/2048/' $I --benchmark_min_time=0.2
bm 1_b 'Atomic2s(Batch|Graph|GraphPriority)/16384/32000/2048/' $I --benchmark_min_time=0.2
BM_REPS=2 bm 2_other 'Atomic2s(Batch|Graph|GraphPriority)/16384/(128256/2048|32000/768|32000/8|128256/8)/' $I --benchmark_min_time=0.2
bm_table
tar czf "$out/bm_logs.tgz" -C "$out" logs/bm_1_a.csv logs/bm_1_b.csv logs/bm_2_other.csv 2>/dev/null
echo "== done $(date -u +%FT%TZ)"
