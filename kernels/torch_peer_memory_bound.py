#!/usr/bin/env python3
"""PyTorch peers for the memory-bound kernels (elementwise, SwiGLU, RoPE, embedding, cross-entropy,
AdamW), eager and torch.compile, at the shapes of the Google Benchmark targets in kernels/*/.

Bytes are counted exactly as the C++ benchmarks count them (each input read once, each output
written once), so the GB/s columns compare directly. Timing: CUDA events around each call, median
of --iters runs after warm-up (torch.compile warm-up includes compilation).

  python3 kernels/torch_peer_memory_bound.py            # all ops
  python3 kernels/torch_peer_memory_bound.py --only rope,cross_entropy --iters 50
  python3 kernels/torch_peer_memory_bound.py --batch 10   # back-to-back calls, as the *Batch entries
"""
import argparse
import statistics
import sys

import torch
import torch.nn.functional as F


BATCH = 1  # --batch: calls between the two events (1: host launch latency included in each timing)


def timed(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(BATCH):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3 / BATCH)
    return statistics.median(times)


def report(name, variant, shape, nbytes, seconds):
    print(f"{name:<34} {variant:<8} {shape:<28} {seconds * 1e3:9.3f} ms {nbytes / seconds / 1e9:9.1f} GB/s",
          flush=True)


def run(name, shape, nbytes, fn, iters, compile_too=True):
    report(name, "eager", shape, nbytes, timed(fn, iters))
    if compile_too:
        try:
            cfn = torch.compile(fn)
            report(name, "compile", shape, nbytes, timed(cfn, iters, warmup=5))
        except Exception as e:  # noqa: BLE001 - report and continue with the other ops
            print(f"{name:<34} compile  failed: {type(e).__name__}: {e}", flush=True)


def elementwise(iters):
    n = 16384 * 2048
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    run("Add bf16", f"[{n}]", 3 * 2 * n, lambda: a + b, iters)
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    run("AddScaled f32 (in place)", f"[{n}]", 3 * 4 * n, lambda: y.add_(x, alpha=1e-3), iters)
    run("Cast f32->bf16", f"[{n}]", 6 * n, lambda: x.to(torch.bfloat16), iters)
    big = 1200 << 20
    xb = torch.randn(big, device="cuda")
    run("Cast f32->bf16", f"[{big}]", 6 * big, lambda: xb.to(torch.bfloat16), iters)
    del xb
    rows = torch.randn(16384, 2048, device="cuda", dtype=torch.bfloat16)
    run("SumRows bf16->f32", "[16384,2048]", 2 * 16384 * 2048 + 4 * 2048,
        lambda: rows.sum(0, dtype=torch.float32), iters)


def swiglu(iters):
    for f in (5632, 8192):
        g = torch.randn(16384, f, device="cuda", dtype=torch.bfloat16) * 3
        u = torch.randn_like(g)
        d = torch.randn_like(g)
        nb = 16384 * f * 2

        def fwd():
            return F.silu(g) * u

        def bwd():
            gf, uf, df = g.float(), u.float(), d.float()
            s = torch.sigmoid(gf)
            return (df * uf * s * (1 + gf * (1 - s))).bfloat16(), (df * gf * s).bfloat16()

        run("SwiGluForward bf16", f"[16384,{f}]", 3 * nb, fwd, iters)
        run("SwiGluBackward bf16", f"[16384,{f}]", 5 * nb, bwd, iters)


