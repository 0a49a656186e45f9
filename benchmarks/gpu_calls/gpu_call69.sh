#!/usr/bin/env bash
# Run 2026-12-01 22:34 (results in benchmarks/README.md): the evict-first fill is adopted where tokens * 4 >= vocab
# (SG_EMBEDDING_FILL_CS=0|1 overrides); SG_EMBEDDING_SUM_CS and SG_EMBEDDING_FILL_BULK are removed.
# One H200 (~5 minutes): issue #3's embedding backward (atomic2s, vocab 32000, dim 2048) with
# evict-first stores (st.global.cs): the zero fill's (SG_EMBEDDING_FILL_CS=1), the touched rows'
# sums' (SG_EMBEDDING_SUM_CS=1), both; and the zero fill by the bulk-copy engine
# (SG_EMBEDDING_FILL_BULK=1: a thread per row, bulk stores of a zeroed shared buffer, so the fill's
# CTAs issue a few instructions a row beside the sums instead of ~8 stores, loads and divisions a
# thread; predicted 0-3 us if the fill's issue slots and SM slots slow the sums); alternating processes. gpu_call68 measured the side stream
# alone at 65.0 us and the fill's stream alone at 47.1 us against 95.2-95.8 together (329 MB: 3.46
# TB/s), so while both run DRAM moves ~3.65 TB/s. Prediction: if the write streams' lines lingering
# in L2 cost the sums' reads and write-backs, evict-first stores gain 1-3 us (94 us is 3.5 TB/s); if
# not, no change (scan3's streaming zero stores lost, 2026-11-30). The tests first, with the bulk fill.
# Bundle: gpu-bundle --flags "-c opt" //kernels/embedding:embedding_test //kernels/embedding:embedding_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
SG_EMBEDDING_FILL_BULK=1 t embedding_bulk 200 kernels/embedding/embedding_test \
  --gtest_filter='*default*:*atomic2s*:EmbeddingCudaBackwardTest.*'
export BM_TIMEOUT=60
f='Backward.*Atomic2sBatch/16384/32000/2048/'
bm 1_plain "$f"
SG_EMBEDDING_FILL_BULK=1 bm 2_bulk "$f"
SG_EMBEDDING_FILL_CS=1 bm 3_fill_cs "$f"
SG_EMBEDDING_SUM_CS=1 bm 4_sum_cs "$f"
bm 5_plain "$f"
SG_EMBEDDING_FILL_BULK=1 bm 6_bulk "$f"
SG_EMBEDDING_FILL_CS=1 SG_EMBEDDING_SUM_CS=1 bm 7_both_cs "$f"
SG_EMBEDDING_FILL_BULK=1 SG_EMBEDDING_SUM_CS=1 bm 8_bulk_sum_cs "$f"
python3 - "$logs" <<'PY'
import csv, glob, sys, os
for f in sorted(glob.glob(sys.argv[1] + "/bm_*.csv"), key=lambda f: int(os.path.basename(f)[3:].split("_")[0])):
    lines = [l for l in open(f) if l.startswith('"BM_') or l.startswith("name,")]
    cells = [f"{float(r['real_time'])/1e3:.1f} us {float(r['median_TBps']):.3f} TB/s"
             for r in csv.DictReader(lines) if r["name"].endswith("_median")]
    print(f"{os.path.basename(f)[3:-4]:12s} " + " | ".join(cells))
PY
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
