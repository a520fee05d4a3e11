"""The pieces of a Llama forward the golden scripts share, in NumPy, with llama.cpp's
conventions: RMSNorm, and rotary positions on adjacent pairs."""
import numpy as np


def rmsnorm(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rope(x, pos, theta):
    """x [T, heads, D]: pairs (2j, 2j+1) rotated by pos · θ^(-2j/D)."""
    D = x.shape[-1]
    j = np.arange(D // 2)
    angle = pos[:, None] * theta ** (-2.0 * j / D)
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def forward(w, tokens, heads, kv_heads, eps, theta):
    """Logits of `tokens` (float64) from a Llama's weights `w`, by GGUF tensor name (token_embd,
    blk.N.attn_q …, output_norm; the head is output.weight, or token_embd.weight when tied):
    causal attention with GQA, SwiGLU, no cache."""
    T = len(tokens)
    x = w["token_embd.weight"][tokens]
    D = x.shape[1] // heads
    pos = np.arange(T, dtype=np.float64)
    layers = 1 + max(int(n.split(".")[1]) for n in w if n.startswith("blk."))
    for l in range(layers):
        p = f"blk.{l}."
        h = rmsnorm(x, w[p + "attn_norm.weight"], eps)
        q = rope((h @ w[p + "attn_q.weight"].T).reshape(T, heads, D), pos, theta)
        k = rope((h @ w[p + "attn_k.weight"].T).reshape(T, kv_heads, D), pos, theta)
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, kv_heads, D)
        k, v = np.repeat(k, heads // kv_heads, axis=1), np.repeat(v, heads // kv_heads, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(D)
        s = np.where(np.tri(T, dtype=bool)[None], s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        a = np.einsum("hts,shd->thd", pr, v).reshape(T, heads * D)
        x = x + a @ w[p + "attn_output.weight"].T
        h = rmsnorm(x, w[p + "ffn_norm.weight"], eps)
        g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
    head = w.get("output.weight", w["token_embd.weight"])
    return rmsnorm(x, w["output_norm.weight"], eps) @ head.T
