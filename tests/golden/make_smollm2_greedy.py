#!/usr/bin/env python3
"""Writes tests/data/smollm2_greedy.json: SmolLM2-135M-Instruct's greedy continuations (64
tokens) of a few prompts, from a Llama forward written here in NumPy (float64, with a key/value
cache) over the weights as llama.cpp's `gguf` package dequantizes them, and for each prompt its
last position's 64 largest logits. Each step also records the gap between the two largest
logits, so a test can tell a real divergence from a tie. The oracle of qkv's SmolLM2, in place
and fp32.
   scripts/get-models && pip install gguf tokenizers numpy && python3 tests/golden/make_smollm2_greedy.py
"""
import json
import os

import numpy as np

import llama_numpy
import smollm2

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "smollm2_greedy.json")
STEPS = 64
PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little robot who",
    "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
    "def add(a, b):\n",
]

r = smollm2.reader()
tok, _, _ = smollm2.tokenizer(r)
W = smollm2.weights(r)
meta = lambda k: r.fields[k].contents()
L, C = meta("llama.block_count"), meta("llama.embedding_length")
H, HKV = meta("llama.attention.head_count"), meta("llama.attention.head_count_kv")
EPS, THETA = meta("llama.attention.layer_norm_rms_epsilon"), meta("llama.rope.freq_base")
D = C // H
E = W["token_embd.weight"]


def rmsnorm(x, g):
    return llama_numpy.rmsnorm(x, g, EPS)


def rope(x, pos):
    return llama_numpy.rope(x, pos, THETA)


def forward(ids, cache):
    """Logits of the new tokens `ids`, after the len(cache) positions already cached."""
    T0, T = cache["len"], len(ids)
    pos = np.arange(T0, T0 + T, dtype=np.float64)
    x = E[ids]
    for l in range(L):
        p = f"blk.{l}."
        h = rmsnorm(x, W[p + "attn_norm.weight"])
        q = rope((h @ W[p + "attn_q.weight"].T).reshape(T, H, D), pos)
        k = rope((h @ W[p + "attn_k.weight"].T).reshape(T, HKV, D), pos)
        v = (h @ W[p + "attn_v.weight"].T).reshape(T, HKV, D)
        cache[l] = (np.concatenate([cache[l][0], k]), np.concatenate([cache[l][1], v])) if l in cache else (k, v)
        K, V = (np.repeat(t, H // HKV, axis=1) for t in cache[l])
        s = np.einsum("thd,shd->hts", q, K) / np.sqrt(D)
        s = np.where(np.arange(T0 + T)[None, None, :] <= (T0 + np.arange(T))[None, :, None], s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        a = np.einsum("hts,shd->thd", pr, V).reshape(T, H * D)
        x = x + a @ W[p + "attn_output.weight"].T
        h = rmsnorm(x, W[p + "ffn_norm.weight"])
        g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "ffn_down.weight"].T
    cache["len"] = T0 + T
    return rmsnorm(x, W["output_norm.weight"]) @ E.T


cases = []
for text in PROMPTS:
    ids = tok.encode(text, add_special_tokens=False).ids
    cache = {"len": 0}
    logits = forward(ids, cache)[-1]
    top = np.argsort(logits)[::-1][:64]
    case = {"text": text, "ids": ids, "top_ids": top.tolist(), "top_logits": logits[top].tolist(),
            "max_abs_logit": float(np.abs(logits).max()), "greedy": [], "gaps": []}
    for _ in range(STEPS):
        order = np.argsort(logits)[::-1][:2]
        case["greedy"].append(int(order[0]))
        case["gaps"].append(float(logits[order[0]] - logits[order[1]]))
        logits = forward([int(order[0])], cache)[-1]
    print(repr(text), "->", repr(tok.decode(case["greedy"])), "smallest gap", min(case["gaps"]))
    cases.append(case)
with open(OUT, "w") as f:
    json.dump({"steps": STEPS, "cases": cases}, f)
print(OUT)
