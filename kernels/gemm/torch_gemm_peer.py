"""PyTorch peer for gemm_benchmark: torch.matmul / F.linear at the Llama-1B shapes, bf16, timed with
CUDA events (median of 50 runs after 10 warm-ups), printed as TFLOP/s in the benchmark's order.

    python3 kernels/gemm/torch_gemm_peer.py

Forward: y = F.linear(x, w); backward: dx = dy @ w and dw = dy.t() @ x (what autograd issues for a
Linear layer). Our f32-accumulating dw (beta = 1 into an f32 gradient, one GEMM) has no one-call eager
equivalent: where torch.mm accepts out_dtype it is timed as mm(out_dtype=f32) plus add_, which costs
an extra pass over dw, so that row is an upper bound for torch, not a like-for-like peer.
"""
import statistics

import torch
import torch.nn.functional as F

TOKENS = 16384
SHAPES = [(2048, 2048), (8192, 2048), (2048, 8192), (2048 + 2 * 512, 2048), (32000, 2048)]


def time_ms(fn, warmup=10, iters=50):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}")
    print(f"{'M':>6} {'N':>6} {'K':>6}  {'op':<22} {'ms':>8} {'TFLOP/s':>8}")
    for n, k in SHAPES:
        m = TOKENS
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        dw32 = torch.zeros(n, k, device=dev, dtype=torch.float32)
        ops = [
            ("fwd y=x@w^T", lambda: F.linear(x, w)),
            ("bwd dx=dy@w", lambda: torch.matmul(dy, w)),
            ("bwd dw=dy^T@x", lambda: torch.matmul(dy.t(), x)),
        ]
        try:
            torch.mm(dy.t(), x, out_dtype=torch.float32)
            ops.append(("bwd dw+=dy^T@x (f32)", lambda: dw32.add_(torch.mm(dy.t(), x, out_dtype=torch.float32))))
        except TypeError:
            pass
        flops = 2.0 * m * n * k
        for name, fn in ops:
            ms = time_ms(fn)
            print(f"{m:>6} {n:>6} {k:>6}  {name:<22} {ms:8.3f} {flops / ms / 1e9:8.1f}")
        del x, w, dy, dw32
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
