#!/usr/bin/python3
"""Golden files for qkv's attention tests, computed by PyTorch.

Run with Debian's python3-torch:  /usr/bin/python3 tests/golden/make_golden.py
It writes attention_*.json beside itself. The files are committed; the C++ tests read them
and do not need PyTorch.

Inputs are drawn in float32 (so the C++ side uses the very same numbers) and the answers are
computed in float64. Where PyTorch has the operation (its scaled-dot-product attention with a
boolean mask) we call it; bias, ALiBi and softcap are written out with torch ops, since
PyTorch 1.13's attention has no such options.
"""
import json
import math
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def visible(Tq, Tk, causal, window_left, window_right, kv_len, B):
    """Boolean [B, 1, Tq, Tk]: True where query i may attend to key j (qkv's conventions:
    the query sits at key position i + Tk - Tq)."""
    pos = torch.arange(Tq).view(Tq, 1) + (Tk - Tq)
    j = torch.arange(Tk).view(1, Tk)
    ok = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal:
        ok &= j <= pos
    if window_left >= 0:
        ok &= j >= pos - window_left
    if window_right >= 0:
        ok &= j <= pos + window_right
    ok = ok.expand(B, 1, Tq, Tk).clone()
    if kv_len is not None:
        for b, n in enumerate(kv_len):
            ok[b, :, :, n:] = False
    return ok


def make_case(name, seed, B, Hq, Hkv, Tq, Tk, D, Dv, causal=False, window_left=-1,
              window_right=-1, kv_len=None, bias_shape=None, alibi=False, softcap=0.0,
              scale=0.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(B, Hq, Tq, D, generator=g) * 2 - 1
    k = torch.rand(B, Hkv, Tk, D, generator=g) * 2 - 1
    v = torch.rand(B, Hkv, Tk, Dv, generator=g) * 2 - 1
    bias = torch.rand(*bias_shape, generator=g) * 2 - 1 if bias_shape else None
    slopes = [2 ** (-8 * (h + 1) / Hq) for h in range(Hq)] if alibi else None

    # GQA: query head h reads key/value head h // (Hq / Hkv).
    group = Hq // Hkv
    k64 = k.double().repeat_interleave(group, dim=1)
    v64 = v.double().repeat_interleave(group, dim=1)
    q64 = q.double()
    mask = visible(Tq, Tk, causal, window_left, window_right, kv_len, B)
    s = scale if scale else 1 / math.sqrt(D)

    # The final scores, step by step as include/qkv/attention.h defines them.
    scores = q64 @ k64.transpose(-1, -2) * s
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.double()
    if alibi:
        pos = torch.arange(Tq).view(Tq, 1) + (Tk - Tq)
        dist = (pos - torch.arange(Tk).view(1, Tk)).abs().double()
        scores = scores - torch.tensor(slopes, dtype=torch.float64).view(1, Hq, 1, 1) * dist
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)

    if bias is None and not alibi and softcap == 0:
        # PyTorch's own attention (boolean mask: True = attend). It scales by 1/sqrt(D)
        # itself, so q carries any other scale.
        out, weights = F._scaled_dot_product_attention(
            q64 * (s * math.sqrt(D)), k64, v64, mask, 0.0, True, False)
        how = "torch.nn.functional._scaled_dot_product_attention, float64"
    else:
        weights = torch.softmax(scores, dim=-1)
        out = weights @ v64
        how = "torch ops (matmul, tanh, softmax), float64"
    assert torch.isfinite(out).all(), "golden cases must not have fully masked rows"

    flat = lambda t: [float(x) for x in t.reshape(-1).tolist()]
    doc = {
        "name": name, "how": how, "torch": torch.__version__,
        "B": B, "Hq": Hq, "Hkv": Hkv, "Tq": Tq, "Tk": Tk, "D": D, "Dv": Dv,
        "causal": causal, "window_left": window_left, "window_right": window_right,
        "kv_len": kv_len, "scale": scale, "softcap": softcap, "alibi": slopes,
        "bias_shape": list(bias_shape) if bias_shape else None,
        "bias": flat(bias) if bias is not None else None,
        "q": flat(q), "k": flat(k), "v": flat(v),
        "out": flat(out), "lse": flat(lse), "weights": flat(weights),
    }
    path = os.path.join(HERE, f"attention_{name}.json")
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print(f"wrote {path} ({how})")


def main():
    make_case("mha_padding", 1, B=2, Hq=4, Hkv=4, Tq=13, Tk=13, D=16, Dv=16, kv_len=[13, 7])
    make_case("mha_padding_causal", 2, B=2, Hq=4, Hkv=4, Tq=13, Tk=13, D=16, Dv=16,
              causal=True, kv_len=[13, 7])
    make_case("gqa_cross_window", 3, B=1, Hq=8, Hkv=2, Tq=5, Tk=12, D=32, Dv=24,
              causal=True, window_left=4)
    make_case("bias_alibi_softcap", 4, B=2, Hq=2, Hkv=2, Tq=9, Tk=9, D=8, Dv=8,
              bias_shape=(9, 9), alibi=True, softcap=2.0, scale=0.5)


if __name__ == "__main__":
    main()
