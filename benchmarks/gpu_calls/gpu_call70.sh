#!/usr/bin/env bash
# Prepared 2026-12-01, run 23:38 (results in benchmarks/README.md).
# One H200 (~6 minutes): issue #3's embedding backward at the
# adopted default (atomic2s, the zero fill's stores evict-first where tokens * 4 >= vocab) with more
# repetitions than gpu_call69 had budget for, against the plain fill (SG_EMBEDDING_FILL_CS=0), in
# three alternating pairs of processes, 5 repetitions each; vocab 128256 with the default (plain
# there by the shape rule); then the torch.compile / eager peer in the same call. gpu_call69 gave
# 94.0-94.1 us (3.504 TB/s) in two medians of three and 94.6 (3.48) in one single run; 94.09 us is
# 3.5 TB/s. The embedding tests first, at the adopted default (every backward bitwise against the
# sorted path and the CPU reference).
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t embedding 200 kernels/embedding/embedding_test
export BM_TIMEOUT=90 BM_REPS=5
for i in 1 2 3; do
  bm "${i}a_default" 'Backward.*Atomic2sBatch/16384/32000/2048/'
  SG_EMBEDDING_FILL_CS=0 bm "${i}b_plain" 'Backward.*Atomic2sBatch/16384/32000/2048/'
done
bm 4_default_128256 'Backward.*Atomic2s(Hot)?Batch/16384/128256/2048/'
timeout 120 python3 kernels/torch_peer_memory_bound.py --only embedding --batch 10 > "$logs/peer.log" 2>&1
grep -i "EmbeddingBackward" "$logs/peer.log"
bm_table
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
