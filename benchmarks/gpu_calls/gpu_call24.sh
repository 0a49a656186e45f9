#!/usr/bin/env bash
# One GPU call (1 H200), 2026-11-30 session 8, sixth call: the embedding backward whose row sums write
# the zero rows while the index preparation still runs (atomic, PDL) against the same kernels without
# the overlap (atomic_nopdl), and every embedding test.
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout 100 .gpu/run kernels/embedding/embedding_test > "$logs/embedding_test.log" 2>&1
echo "embedding_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$logs/embedding_test.log" | tr '\n' ' ')"; grep -E '^\[  FAILED' "$logs/embedding_test.log" | head -5
timeout 100 .gpu/run kernels/embedding/embedding_benchmark \
  --benchmark_filter='Backward.*(Atomic|AtomicNoPdl|AtomicHot|ZeroFill)Batch/16384/(32000|128256)/(8|2048)' > "$logs/bm_emb.log" 2>&1
echo "embedding (rc=$?):"; grep -E '^BM_' "$logs/bm_emb.log" | awk '{for(i=1;i<=NF;i++) if($i ~ /bytes_per_second/) t=$i; print "  " $1, $2, $3, t}'
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
