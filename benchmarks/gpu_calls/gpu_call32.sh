#!/usr/bin/env bash
# One GPU call (1 H200), 2026-11-30 session 9, eighth call: atomic2s's scheduling knobs at vocab
# 32000 (SG_EXP_* switches of an experiment build, not on main): the side stream's priority
# (greatest vs least), the zero fill's CTA size (kZeroVecs 2048 vs 512 / 8192 float4), and the roles
# swapped (zero fill on the side stream, sums on the caller's).
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
f='Backward.*(Atomic2s|Atomic2sHot)Batch/16384/32000/2048/'
bm() {  # tag [env...]
  local tag=$1; shift
  env "$@" timeout 60 .gpu/run kernels/embedding/embedding_benchmark --benchmark_filter="$f" --benchmark_min_time=0.3 > "$logs/$tag.log" 2>&1
  echo "$tag: $(grep -E '^BM_' "$logs/$tag.log" | awk '{for(i=2;i<=NF;i++) if($i ~ /median_TBps/) printf "%s %s  ", $1, $i}' | sed 's/BM_EmbeddingBackwardBF16//g; s#/16384/32000/2048/manual_time##g')"
}
bm default
bm prio_least SG_EXP_PRIO=1
bm zv512 SG_EXP_ZV=512
bm zv8192 SG_EXP_ZV=8192
bm swap_least SG_EXP_SWAP=1 SG_EXP_PRIO=1
bm default_again
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
