"""Joules per TFLOP of the three Linear-layer GEMMs at the Llama-1B MLP shape under the H200's power
limit, through torch (cuBLAS), by operand layout and by operand values:

    python3 kernels/gemm/gemm_energy.py

forward y[T,F] = x[T,D] W[F,D]^T (both operands K-major), data gradient dx[T,D] = dy[T,F] W[F,D]
(W MN-major) and weight gradient dW[F,D] = dy[T,F]^T x[T,D] (both MN-major), T = 16384, D = 2048,
F = 8192, bf16 in and out. Each is called back to back for two windows of about a second under
NVML's energy counter (benchmarks/llama_peer.py's EnergyMeter; it moves every ~100 ms). The
operands are fresh normal draws, scaled as a Llama step's are (activations ~1, weights 0.02, the
MLP's gradients ~1e-5), then again all at unit scale, so a difference between layouts can be told
from one between values. Written for the 1b energy profile's finding (gpu_call109.sh): the weight
gradients took ~15% more joules a TFLOP than the forward GEMMs in the same step.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from llama_peer import energy_window  # noqa: E402

T, D, F = 16384, 2048, 8192


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}, T={T} D={D} F={F}")
    flops = 2.0 * T * D * F
    g = torch.Generator(device="cuda").manual_seed(1)
    for scaled in (True, False):
        s_w, s_g = (0.02, 1e-5) if scaled else (1.0, 1.0)
        x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16, generator=g)
        w = (torch.randn(F, D, device="cuda", generator=g) * s_w).to(torch.bfloat16)
        dy = (torch.randn(T, F, device="cuda", generator=g) * s_g).to(torch.bfloat16)
        y = torch.empty(T, F, device="cuda", dtype=torch.bfloat16)
        dx = torch.empty(T, D, device="cuda", dtype=torch.bfloat16)
        dw = torch.empty(F, D, device="cuda", dtype=torch.bfloat16)
        cases = (("forward  x W^T ", lambda: torch.mm(x, w.t(), out=y)),
                 ("data grad dy W ", lambda: torch.mm(dy, w, out=dx)),
                 ("weight grad dy^T x", lambda: torch.mm(dy.t(), x, out=dw)))
        for name, fn in cases:
            for _ in range(20):
                fn()
            ms, _ = energy_window(fn, 20)
            calls = max(5, int(1000.0 / ms))
            for k in range(2):
                ms, r = energy_window(fn, calls)
                j = r["joules"] / calls
                print(f"{'scaled' if scaled else 'unit  '} {name:18s} window {k}: {ms:.3f} ms "
                      f"{flops / ms / 1e9:6.1f} TFLOP/s  {j / (flops / 1e12):.3f} J/TFLOP  "
                      f"{r['joules'] / r['seconds']:.0f} W  SM clock median {r['sm_clock_median_mhz']} MHz", flush=True)


if __name__ == "__main__":
    main()
