#!/usr/bin/env bash
# Ran 2026-12-02 05:16 (the first try, 05:12, timed out: min_time in manual time took minutes; now
# 0.02 s). Prepared 2026-12-02 04:10. One H200, ~1 minute;
# carry [".gpu"] from
#   ../shared/tools/gpu-bundle --flags "-c opt --copt=-DSG_EMB_TIMELINE --//tools:nvcc_flags=-DSG_EMB_TIMELINE" \
#     //kernels/embedding:embedding_benchmark
# Issue #3: where the ~5 us before the embedding backward's traffic go, and why the early fill
# gains ~2.5 us whatever its size (benchmarks/README.md, "The early fill"). The instrumented
# kernels (embedding_timeline.h) stamp each kernel's first start, first pass of its wait and
# last end per call; the benchmark prints their medians, us after the call's first kernel, with
# and without the early fill, at dim 2048 and dim 8. (The stamps add an atomic per CTA; compare
# the two variants with each other, not with the uninstrumented figures.) Expected: without the
# early fill, a gap between count_end and scan_start that the early fill shortens.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout 150 .gpu/run kernels/embedding/embedding_benchmark --benchmark_filter='Timeline' \
  --benchmark_min_time=0.02 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_format=csv > "$logs/timeline.csv" 2> "$logs/timeline.err"
echo "rc=$?"
python3 - "$logs/timeline.csv" <<'PY'
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"BM_') or l.startswith("name,")]
for r in csv.DictReader(lines):
    if not r["name"].endswith("_median"): continue
    keys = [k for k in r if k.endswith(("_start", "_waited", "_end")) and r[k]]
    print(r["name"].replace("BM_EmbeddingBackward", ""), "call_us=" + r.get("call_us", ""))
    print("   ", " ".join(f"{k}={float(r[k]):.2f}" for k in keys))
PY
tail -3 "$logs/timeline.err"
