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


# ---- Tiny models: logits, loss, every gradient, and the weights after two AdamW steps ------

def model_params(cfg, g):
    """Named parameters in qkv's layout (include/qkv/model.h), random N(0, 0.2) matrices,
    small random biases and norm weights near 1 (so every path carries signal)."""
    C, V, F = cfg["d_model"], cfg["vocab_size"], cfg["d_ff"]
    W = (cfg["n_heads"] + 2 * cfg["n_kv_heads"]) * cfg["d_head"]
    A = cfg["n_heads"] * cfg["d_head"]
    ln = cfg["norm"] == "layernorm"
    P = {}
    mat = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64) * 0.2
    vec = lambda n, base=0.0: base + torch.randn(n, generator=g, dtype=torch.float64) * 0.1
    P["embedding.token"] = mat(V, C)
    if cfg["positions"] == "learned":
        P["embedding.position"] = mat(cfg["context"], C)
    for l in range(cfg["n_layers"]):
        p = f"layers.{l}."
        P[p + "norm1.weight"] = vec(C, 1.0)
        if ln:
            P[p + "norm1.bias"] = vec(C)
        P[p + "attn.qkv.weight"] = mat(W, C)
        if cfg["bias"]:
            P[p + "attn.qkv.bias"] = vec(W)
        P[p + "attn.out.weight"] = mat(C, A)
        if cfg["bias"]:
            P[p + "attn.out.bias"] = vec(C)
        P[p + "norm2.weight"] = vec(C, 1.0)
        if ln:
            P[p + "norm2.bias"] = vec(C)
        if cfg["mlp"] == "gelu":
            P[p + "mlp.fc.weight"] = mat(F, C)
            if cfg["bias"]:
                P[p + "mlp.fc.bias"] = vec(F)
        else:
            P[p + "mlp.gate.weight"] = mat(F, C)
            P[p + "mlp.up.weight"] = mat(F, C)
        P[p + "mlp.proj.weight"] = mat(C, F)
        if cfg["bias"]:
            P[p + "mlp.proj.bias"] = vec(C)
    P["norm.weight"] = vec(C, 1.0)
    if ln:
        P["norm.bias"] = vec(C)
    if not cfg["tied_embeddings"]:
        P["lm_head.weight"] = mat(V, C)
    return P


