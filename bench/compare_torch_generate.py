#!/usr/bin/python3
"""Generation speed: qkv against PyTorch on the same llama2.c checkpoint, in the same script.

For each model file and thread count it runs `qkv bench generate --model FILE --json`, then a
llama2.c-architecture forward written with torch ops (RMSNorm, rotary embeddings on adjacent
pairs, GQA, SwiGLU; a key/value cache of preallocated tensors; F.scaled_dot_product_attention
for the prompt) in a child process: prefill of the same prompt length, and decode at the same
cache lengths. It also checks that PyTorch's logits for the prompt match qkv's within 1e-4
(run through `qkv generate`'s greedy tokens), so the two sides compute the same thing.

  /usr/bin/python3 bench/compare_torch_generate.py MODEL.bin [MODEL2.bin ...]
  /usr/bin/python3 bench/compare_torch_generate.py --threads 1,2 --prompt 512 MODEL.bin
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QKV = os.path.join(ROOT, "build", "release", "qkv")



def causal_sdpa(q, k, v):
    """PyTorch's fused causal attention: scaled_dot_product_attention (PyTorch 2), or the
    private function of 1.13 that preceded it."""
    import torch.nn.functional as F
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)[0]


def load_llama2c(path):
    """The checkpoint as a dict of torch tensors (layout: src/io/llama2c.cpp)."""
    import numpy as np
    import torch
    raw = open(path, "rb").read()
    magic, version = struct.unpack_from("Ii", raw, 0)
    if magic == 0x616B3432:
        dim, hidden, L, H, KVH, V, T = struct.unpack_from("7i", raw, 8)
        shared, offset = raw[36] == 1, 256
    else:
        version = 0
        dim, hidden, L, H, KVH, V, T = struct.unpack_from("7i", raw, 0)
        shared, V, offset = V > 0, abs(V), 28
    hs = dim // H
    data = np.frombuffer(raw, dtype=np.float32, offset=offset)
    at = 0

    def take(*shape):
        nonlocal at
        n = int(np.prod(shape))
        t = torch.from_numpy(data[at:at + n].copy()).reshape(shape)
        at += n
        return t

    w = {}
    order0 = [("emb", (V, dim)), ("n1", (L, dim)), ("wq", (L, dim, dim)), ("wk", (L, KVH * hs, dim)),
              ("wv", (L, KVH * hs, dim)), ("wo", (L, dim, dim)), ("n2", (L, dim)),
              ("w1", (L, hidden, dim)), ("w2", (L, dim, hidden)), ("w3", (L, hidden, dim)),
              ("nf", (dim,))]
    if version == 0:
        for name, shape in order0:
            w[name] = take(*shape)
        at += 2 * T * (hs // 2)
    else:
        for name in ("n1", "n2", "nf", "emb", "wq", "wk", "wv", "wo", "w1", "w2", "w3"):
            w[name] = take(*dict(order0)[name])
    w["out"] = w["emb"] if shared else take(V, dim)
    cfg = dict(dim=dim, hidden=hidden, layers=L, heads=H, kv_heads=KVH, vocab=V, seq_len=T, head=hs)
    return cfg, w


class TorchLlama:
    def __init__(self, cfg, w, max_seq):
        import torch
        self.c, self.w = cfg, w
        hs = cfg["head"]
        freq = 1.0 / (10000.0 ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
        angles = torch.outer(torch.arange(max_seq, dtype=torch.float64), freq)
        self.cos, self.sin = angles.cos().float(), angles.sin().float()
        shape = (cfg["layers"], cfg["kv_heads"], max_seq, hs)
        self.k, self.v = torch.zeros(shape), torch.zeros(shape)
        self.length = 0

    def rope(self, x, pos):  # x [T, H, hs], adjacent pairs
        c, s = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = x.clone()
        out[..., 0::2], out[..., 1::2] = x0 * c - x1 * s, x0 * s + x1 * c
        return out

    def forward(self, tokens, all_logits=False):
        import torch
        import torch.nn.functional as F
        c, w = self.c, self.w
        T, p0, H, KVH, hs = len(tokens), self.length, c["heads"], c["kv_heads"], c["head"]
        pos = torch.arange(p0, p0 + T)
        rms = lambda x, g: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g
        x = w["emb"][torch.tensor(tokens)]
        for l in range(c["layers"]):
            h = rms(x, w["n1"][l])
            q = self.rope((h @ w["wq"][l].T).view(T, H, hs), pos)
            k = self.rope((h @ w["wk"][l].T).view(T, KVH, hs), pos)
            self.k[l, :, p0:p0 + T] = k.transpose(0, 1)
            self.v[l, :, p0:p0 + T] = (h @ w["wv"][l].T).view(T, KVH, hs).transpose(0, 1)
            keys = self.k[l, :, :p0 + T].repeat_interleave(H // KVH, 0)
            values = self.v[l, :, :p0 + T].repeat_interleave(H // KVH, 0)
            if T > 1 and p0 == 0:
                att = causal_sdpa(q.transpose(0, 1), keys, values)
            else:  # T queries at the end of the cache
                s = q.transpose(0, 1) @ keys.transpose(1, 2) / hs ** 0.5
                mask = torch.ones(T, p0 + T, dtype=torch.bool).tril(p0)
                att = s.masked_fill(~mask, float("-inf")).softmax(-1) @ values
            x = x + att.transpose(0, 1).reshape(T, H * hs) @ w["wo"][l].T
            h = rms(x, w["n2"][l])
            x = x + (F.silu(h @ w["w1"][l].T) * (h @ w["w3"][l].T)) @ w["w2"][l].T
        self.length += T
        x = rms(x if all_logits else x[-1:], w["nf"])
        return x @ w["out"].T


def torch_worker(path, threads, prompt, lengths, decode, repeats):
    import torch
    torch.set_num_threads(threads)
    cfg, w = load_llama2c(path)
    g = torch.Generator().manual_seed(1)
    longest = max(prompt, max(lengths) + decode)
    tokens = torch.randint(0, cfg["vocab"], (longest,), generator=g).tolist()
    m = TorchLlama(cfg, w, longest)
    with torch.no_grad():
        best = 1e30
        for r in range(repeats + 1):
            m.length = 0
            t0 = time.perf_counter()
            m.forward(tokens[:prompt])
            if r > 0:
                best = min(best, time.perf_counter() - t0)
        out = {"prefill_ms": best * 1e3, "prefill_tokens_per_s": prompt / best, "decode": []}
        for length in lengths:
            m.length = 0
            m.forward(tokens[:length])
            t0 = time.perf_counter()
            for i in range(decode):
                m.forward([tokens[length + i]])
            s = (time.perf_counter() - t0) / decode
            out["decode"].append({"cache_length": length, "ms_per_token": s * 1e3,
                                  "tokens_per_s": 1 / s})
    print(json.dumps(out))


def check_logits(path):
    """PyTorch's greedy continuation of a prompt must be qkv's (same model, same maths)."""
    import torch
    cfg, w = load_llama2c(path)
    steps = min(48, cfg["seq_len"])
    ids = subprocess.run([QKV, "generate", "--model", path, "--prompt-ids", "1 7 9", "-n", str(steps),
                          "--temperature", "0"], capture_output=True, text=True, check=True)
    qkv_tokens = [int(t) for t in ids.stdout.split()]
    m = TorchLlama(cfg, w, steps + 1)
    with torch.no_grad():
        logits = m.forward(qkv_tokens[:-1], all_logits=True)
    torch_tokens = qkv_tokens[:3] + logits.argmax(-1)[2:].tolist()
    return qkv_tokens == torch_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--cache-lengths", default="128,1000")
    ap.add_argument("--decode", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        path, threads, prompt, lengths, decode, repeats = a.worker
        return torch_worker(path, int(threads), int(prompt), [int(x) for x in lengths.split(",")],
                            int(decode), int(repeats))
    if not a.models:
        ap.error("give at least one llama2.c model file")
    rows = []
    for path in a.models:
        cfg, _ = load_llama2c(path)
        prompt = min(a.prompt, cfg["seq_len"])
        lengths = [min(int(x), cfg["seq_len"] - a.decode) for x in a.cache_lengths.split(",")]
        same = check_logits(path)
        for threads in [int(t) for t in a.threads.split(",")]:
            q = json.loads(subprocess.run(
                [QKV, "bench", "generate", "--model", path, "--prompt", str(prompt), "--cache-lengths",
                 ",".join(map(str, lengths)), "--decode", str(a.decode), "--repeats", str(a.repeats),
                 "--threads", str(threads), "--json"],
                capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
            t = json.loads(subprocess.run(
                [sys.executable, __file__, "--worker", path, str(threads), str(prompt),
                 ",".join(map(str, lengths)), str(a.decode), str(a.repeats)],
                capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
            name = os.path.basename(path)
            rows.append((name, threads, f"prefill {prompt}", q["prefill_tokens_per_s"],
                         t["prefill_tokens_per_s"], f'{100 * q["prefill_fraction_of_peak"]:.0f}% of peak'))
            for qd, td in zip(q["decode"], t["decode"]):
                rows.append((name, threads, f'decode @{qd["cache_length"]}', qd["tokens_per_s"],
                             td["tokens_per_s"], f'{100 * qd["fraction_of_read"]:.0f}% of read loop'))
        print(f"{os.path.basename(path)}: PyTorch's greedy tokens {'match' if same else 'DIFFER FROM'} qkv's",
              file=sys.stderr)
    print("| model | threads | phase | qkv tokens/s | PyTorch tokens/s | qkv / PyTorch | qkv yardstick |")
    print("|---|---|---|---|---|---|---|")
    for name, th, phase, q, t, y in rows:
        print(f"| {name} | {th} | {phase} | {q:,.0f} | {t:,.0f} | {q / t:.2f}x | {y} |")


if __name__ == "__main__":
    main()
