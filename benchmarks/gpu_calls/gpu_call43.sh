#!/usr/bin/env bash
# Is the peer's 1b step power-limited too? (2026-11-30 23:20: ours sat at 670-693 W with the SM clock
# at 1.52-1.55 GHz.) nvidia-smi dmon (one sample a second: power, temperatures, memory and SM
# clocks) during ours, the peer (torch.compile), ours again, on one H200; per run the busy samples'
# (> 400 W) count, mean power and SM clock range. ~3 minutes.
# Bundle: gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_lib.sh
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1)"
busy() {  # name: the samples above 400 W
  python3 - "$1" "$logs/dmon_$1.log" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[2]) if l.strip() and l.split()[0].isdigit()]
busy = [(float(r[1]), float(r[-1])) for r in rows if len(r) >= 6 and r[1].isdigit() and float(r[1]) > 400]
if not busy: print(f"{sys.argv[1]}: no busy sample of {len(rows)}"); sys.exit()
clk = sorted(c for _, c in busy)
print(f"{sys.argv[1]}: {len(busy)} busy samples of {len(rows)}, power {statistics.mean(p for p, _ in busy):.0f} W, "
      f"sm clock min {clk[0]:.0f} median {statistics.median(clk):.0f} max {clk[-1]:.0f} MHz")
PY
}
run_dmon() {  # name command...
  local name=$1; shift
  nvidia-smi dmon -s pc -d 1 > "$logs/dmon_$name.log" 2>&1 & local pid=$!
  "$@"
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  busy "$name"
}
run_dmon ours_a ours_1b a --steps=40
timeout 200 bash -c 'python3 benchmarks/llama_peer.py --config 1b --compile --steps 40 > "$0/peer_1b.log" 2>&1' "$logs" &
nvidia-smi dmon -s pc -d 1 > "$logs/dmon_peer.log" 2>&1 & dpid=$!
wait %1 2>/dev/null; kill $dpid 2>/dev/null
echo "peer 1b: $(json "$logs/peer_1b.log") $(grep -E 'Error' "$logs/peer_1b.log" | tail -1)"; busy peer
run_dmon ours_b ours_1b b --steps=40
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
echo "== done $(date -u +%FT%TZ)"