def rope(iters):
    b, s, hq, hk = 8, 2048, 32, 8
    for d in (64, 128):
        bb = b if d == 64 else 4
        q = torch.randn(bb, s, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(bb, s, hk, d, device="cuda", dtype=torch.bfloat16)
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device="cuda").float() / d))
        ang = torch.outer(torch.arange(s, device="cuda").float(), inv)
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = emb.cos().bfloat16()[None, :, None, :], emb.sin().bfloat16()[None, :, None, :]

        def rot(x):
            x1, x2 = x[..., : d // 2], x[..., d // 2:]
            return torch.cat((-x2, x1), dim=-1)

        def fwd():  # Hugging Face apply_rotary_pos_emb on [b, s, h, d]
            return q * cos + rot(q) * sin, k * cos + rot(k) * sin

        nb = 2 * (q.numel() + k.numel()) * 2
        run("RopeForward bf16 (HF)", f"[{bb},{s},{hq}+{hk},{d}]", nb, fwd, iters)


def embedding(iters):
    for vocab in (32000, 128256):
        n, dim = 16384, 2048
        ids = torch.randint(0, vocab, (n,), device="cuda", dtype=torch.int32)
        table = torch.randn(vocab, dim, device="cuda", dtype=torch.bfloat16)
        dout = torch.randn(n, dim, device="cuda", dtype=torch.bfloat16)
        run("EmbeddingForward bf16", f"{n} of [{vocab},{dim}]", 2 * n * dim * 2 + n * 4,
            lambda: F.embedding(ids, table), iters)

        def bwd():  # index_add_ uses float atomics (not deterministic); the peer for speed only
            return torch.zeros(vocab, dim, device="cuda").index_add_(0, ids, dout.float())

        run("EmbeddingBackward bf16->f32", f"{n} of [{vocab},{dim}]", n * dim * 2 + vocab * dim * 4 + n * 4, bwd,
            iters)


def cross_entropy(iters):
    for rows, vocab in ((16384, 32000), (4096, 128256)):
        logits = (torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16) * 4).requires_grad_()
        targets = torch.randint(0, vocab, (rows,), device="cuda")

        def loss_fn(x):
            return F.cross_entropy(x.float(), targets, ignore_index=-100)

        def step(fn):
            def go():
                logits.grad = None
                fn(logits).backward()
            return go

        nb = 2 * logits.numel() * 2 + rows * 4
        report("CrossEntropyForwardBackward bf16", "eager", f"[{rows},{vocab}]", nb, timed(step(loss_fn), iters))
        try:
            report("CrossEntropyForwardBackward bf16", "compile", f"[{rows},{vocab}]", nb,
                   timed(step(torch.compile(loss_fn)), iters, warmup=5))
        except Exception as e:  # noqa: BLE001
            print(f"CrossEntropy compile failed: {type(e).__name__}: {e}", flush=True)
        del logits


def adamw(iters):
    total, tensors = 1200 << 20, 16
    n = total // tensors
    params = [torch.zeros(n, device="cuda", requires_grad=True) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn(n, device="cuda") * 1e-3
    nb = total * 28  # no bf16 copy: BM_AdamWStepF32GradNoCopy's bytes (BM_AdamWStepF32Grad adds 2 a copy)
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=True)
    report("AdamWStep f32 grad (fused=True)", "eager", f"[{total}] in {tensors}", nb, timed(opt.step, iters))
    try:
        # A tensor learning rate (no recompile when it changes) needs capturable=True with foreach.
        opt2 = torch.optim.AdamW(params, lr=torch.tensor(1e-4, device="cuda"), weight_decay=0.1, foreach=True,
                                 capturable=True)
        report("AdamWStep f32 grad (foreach)", "compile", f"[{total}] in {tensors}", nb,
               timed(torch.compile(opt2.step), iters, warmup=5))
        del opt2  # its moments: 10 GB
    except Exception as e:  # noqa: BLE001
        print(f"AdamW compile failed: {type(e).__name__}: {e}", flush=True)
    # The same outputs as our AdamWStep: the step, then the bf16 weight copies (30 bytes/element).
    copies = [torch.empty(n, device="cuda", dtype=torch.bfloat16) for _ in range(tensors)]

    def copy_params():
        with torch.no_grad():
            if hasattr(torch, "_foreach_copy_"):
                torch._foreach_copy_(copies, params)
            else:
                for c, p in zip(copies, params):
                    c.copy_(p)

    def fused_step_and_copy():
        opt.step()
        copy_params()

    report("AdamWStep+bf16 copy (fused=True)", "eager", f"[{total}] in {tensors}", total * 30,
           timed(fused_step_and_copy, iters))
    del opt
    try:
        opt3 = torch.optim.AdamW(params, lr=torch.tensor(1e-4, device="cuda"), weight_decay=0.1, foreach=True,
                                 capturable=True)

        def step_and_copy():
            opt3.step()
            copy_params()

        report("AdamWStep+bf16 copy (foreach)", "compile", f"[{total}] in {tensors}", total * 30,
               timed(torch.compile(step_and_copy), iters, warmup=5))
    except Exception as e:  # noqa: BLE001
        print(f"AdamW + copy compile failed: {type(e).__name__}: {e}", flush=True)
    grads = [p.grad for p in params]
    run("GradNorm f32 (norm only)", f"[{total}] in {tensors}", total * 4,
        lambda: torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))), iters)


OPS = {"elementwise": elementwise, "swiglu": swiglu, "rope": rope, "embedding": embedding,
       "cross_entropy": cross_entropy, "adamw": adamw}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--batch", type=int, default=1,
                    help="calls timed between one pair of events (the C++ benchmarks' *Batch entries use 5-20)")
    args = ap.parse_args()
    global BATCH
    BATCH = max(1, args.batch)
    if not torch.cuda.is_available():
        sys.exit("torch_peer_memory_bound.py: needs a CUDA GPU")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    for name in args.only.split(","):
        OPS[name](args.iters)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
