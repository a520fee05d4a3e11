#!/usr/bin/env python3
"""Writes tests/data/tiny_llama.gguf, a small random Llama in GGUF (llama.cpp's `gguf` writer;
F32 norms, Q8_0, Q4_0, Q4_1 and F16 matrices, the head tied to the embedding) and
tiny_llama.gguf.json: the logits of a prompt from a Llama forward written here in NumPy
(float64) over the weights as the `gguf` package dequantizes them — llama.cpp's conventions:
RMSNorm, rotary on adjacent pairs, GQA, SwiGLU. The oracle of qkv's GGUF model loader.
   pip install gguf numpy && python3 tests/golden/make_gguf_llama.py
"""
import json
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

import llama_numpy

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "tiny_llama.gguf")
C, L, H, HKV, F, V, CTX = 64, 2, 4, 2, 96, 80, 32
D = C // H
EPS, THETA = 1e-5, 10000.0
rng = np.random.default_rng(3)

w = gguf.GGUFWriter(OUT, "llama")
w.add_context_length(CTX)
w.add_embedding_length(C)
w.add_block_count(L)
w.add_feed_forward_length(F)
w.add_head_count(H)
w.add_head_count_kv(HKV)
w.add_layer_norm_rms_eps(EPS)
w.add_rope_freq_base(THETA)
w.add_rope_dimension_count(D)
w.add_vocab_size(V)
weights = {}


def add(name, shape, qtype, std=0.2, offset=0.0):
    x = (rng.standard_normal(shape) * std + offset).astype(np.float32)
    if qtype == T.F32:
        data = x
    elif qtype == T.F16:
        data = x.astype(np.float16)
    else:
        data = gguf.quants.quantize(x, qtype)
    w.add_tensor(name, data, raw_dtype=qtype if qtype not in (T.F32, T.F16) else None)
    raw = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.uint8)
    weights[name] = gguf.quants.dequantize(raw, qtype).reshape(shape).astype(np.float64)


add("token_embd.weight", (V, C), T.Q8_0, std=0.5)
kinds = [T.Q8_0, T.Q4_0, T.Q4_1, T.F16]
for l in range(L):
    p = f"blk.{l}."
    add(p + "attn_norm.weight", (C,), T.F32, 0.1, 1.0)
    add(p + "attn_q.weight", (H * D, C), kinds[l % 4])
    add(p + "attn_k.weight", (HKV * D, C), kinds[(l + 1) % 4])
    add(p + "attn_v.weight", (HKV * D, C), kinds[(l + 2) % 4])
    add(p + "attn_output.weight", (C, H * D), kinds[(l + 3) % 4])
    add(p + "ffn_norm.weight", (C,), T.F32, 0.1, 1.0)
    add(p + "ffn_gate.weight", (F, C), T.Q4_0)
    add(p + "ffn_up.weight", (F, C), T.Q8_0)
    add(p + "ffn_down.weight", (C, F), T.Q4_1 if l == 0 else T.F16)
add("output_norm.weight", (C,), T.F32, 0.1, 1.0)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()


tokens = [1, 7, 42, 3, 79, 0, 15, 15, 60, 2, 33]
logits = llama_numpy.forward(weights, tokens, H, HKV, EPS, THETA)
with open(OUT + ".json", "w") as f:
    json.dump({"tokens": tokens, "logits": logits.tolist()}, f)
print("wrote", OUT, os.path.getsize(OUT), "bytes")
