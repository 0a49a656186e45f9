"""The PyTorch peer for the Llama training benchmarks: a torchtitan-style Llama on H200.

RMSNorm, RoPE (Hugging Face rotate-half), GQA through scaled_dot_product_attention, SwiGLU, untied
embeddings; bf16 autocast over f32 weights (or, under FSDP2, bf16 parameters with f32 gradient
reduction), fused AdamW, gradient clipping at 1.0, random tokens. Prints one JSON line with the
median tokens/s per GPU after warm-up, torch's peak allocated memory, MFU and the losses, so the
benchmark driver can print ratios against sgtrain measured in the same command.

  python3 benchmarks/llama_peer.py --config 1b --compile
  torchrun --nproc_per_node 2 benchmarks/llama_peer.py --config 7b --compile --fsdp --ac
"""
import argparse
import ctypes
import json
import math
import os
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # dim, layers, heads, kv_heads, ffn, vocab, seq, micro-batch
    "124m": (768, 12, 12, 12, 2048, 32000, 1024, 16),
    "1b": (2048, 16, 32, 8, 8192, 32000, 2048, 8),
    "7b": (4096, 32, 32, 32, 11008, 32000, 4096, 2),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(seq, head_dim, theta=10000.0, device="cuda"):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    ang = torch.outer(torch.arange(seq, device=device).float(), inv)
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):  # x [b, s, h, d]
    d = x.shape[-1] // 2
    rot = torch.cat([-x[..., d:], x[..., :d]], dim=-1)
    return (x * cos[None, :, None, :] + rot * sin[None, :, None, :]).type_as(x)


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.attention_norm = RMSNorm(dim)
        self.wq = nn.Linear(dim, heads * self.hd, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(heads * self.hd, dim, bias=False)
        self.ffn_norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = self.attention_norm(x)
        q = apply_rope(self.wq(h).view(b, s, self.heads, self.hd), cos, sin)
        k = apply_rope(self.wk(h).view(b, s, self.kv_heads, self.hd), cos, sin)
        v = self.wv(h).view(b, s, self.kv_heads, self.hd)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, dim, layers, heads, kv_heads, ffn, vocab, seq):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim, heads, kv_heads, ffn) for _ in range(layers)])
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        cos, sin = rope_tables(seq, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.output(self.norm(x))


class EnergyMeter:
    """This GPU's energy (NVML's cumulative counter, millijoules) and SM clock (sampled every 50 ms)
    over a window, as benchmarks/gpu_energy.h reads them for sgtrain. Raises OSError / RuntimeError
    where NVML cannot be used."""

    def __init__(self, device):
        self.nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if self.nvml.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        p = torch.cuda.get_device_properties(device)
        bus = b"%08x:%02x:%02x.0" % (p.pci_domain_id, p.pci_bus_id, p.pci_device_id)
        self.handle = ctypes.c_void_p()
        if self.nvml.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(self.handle)) != 0:
            raise RuntimeError(f"NVML knows no GPU at {bus.decode()}")
        self.clocks, self.stop = [], threading.Event()

    def energy_j(self):
        mj = ctypes.c_ulonglong()
        if self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(mj)) != 0:
            raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed")
        return mj.value / 1e3

    def _sample(self):
        mhz = ctypes.c_uint()
        while not self.stop.wait(0.05):
            if self.nvml.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(mhz)) == 0:  # 1: SM
                self.clocks.append(mhz.value)

    def start(self):
        self.t0, self.e0 = time.perf_counter(), self.energy_j()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def stop_reading(self):
        e1, t1 = self.energy_j(), time.perf_counter()
        self.stop.set()
        self.thread.join()
        c = sorted(self.clocks) or [0]
        return {"joules": e1 - self.e0, "seconds": t1 - self.t0, "sm_clock_min_mhz": c[0],
                "sm_clock_median_mhz": c[len(c) // 2], "sm_clock_max_mhz": c[-1]}


def energy_window(fn, calls, device=None):
    """Calls fn() `calls` times back to back between two CUDA events under an EnergyMeter of this
    GPU (synchronized at both ends): (ms a call, the meter's reading)."""
    meter = EnergyMeter(torch.cuda.current_device() if device is None else device)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    meter.start()
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    torch.cuda.synchronize()
    r = meter.stop_reading()
    return start.elapsed_time(stop) / calls, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="1b", choices=CONFIGS)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--fsdp", action="store_true")
    ap.add_argument("--ac", action="store_true", help="activation checkpointing per block")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if args.fsdp:
        torch.distributed.init_process_group("nccl")
    dim, layers, heads, kv, ffn, vocab, seq, mb = CONFIGS[args.config]
    torch.manual_seed(args.seed)
    model = Llama(dim, layers, heads, kv, ffn, vocab, seq).cuda()
    nparams = sum(p.numel() for p in model.parameters())
    if args.ac:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        for i, layer in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(layer)
    if args.compile:
        for i, layer in enumerate(model.layers):
            model.layers[i] = torch.compile(layer)
    if args.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(args.seed + rank)
    times, losses = [], []
    meter, energy = None, None
    try:
        meter = EnergyMeter(torch.cuda.current_device())
    except (OSError, RuntimeError, AttributeError) as e:
        print(f"no energy reading: {e}", flush=True)
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, vocab, (mb, seq + 1), device="cuda", generator=gen)
        torch.cuda.synchronize()
        if step == args.warmup and meter is not None:
            meter.start()  # the window: the timed steps, with their batch draws and syncs
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not args.fsdp):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    if meter is not None:
        energy = meter.stop_reading()
    times.sort()
    t = times[len(times) // 2]
    tok_s = mb * seq / t
    flops_per_token = 6 * nparams + 12 * layers * dim * seq
    result = {
        "system": "pytorch", "config": args.config, "compile": args.compile, "fsdp": args.fsdp,
        "ac": args.ac, "world": world, "tokens_per_s_per_gpu": round(tok_s, 1),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "mfu": round(tok_s * flops_per_token / 989e12, 3), "params": nparams,
        "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
        "ln_vocab": round(math.log(vocab), 4), "torch": torch.__version__,
    }
    if energy is not None:  # this rank's GPU (at a power limit, tokens/s follows joules per token)
        result.update({
            "gpu_millijoules_per_token": round(1e3 * energy["joules"] / (args.steps * mb * seq), 3),
            "gpu_mean_watts": round(energy["joules"] / energy["seconds"], 1),
            "sm_clock_median_mhz": energy["sm_clock_median_mhz"],
            "sm_clock_min_mhz": energy["sm_clock_min_mhz"], "sm_clock_max_mhz": energy["sm_clock_max_mhz"]})
    if rank == 0:
        print(json.dumps(result), flush=True)
    if args.fsdp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