def model_forward(P, cfg, tokens, targets):
    """The decoder written with torch ops, independently of qkv's C++."""
    B, T = tokens.shape
    C, Hq, Hkv, dh = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"], cfg["d_head"]
    eps = cfg["norm_eps"]

    def norm(x, name):
        if cfg["norm"] == "layernorm":
            return F.layer_norm(x, (C,), P[name + ".weight"], P[name + ".bias"], eps)
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * P[name + ".weight"]

    def linear(x, name):
        return F.linear(x, P[name + ".weight"], P.get(name + ".bias"))

    def rope(x):  # [B, T, H, dh], adjacent pairs (2j, 2j+1), angle t · theta^(−2j/dh)
        j = torch.arange(dh // 2, dtype=torch.float64)
        angle = torch.arange(T, dtype=torch.float64).view(T, 1) * cfg["rope_theta"] ** (-2 * j / dh)
        c, s = torch.cos(angle).view(1, T, 1, -1), torch.sin(angle).view(1, T, 1, -1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)

    x = P["embedding.token"][tokens]
    if cfg["positions"] == "learned":
        x = x + P["embedding.position"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg["n_layers"]):
        p = f"layers.{l}."
        qkv = linear(norm(x, p + "norm1"), p + "attn.qkv")
        q = qkv[..., : Hq * dh].view(B, T, Hq, dh)
        k = qkv[..., Hq * dh : (Hq + Hkv) * dh].view(B, T, Hkv, dh)
        v = qkv[..., (Hq + Hkv) * dh :].view(B, T, Hkv, dh)
        if cfg["positions"] == "rotary":
            q, k = rope(q), rope(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        k = k.repeat_interleave(Hq // Hkv, dim=1)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(dh)
        att = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) @ v
        x = x + linear(att.transpose(1, 2).reshape(B, T, Hq * dh), p + "attn.out")
        h = norm(x, p + "norm2")
        if cfg["mlp"] == "gelu":
            m = F.gelu(linear(h, p + "mlp.fc"), approximate="tanh")
        else:
            m = F.silu(linear(h, p + "mlp.gate")) * linear(h, p + "mlp.up")
        x = x + linear(m, p + "mlp.proj")
    head = P["embedding.token"] if cfg["tied_embeddings"] else P["lm_head.weight"]
    logits = norm(x, "norm") @ head.T
    loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-100)
    return logits, loss


def make_model_case(name, seed, llama):
    cfg = dict(vocab_size=13, context=8, d_model=16, n_layers=2, n_heads=4,
               n_kv_heads=2 if llama else 4, d_head=4, d_ff=24 if llama else 32,
               norm="rmsnorm" if llama else "layernorm", mlp="swiglu" if llama else "gelu",
               positions="rotary" if llama else "learned", bias=not llama,
               tied_embeddings=not llama, norm_eps=1e-5, rope_theta=10000.0,
               rope_halves=False, causal=True)
    g = torch.Generator().manual_seed(seed)
    P = model_params(cfg, g)
    B, T = 2, 6
    tokens = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    targets = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    targets[0, 2] = -100  # an ignored position
    init = {k: v.clone() for k, v in P.items()}
    for t in P.values():
        t.requires_grad_(True)
    logits, loss = model_forward(P, cfg, tokens, targets)
    loss.backward()
    grads = {k: v.grad.clone() for k, v in P.items()}

    # Two AdamW steps on the same batch; decay on matrices and embeddings only (qkv's rule).
    adamw = dict(lr=0.01, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    decay = [v for k, v in P.items() if v.dim() == 2]
    no_decay = [v for k, v in P.items() if v.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": adamw["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=adamw["lr"], betas=(adamw["beta1"], adamw["beta2"]), eps=adamw["eps"])
    for _ in range(2):
        opt.zero_grad()
        _, l2 = model_forward(P, cfg, tokens, targets)
        l2.backward()
        opt.step()

    flat = lambda t: [float(x) for x in t.detach().reshape(-1).tolist()]
    doc = {"name": name, "torch": torch.__version__, "config": cfg, "B": B, "T": T,
           "tokens": tokens.reshape(-1).tolist(), "targets": targets.reshape(-1).tolist(),
           "params": {k: flat(v) for k, v in init.items()},
           "logits": flat(logits), "loss": float(loss),
           "grads": {k: flat(v) for k, v in grads.items()},
           "adamw": adamw, "after_two_steps": {k: flat(v) for k, v in P.items()}}
    path = os.path.join(HERE, f"model_{name}.json")
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print(f"wrote {path}")


def make_training_curve_case(seed=12, steps=60):
    """A GPT-2-style model trained on copying the previous token: the loss of every step in
    fp32 and under PyTorch's autocast to bf16 (fp32 master weights and AdamW state, bf16
    products), from the same float32 weights on the same batches."""
    cfg = dict(vocab_size=32, context=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4,
               d_head=8, d_ff=128, norm="layernorm", mlp="gelu", positions="learned",
               bias=True, tied_embeddings=True, norm_eps=1e-5, rope_theta=10000.0,
               rope_halves=False, causal=True)
    g = torch.Generator().manual_seed(seed)
    init = {k: v.float() for k, v in model_params(cfg, g).items()}
    B, T, batches = 4, 16, 8
    tokens = torch.randint(0, cfg["vocab_size"], (batches, B, T), generator=g)
    targets = torch.full_like(tokens, -100)
    targets[..., 1:] = tokens[..., :-1]  # each position names the token before it
    adamw = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)

    def curve(autocast):
        P = {k: v.clone().requires_grad_(True) for k, v in init.items()}
        decay = [v for v in P.values() if v.dim() == 2]
        no_decay = [v for v in P.values() if v.dim() == 1]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": adamw["weight_decay"]},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=adamw["lr"],
                                betas=(adamw["beta1"], adamw["beta2"]), eps=adamw["eps"])
        losses = []
        for step in range(steps):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                _, loss = model_forward(P, cfg, tokens[step % batches], targets[step % batches])
            loss.float().backward()
            opt.step()
            losses.append(float(loss))
        return losses

    doc = {"name": "training_curve", "torch": torch.__version__, "config": cfg, "B": B, "T": T,
           "tokens": tokens.reshape(-1).tolist(), "targets": targets.reshape(-1).tolist(),
           "params": {k: [float(x) for x in v.reshape(-1).tolist()] for k, v in init.items()},
           "adamw": adamw, "steps": steps, "fp32_losses": curve(False),
           "autocast_bf16_losses": curve(True)}
    path = os.path.join(HERE, "model_training_curve.json")
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print(f"wrote {path}")


def main():
    make_training_curve_case()
    make_model_case("gpt2", 10, llama=False)
    make_model_case("llama", 11, llama=True)
    make_case("mha_padding", 1, B=2, Hq=4, Hkv=4, Tq=13, Tk=13, D=16, Dv=16, kv_len=[13, 7])
    make_case("mha_padding_causal", 2, B=2, Hq=4, Hkv=4, Tq=13, Tk=13, D=16, Dv=16,
              causal=True, kv_len=[13, 7])
    make_case("gqa_cross_window", 3, B=1, Hq=8, Hkv=2, Tq=5, Tk=12, D=32, Dv=24,
              causal=True, window_left=4)
    make_case("bias_alibi_softcap", 4, B=2, Hq=2, Hkv=2, Tq=9, Tk=9, D=8, Dv=8,
              bias_shape=(9, 9), alibi=True, softcap=2.0, scale=0.5)


if __name__ == "__main__":
    main()
