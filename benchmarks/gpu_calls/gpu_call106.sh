#!/usr/bin/env bash
# One H200, ~5 minutes; carry [".gpu"] (gpu-bundle --flags "-c opt" //benchmarks:llama_step_benchmark).
# How often NVML's energy counter moves (a window's error is about one update), then the 1b's
# energy profile at 1 s windows, leave-one-out rows kept only where the window's numbers stay finite.
set -u
out=${OUT:-/tmp/out}; logs=$out/logs; mkdir -p "$logs"
source benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv,noheader
python3 - <<'PY'
import ctypes, time
n = ctypes.CDLL("libnvidia-ml.so.1"); n.nvmlInit_v2()
h = ctypes.c_void_p(); n.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
e = ctypes.c_ulonglong(); last = None; changes = []; t0 = time.perf_counter()
while time.perf_counter() - t0 < 2.0:
    n.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(e))
    if e.value != last:
        changes.append((time.perf_counter(), e.value)); last = e.value
d = [b[0] - a[0] for a, b in zip(changes, changes[1:])]
d.sort()
print(f"energy counter: {len(changes)} values in 2 s (idle); gaps ms min {1e3*d[0]:.1f} median {1e3*d[len(d)//2]:.1f} max {1e3*d[-1]:.1f}" if d else "energy counter: no change in 2 s")
PY
timeout 400 .gpu/run benchmarks/llama_step_benchmark --config=1b --steps=20 --warmup=5 --energy_profile_ms=1000 \
  > "$logs/p1b.log" 2>&1
echo "p1b rc=$?: $(json "$logs/p1b.log") $(grep -E 'rror' "$logs/p1b.log" | tail -1 | cut -c1-200)"
grep -E '^snapshot|^energy profile' "$logs/p1b.log"
sed -n '/^alone:/,$p' "$logs/p1b.log" | grep -v '^{' | head -30
echo "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
