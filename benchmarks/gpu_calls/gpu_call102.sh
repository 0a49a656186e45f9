#!/usr/bin/env bash
# One H200, ~8 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark).
# Issue #10's one-GPU rows re-measured on main as it now is: the 124m and the 1b, each as default /
# overlap / peer / overlap / default (overlap: SG_ATTN_BWD_V5_ORDER=overlap, the v5 backward 5-8%
# faster alone in gpu_call101, -0.4% in two 1b step pairs there); then one traced eager 1b step, its
# operations by total time. ORDER sets SG_ATTN_BWD_V5_ORDER for every run of ours.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
[[ -n "${ORDER:-}" ]] && export SG_ATTN_BWD_V5_ORDER=$ORDER
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
m124() {
  timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=124m --steps=40 --warmup=5 > "$logs/m_$1.log" 2>&1
  echo "ours 124m $1: $(json "$logs/m_$1.log")"
}
m124 a
SG_ATTN_BWD_V5_ORDER=overlap m124 overlap_a
timeout 150 python3 benchmarks/llama_peer.py --config 124m --compile --steps 30 --warmup 8 > "$logs/peer_124m.log" 2>&1
echo "peer 124m: $(json "$logs/peer_124m.log") $(grep -E 'Error' "$logs/peer_124m.log" | tail -1)"
SG_ATTN_BWD_V5_ORDER=overlap m124 overlap_b
m124 b
ours_1b a --steps=40
SG_ATTN_BWD_V5_ORDER=overlap ours_1b overlap_a --steps=40
timeout 150 python3 benchmarks/llama_peer.py --config 1b --compile --steps 20 --warmup 8 > "$logs/peer_1b.log" 2>&1
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"
SG_ATTN_BWD_V5_ORDER=overlap ours_1b overlap_b --steps=40
ours_1b b --steps=40
timeout 120 .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=5 --warmup=3 --trace="$logs/trace.json" \
  > "$logs/traced.log" 2>&1
echo "traced: $(json "$logs/traced.log")"
python3 - "$logs/trace.json" <<'PY'
import collections, json, re, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
sums, counts = collections.defaultdict(float), collections.Counter()
for e in ev:
    if isinstance(e, dict) and e.get("ph") == "X" and e.get("tid") == 0:
        n = re.sub(r"\d+", "#", str(e.get("name", "?")))
        n = n if n.startswith("matmul") else re.sub(r" @.*", "", n)
        sums[n] += e.get("dur", 0) / 1e3; counts[n] += 1
print(f"compute thread: {sum(sums.values()):.1f} ms (one traced eager step)")
for n, v in sorted(sums.items(), key=lambda kv: -kv[1])[:36]:
    print(f"{v:8.2f} ms {counts[n]:5d}x  {n[:110]}")
PY
gzip -f "$logs"/*.json
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
