"""PyTorch peer for rmsnorm_benchmark: the same shapes and byte counts, eager and torch.compile.

Run on the GPU machine in the same command as the benchmark:  python3 kernels/rmsnorm/rmsnorm_peer.py
(add --batch 20 to time 20 back-to-back calls per measurement, as the benchmark's *Batch entries do)
Prints one line per (variant, direction, shape) with GB/s (bytes: x read + y written [+ dy read]).
"""
import sys

import torch
import torch._functorch.config
import torch.nn.functional as F


def rmsnorm(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def add_rmsnorm(x, delta, w, eps=1e-5):
    """The Llama block's residual add followed by RMSNorm (add_rmsnorm_benchmark's op): (h, y)."""
    h = x + delta
    return h, rmsnorm(h, w, eps)


BATCH = 1  # --batch N: N back-to-back calls between the events, as rmsnorm_benchmark's *Batch entries


def bench(fn, iters=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(BATCH):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3 / BATCH)
    times.sort()
    return times[len(times) // 2]


def main():
    global BATCH
    if "--batch" in sys.argv:
        BATCH = max(1, int(sys.argv[sys.argv.index("--batch") + 1]))
    torch._functorch.config.donated_buffer = False  # the timing loop re-runs one backward graph
    compiled = torch.compile(rmsnorm)
    compiled_add = torch.compile(add_rmsnorm)
    for rows, dim in [(16384, 2048), (8192, 4096)]:
        x = torch.randn(rows, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn_like(x)
        fwd_bytes = rows * dim * 2 * 2
        bwd_bytes = rows * dim * 2 * 3
        for name, fn in [("eager", rmsnorm), ("F.rms_norm", lambda a, b: F.rms_norm(a, (dim,), b, 1e-5)),
                         ("compile", compiled)]:
            with torch.no_grad():
                t = bench(lambda: fn(x, w))
            print(f"peer {name:10s} fwd bf16 {rows}x{dim}: {fwd_bytes / t / 1e9:8.1f} GB/s ({t * 1e6:.1f} us)"
                  f" batch {BATCH}")
            y = fn(x, w)
            t = bench(lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True))
            print(f"peer {name:10s} bwd bf16 {rows}x{dim}: {bwd_bytes / t / 1e9:8.1f} GB/s ({t * 1e6:.1f} us)"
                  f" batch {BATCH}")
        # add+RMSNorm with add_rmsnorm_benchmark's byte counts: forward x, delta read, h, y written;
        # backward dy, dh_in, h read, dh written (the gradient of x and of delta, one tensor).
        delta = torch.randn_like(x, requires_grad=True)
        dh_in = torch.randn_like(x)
        for name, fn in [("add eager", add_rmsnorm), ("add compile", compiled_add)]:
            with torch.no_grad():
                t = bench(lambda: fn(x, delta, w))
            print(f"peer {name:10s} fwd bf16 {rows}x{dim}: {4 * rows * dim * 2 / t / 1e9:8.1f} GB/s"
                  f" ({t * 1e6:.1f} us) batch {BATCH}")
            h, y = fn(x, delta, w)
            t = bench(lambda: torch.autograd.grad((h, y), (x, delta, w), (dh_in, dy), retain_graph=True))
            print(f"peer {name:10s} bwd bf16 {rows}x{dim}: {4 * rows * dim * 2 / t / 1e9:8.1f} GB/s"
                  f" ({t * 1e6:.1f} us) batch {BATCH}")


if __name__ == "__main__":
    main()
