"""Joules per TFLOP of the Llama-1B's sibling GEMMs run as one GEMM over adjacent weights, against
the same products run one by one, through torch (cuBLAS) under the H200's power limit:

    python3 kernels/gemm/gemm_merge_energy.py [--window_ms 1000]

Siblings share an input: the MLP's gate and up projections (w1, w3: [F, D] each) and attention's
q, k and v projections (wq [H*hd, D], wk and wv [KV*hd, D]). Merged, their weights are one
[sum N, D] matrix, so
  forward      y[T, sum N] = x[T, D] W^T                 one GEMM instead of one a sibling;
  data grad    dx[T, D] = dy[T, sum N] W                 one GEMM of K = sum N instead of one a
                                                         sibling, each after the first accumulating
                                                         into dx (beta = 1);
  weight grad  dW[sum N, D] = dy[T, sum N]^T x[T, D]     one GEMM of M = sum N.
T = 16384, D = 2048, F = 8192, H*hd = 2048, KV*hd = 512; bf16 in and out. The FLOPs are the same
both ways, so the joules a TFLOP say what merging would save at the power limit (wave quantization:
the same tiles over the 132 SMs in fewer, fuller waves; one output pass in place of an
accumulation). Each form runs back to back for a window of about a second under NVML's energy
counter (benchmarks/llama_peer.py's EnergyMeter; it moves every ~100 ms), in the order separate,
merged, merged, separate, so a drift in clock or temperature shows as a difference between the
two windows of one form. Operands are fresh normal draws scaled as a Llama step's are
(activations ~1, weights 0.02, gradients ~1e-5).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from llama_peer import energy_window  # noqa: E402

T, D = 16384, 2048


def cases(g, siblings):
    """(name, separate fn, merged fn, flops) for the three products of siblings of widths `siblings`."""
    n = sum(siblings)
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    w = (torch.randn(n, D, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    dy = (torch.randn(T, n, device="cuda", generator=g) * 1e-5).to(torch.bfloat16)
    y = torch.empty(T, n, device="cuda", dtype=torch.bfloat16)
    dx = torch.empty(T, D, device="cuda", dtype=torch.bfloat16)
    dw = torch.empty(n, D, device="cuda", dtype=torch.bfloat16)
    offs = [sum(siblings[:i]) for i in range(len(siblings))]
    # The separate forms read and write contiguous per-sibling tensors, as a step without merging does.
    ws = [w[o:o + s].contiguous() for o, s in zip(offs, siblings)]
    dys = [dy[:, o:o + s].contiguous() for o, s in zip(offs, siblings)]
    ys = [torch.empty(T, s, device="cuda", dtype=torch.bfloat16) for s in siblings]
    dws = [torch.empty(s, D, device="cuda", dtype=torch.bfloat16) for s in siblings]

    def fwd_sep():
        for wi, yi in zip(ws, ys):
            torch.mm(x, wi.t(), out=yi)

    def dgrad_sep():
        torch.mm(dys[0], ws[0], out=dx)
        for dyi, wi in zip(dys[1:], ws[1:]):
            dx.addmm_(dyi, wi)

    def wgrad_sep():
        for dyi, dwi in zip(dys, dws):
            torch.mm(dyi.t(), x, out=dwi)

    flops = 2.0 * T * D * n
    return [("forward  x W^T", fwd_sep, lambda: torch.mm(x, w.t(), out=y), flops),
            ("data grad dy W", dgrad_sep, lambda: torch.mm(dy, w, out=dx), flops),
            ("weight grad dy^T x", wgrad_sep, lambda: torch.mm(dy.t(), x, out=dw), flops)]


def window(fn, flops, window_ms):
    for _ in range(10):
        fn()
    ms, _ = energy_window(fn, 10)
    calls = max(5, int(window_ms / ms))
    ms, r = energy_window(fn, calls)
    return ms, r["joules"] / calls / (flops / 1e12), r["joules"] / r["seconds"], r["sm_clock_median_mhz"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--window_ms", type=float, default=1000.0)
    args = ap.parse_args()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}, T={T} D={D}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    summary = []
    for group, siblings in (("w1|w3", [8192, 8192]), ("wq|wk|wv", [2048, 512, 512])):
        for name, sep, merged, flops in cases(g, siblings):
            j = {"separate": [], "merged": []}
            for form in ("separate", "merged", "merged", "separate"):
                ms, jt, w, mhz = window(sep if form == "separate" else merged, flops, args.window_ms)
                j[form].append(jt)
                print(f"{group:9s} {name:18s} {form:8s} {ms:7.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s "
                      f"{jt:.4f} J/TFLOP {w:4.0f} W {mhz} MHz", flush=True)
            s, m = sum(j["separate"]) / 2, sum(j["merged"]) / 2
            summary.append(f"{group:9s} {name:18s} separate {j['separate'][0]:.4f}/{j['separate'][1]:.4f} "
                           f"merged {j['merged'][0]:.4f}/{j['merged'][1]:.4f} J/TFLOP: merged {100 * (m / s - 1):+.1f}%")
    print("== summary")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
