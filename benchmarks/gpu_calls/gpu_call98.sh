#!/usr/bin/env bash
# One H200, ~4 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark).
# Where the compiler's fused SwiGLU backward's predicted ~0.75 ms went (gpu_call95-96: a wash at the
# 1b step): one traced eager step of the default plan without and with it, per-operation diff; then
# the 124m (recompute none) alternating without / with it.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
traced() {
  local tag=$1
  shift
  timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=5 --warmup=3 --trace="$logs/$tag.json" \
    > "$logs/$tag.log" 2>&1
  echo "$tag: $(json "$logs/$tag.log") $(grep -E 'rror' "$logs/$tag.log" | head -1 | cut -c1-200)"
}
SG_FUSE_SWIGLU_BWD=0 traced unfused
SG_FUSE_SWIGLU_BWD=1 traced fused
python3 benchmarks/trace_diff.py "$logs/unfused.json" "$logs/fused.json" --top 16 2>&1 | head -24
for r in a b; do
  SG_FUSE_SWIGLU_BWD=0 timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=124m --steps=30 --warmup=5 > "$logs/m_off_$r.log" 2>&1
  echo "124m off_$r: $(json "$logs/m_off_$r.log")"
  SG_FUSE_SWIGLU_BWD=1 timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=124m --steps=30 --warmup=5 > "$logs/m_on_$r.log" 2>&1
  echo "124m on_$r: $(json "$logs/m_on_$r.log")"
done
gzip -f "$logs"/*.json
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
