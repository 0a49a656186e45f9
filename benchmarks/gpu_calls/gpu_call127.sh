#!/usr/bin/env bash
# One H200, ~3 minutes; carry [".gpu", ".gpu_old"]: .gpu = gpu-bundle --flags "-c opt" of
# //kernels/attention:attention_benchmark, :attention_test and :attention_wgmma_probe_test with the
# attention's wgmma descriptors advanced from one base (sm90::Sw128DescAdvance), the warpgroup
# index made warp-uniform, and the v5 backward's lse stored in the log2 domain once a row;
# .gpu_old = attention_benchmark at 2b43709 (before them).
# (Run 2026-12-04 20:43: both test binaries passed (164 and 2 cases), then each batch benchmark ran past
# its 120 s limit after one row, since a batch iteration reports one call's time (fixed since in
# attention_benchmark.cc), and the call hit its 500 s limit; gpu_call128.sh measured per call.)
# 1. The attention tests and the wgmma probe on the new kernels.
# 2. Old against new, O N O N, the default kernels 30 calls back to back (forward_batch /
#    backward_batch, bf16, D64 and D128, causal and not).
# 3. Nsight Compute's executed instructions of the new D64 causal kernels (gpu_call125.sh had the
#    old: forward 165.9 M, backward 353.5 M warp instructions), and the new SASS's opcode counts.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
for t in kernels/attention/attention_test kernels/attention/attention_wgmma_probe_test; do
  timeout 300 .gpu/run "$t" > "$logs/$(basename $t).log" 2>&1
  echo "test $t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$(basename $t).log" | sort -u | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$logs/$(basename $t).log" | head -5
done
bench() {  # bench TAG DIR
  timeout 120 "$2"/run kernels/attention/attention_benchmark --benchmark_filter='BM_AttentionCudaDefault/(forward|backward)_batch/.*/f16:0' \
    --benchmark_format=csv > "$logs/bm_$1.csv" 2> "$logs/bm_$1.err"
  echo "bench $1 rc=$?"
}
bench old1 .gpu_old; bench new1 .gpu; bench old2 .gpu_old; bench new2 .gpu
python3 - "$logs" <<'PY'
import csv, glob, os, sys
logs = sys.argv[1]
tab = {}
for tag in ("old1", "new1", "old2", "new2"):
    lines = [l for l in open(os.path.join(logs, f"bm_{tag}.csv")) if l.startswith(("name", '"BM'))]
    for r in csv.DictReader(lines):
        tab.setdefault(r["name"].split("/min_time")[0].replace("BM_AttentionCudaDefault/", ""), {})[tag] = float(r["real_time"])
print(f"{'benchmark':44s} {'old1':>8s} {'new1':>8s} {'old2':>8s} {'new2':>8s}  new/old (ms a call)")
for name, v in tab.items():
    o = (v.get("old1", 0) + v.get("old2", 0)) / 2; n = (v.get("new1", 0) + v.get("new2", 0)) / 2
    print(f"{name:44s} " + " ".join(f"{v.get(t, 0):8.4f}" for t in ("old1", "new1", "old2", "new2")) + f"  {n / o if o else 0:.4f}")
PY
for k in bwd:AttentionBackwardV5Kernel:backward fwd:WsFwdKernel:forward; do
  IFS=: read -r name kern phase <<< "$k"
  timeout 180 ncu --clock-control none --target-processes all -k "regex:$kern" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section InstructionStats --section ComputeWorkloadAnalysis \
    .gpu/run kernels/attention/attention_benchmark --benchmark_filter="BM_AttentionCudaDefault/$phase/D:64/causal:1/f16:0" \
    > "$logs/ncu_$name.txt" 2>&1
  echo "ncu $name: $(grep -E ' Duration|SM Frequency|Executed Instructions  |Issue Slots Busy' "$logs/ncu_$name.txt" | tr -s ' ' | tr '\n' ';')"
done
cuobjdump -sass .gpu/bin/kernels/attention/attention_benchmark > "$logs/attention_sass.txt" 2>&1; echo "sass rc=$?"
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
