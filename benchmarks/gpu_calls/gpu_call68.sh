#!/usr/bin/env bash
# Run 2026-12-01 22:18 on a build with "atomic2c" and these knobs (since removed; results in benchmarks/README.md).
# One H200 (~6 minutes): why gpu_call67's persistent sums ("atomic2c", 2-3 CTAs per SM: 117.8-130.2
# us against atomic2s's 95.7-95.9 at vocab 32000) lost. Variants, each process timing atomic2s then
# atomic2c (vocab 32000, dim 2048, batch of 10):
#   plain (4 CTAs per SM, 13 KB of shared memory now, was 30);
#   SG_EMBEDDING_CARVEOUT=100: every kernel prefers the largest shared-memory carveout, so an SM
#     running the zero fill need not drain before taking a sums CTA (predicted: if the carveout was
#     the cause, atomic2c -> ~85 us; atomic2s unchanged);
#   SG_EMBEDDING_CHUNK_ROWS=32: chunks of 32 entries taken in turn from a ticket, not static shares
#     (predicted: if late-starting CTAs' shares made the tail, atomic2c gains);
#   SG_EMBEDDING_SKIP=fill / sums: one stream's last kernel left out, so the side stream's length
#     alone and the fill's alone are seen (a wrong table; timing only).
# The embedding tests first (and the chunked ones again with ticketed chunks).
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
t embedding 200 kernels/embedding/embedding_test
SG_EMBEDDING_CHUNK_ROWS=32 t embedding_rows32 200 kernels/embedding/embedding_test \
  --gtest_filter='EmbeddingCudaBackwardTest.*:*atomic2c*'
export BM_TIMEOUT=90
f='Backward.*Atomic2[sc]Batch/16384/32000/2048/'
bm 1_plain "$f"
SG_EMBEDDING_CARVEOUT=100 bm 2_carve "$f"
SG_EMBEDDING_CHUNK_ROWS=32 bm 3_rows32 "$f"
SG_EMBEDDING_CHUNK_ROWS=32 SG_EMBEDDING_CARVEOUT=100 bm 4_rows32_carve "$f"
SG_EMBEDDING_SKIP=fill bm 5_nofill "$f"
SG_EMBEDDING_SKIP=sums bm 6_nosums "$f"
bm 7_plain "$f"
SG_EMBEDDING_CARVEOUT=100 bm 8_carve "$f"
bm 9_hot 'Backward.*Atomic2[sc]HotBatch/16384/32000/2048/'
SG_EMBEDDING_CHUNK_ROWS=32 SG_EMBEDDING_CARVEOUT=100 bm 9_hot_rows32_carve 'Backward.*Atomic2[sc]HotBatch/16384/32000/2048/'
python3 - "$logs" <<'PY'
import csv, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/bm_*.csv")):
    lines = [l for l in open(f) if l.startswith('"BM_') or l.startswith("name,")]
    cells = [f"{r['name'].split('BF16')[1].split('Batch')[0]} {float(r['real_time'])/1e3:.1f} us {float(r['median_TBps']):.3f}"
             for r in csv.DictReader(lines) if r["name"].endswith("_median")]
    print(f"{os.path.basename(f)[3:-4]:22s} " + " | ".join(cells))
PY
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
