#!/usr/bin/env bash
# Runs the compiled sgtrain step and the PyTorch peer (torch.compile) for one config on the first
# GPU, one after the other in the same command, and prints both JSON lines and the ratios (and the
# energy per token of both, where NVML can be read).
#   benchmarks/compare_llama.sh 1b [extra llama_step_benchmark flags, e.g. --recompute=none]
# Targets (issue 10): tokens/s ratio >= 1.15 and peak memory ratio <= 0.8 vs torch.compile.
# BIN overrides the benchmark binary (default: bazel-bin/benchmarks/llama_step_benchmark, or the
# GPU bundle's .gpu/run wrapper when present).
set -u
config=${1:-1b}; shift || true
bin=${BIN:-bazel-bin/benchmarks/llama_step_benchmark}
run=()
if [[ -z "${BIN:-}" && -x .gpu/run ]]; then run=(.gpu/run); bin=benchmarks/llama_step_benchmark; fi
ours=$(timeout 900 "${run[@]}" "$bin" --config="$config" "$@" | tail -1)
echo "sgtrain: $ours"
peer=$(timeout 900 python3 benchmarks/llama_peer.py --config "$config" --compile | tail -1)
echo "pytorch: $peer"
python3 - "$ours" "$peer" <<'PY'
import json, sys
try:
    a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
except ValueError as e:
    sys.exit(f"ratio: a run did not print JSON ({e})")
r_tok = a["tokens_per_s_per_gpu"] / b["tokens_per_s_per_gpu"]
r_mem = a["peak_gib"] / b["peak_gib"]
print(f"ratio {a['config']}: tokens/s {r_tok:.3f}x (target >= 1.15), peak memory {r_mem:.3f}x (target <= 0.80), "
      f"mfu {a['mfu']:.3f} vs {b['mfu']:.3f}, loss first {a['loss_first']:.3f} vs {b['loss_first']:.3f}, "
      f"last {a['loss_last']:.3f} vs {b['loss_last']:.3f} (ln vocab {b['ln_vocab']:.3f})")
k = "gpu_millijoules_per_token"
if k in a and k in b:  # both read the GPU's energy counter over their timed steps
    print(f"energy {a['config']}: {a[k]:.3f} vs {b[k]:.3f} mJ/token ({a[k] / b[k]:.3f}x), mean power "
          f"{a['gpu_mean_watts']:.0f} vs {b['gpu_mean_watts']:.0f} W, SM clock median "
          f"{a['sm_clock_median_mhz']:.0f} vs {b['sm_clock_median_mhz']:.0f} MHz")
PY
