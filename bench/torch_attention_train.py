#!/usr/bin/env python3
"""A GPT-2-small-shaped PyTorch model, one training step on the CPU, with its attention from
qkv.torch and from PyTorch's own scaled_dot_product_attention, in the same run.

Everything but attention is the same PyTorch code (nn.Linear, LayerNorm, GELU, AdamW), so the
difference is attention's forward and backward. Each variant runs in a fresh process (its own
peak memory, read from getrusage), rounds alternate; tokens/s is the median over the steps
after the first.

  /opt/peer/bin/python bench/torch_attention_train.py             # newest PyTorch (the peer)
  /opt/peer/bin/python bench/torch_attention_train.py --seq 512 --layers 4 --steps 3
Needs the qkv package installed for that Python (`pip install .`).
"""
import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time


def run_variant(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    if a.attention == "qkv":
        import qkv.torch as qt
        attend = lambda q, k, v: qt.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        attend = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads).unbind(2)
            y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(a.vocab, a.d_model), nn.Embedding(a.seq, a.d_model)
            self.blocks = nn.ModuleList(Block(a.d_model, a.heads) for _ in range(a.layers))
            self.ln = nn.LayerNorm(a.d_model)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x)
            return self.ln(x) @ self.tok.weight.T  # tied head, as GPT-2

    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=torch.Generator().manual_seed(1))
    times, losses = [], []
    for _ in range(a.steps + 1):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(idx[:, :-1]).reshape(-1, a.vocab), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    step = statistics.median(times[1:])
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(dict(attention=a.attention, torch=torch.__version__, step_s=step,
                          tokens_per_s=a.batch * a.seq / step, peak_mb=peak_mb, losses=losses)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--attention", choices=["qkv", "torch"], help=argparse.SUPPRESS)  # one variant, in-process
    a = ap.parse_args()
    if a.attention:
        return run_variant(a)
    args = [a for a in sys.argv[1:]]
    results = {"qkv": [], "torch": []}
    for _ in range(a.rounds):
        for variant in ("torch", "qkv"):
            out = subprocess.run([sys.executable, __file__, *args, "--attention", variant], check=True,
                                 capture_output=True, text=True).stdout
            results[variant].append(json.loads(out.strip().splitlines()[-1]))
    med = {v: statistics.median(r["tokens_per_s"] for r in rs) for v, rs in results.items()}
    mem = {v: max(r["peak_mb"] for r in rs) for v, rs in results.items()}
    first = {v: rs[0]["losses"] for v, rs in results.items()}
    print(f"GPT-2-small shape: {a.layers} layers, d_model {a.d_model}, {a.heads} heads, seq {a.seq}, batch "
          f"{a.batch}, {a.threads} threads; torch {results['torch'][0]['torch']}")
    print("| attention | tokens/s | peak memory (MB) |")
    print("| --- | ---: | ---: |")
    for v, name in (("torch", "PyTorch SDPA"), ("qkv", "qkv.torch")):
        print(f"| {name} | {med[v]:.0f} | {mem[v]:.0f} |")
    print(f"qkv / PyTorch: {med['qkv'] / med['torch']:.3f}× tokens/s; "
          f"largest loss difference over the steps: {max(abs(x - y) for x, y in zip(first['qkv'], first['torch'])):.2e}")


if __name__ == "__main__":
    main()
