#!/usr/bin/env python3
"""The peer for attention_benchmark: PyTorch scaled_dot_product_attention, flash backend.

Same shapes and flop counts as attention_benchmark.cc: B=8, S=2048, H=32, KV=8, D=64/128, causal
and not; forward 4*B*S^2*H*D (halved when causal), backward 2.5x forward. GQA through
enable_gqa=True (flash backend, torch >= 2.5); where that is refused, K/V are expanded with
repeat_interleave before timing (same flops) and the line says "expanded".

    python3 kernels/attention/sdpa_peer.py   # prints one line per (pass, D, causal)
    python3 kernels/attention/sdpa_peer.py --energy   # the 1b's D=64 causal shape: joules per call

--energy calls each pass back to back for three windows of about a second under NVML's energy
counter (energy_window of benchmarks/llama_peer.py; the counter moves every ~100 ms), against
the per-layer joules of our attention groups in `llama_step_benchmark --energy_profile_ms`.
First run 2026-12-04 (gpu_call107.sh; benchmarks/README.md has the numbers).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, S, H, KV = 8, 2048, 32, 8
WARMUP, ITERS = 5, 30


def time_ms(fn):
    for _ in range(WARMUP):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(ITERS):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / ITERS


def run(dim, causal):
    # Our layout [B, S, H, D]; SDPA wants [B, H, S, D]: transposed views, as a model would pass.
    mk = lambda h: torch.randn(B, S, h, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    q, k, v = mk(H).requires_grad_(), mk(KV).requires_grad_(), mk(KV).requires_grad_()
    dout = torch.randn(B, H, S, dim, device="cuda", dtype=torch.bfloat16)
    mode = "enable_gqa"
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        try:
            attn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            attn()
        except (RuntimeError, TypeError):
            mode = "expanded"
            ke = k.detach().repeat_interleave(H // KV, dim=1).requires_grad_()
            ve = v.detach().repeat_interleave(H // KV, dim=1).requires_grad_()
            attn = lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=causal)
        fwd_ms = time_ms(attn)
        out = attn()
        inputs = (q, k, v) if mode == "enable_gqa" else (q, ke, ve)
        bwd_ms = time_ms(lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True))
    flops = 4.0 * B * S * S * H * dim / (2.0 if causal else 1.0)
    for name, ms, f in (("forward", fwd_ms, flops), ("backward", bwd_ms, 2.5 * flops)):
        print(f"sdpa_flash {name:8s} D={dim:3d} causal={int(causal)} ({mode}): "
              f"{ms:7.3f} ms  {f / ms / 1e9:6.1f} TFLOP/s", flush=True)


def energy(dim=64, causal=True, window_s=1.0, windows=3):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
    from llama_peer import energy_window

    mk = lambda h: torch.randn(B, S, h, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    q, k, v = mk(H).requires_grad_(), mk(KV).requires_grad_(), mk(KV).requires_grad_()
    dout = torch.randn(B, H, S, dim, device="cuda", dtype=torch.bfloat16)
    flops = 4.0 * B * S * S * H * dim / (2.0 if causal else 1.0)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        attn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        out = attn()
        passes = (("forward", attn, flops),
                  ("backward", lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), 2.5 * flops))
        for name, fn, f in passes:
            calls = max(3, int(window_s / (time_ms(fn) / 1e3)))
            for w in range(windows):
                ms, r = energy_window(fn, calls)
                print(f"sdpa_flash {name:8s} D={dim} causal={int(causal)} window {w}: {calls} calls, "
                      f"{ms:.3f} ms {f / ms / 1e9:.1f} TFLOP/s, {r['joules'] / calls:.4f} J a call, "
                      f"{r['joules'] / r['seconds']:.0f} W, SM clock median {r['sm_clock_median_mhz']} MHz", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--energy", action="store_true", help="joules per call at the 1b's D=64 causal shape")
    args = ap.parse_args()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    if args.energy:
        energy()
        return
    for dim in (64, 128):
        for causal in (True, False):
            run(dim, causal)


if __name__ == "__main__":
    main()
