#!/usr/bin/env bash
# Ran 2026-12-02 03:23-03:24 (32 embedding tests passed; 94.2 us against 96.4 without the early
# fill). Prepared 2026-12-02 03:20. One H200, ~3 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt"
# //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark). The early fill as
# adopted (tables of 64 MiB or more, SG_EMBEDDING_EARLY_FILL overrides): the embedding tests (the
# new EarlyFill case among them), then the default against NoEarly at 16384 of 32000 x 2048 in one
# process (random interleaving).
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
export BM_TIMEOUT=120 BM_REPS=3
t embedding 200 kernels/embedding/embedding_test
bm 1_32000 'Backward.*Atomic2s(NoEarly)?Batch/16384/32000/2048/' --benchmark_enable_random_interleaving=true
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
