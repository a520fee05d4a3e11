#!/usr/bin/env python3
"""Writes tests/data/quant_blocks.json: for each ggml tensor type qkv reads, random blocks (the
scales set to ordinary float16 values, every other bit random) and their values as llama.cpp's
own Python package (`gguf.quants.dequantize`) computes them: the oracle of qkv's reference
dequantizer.   pip install gguf numpy && python3 tests/golden/make_quant.py
"""
import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T, GGML_QUANT_SIZES, quants

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "quant_blocks.json")
rng = np.random.default_rng(7)


def f16(x):
    return np.float16(x).tobytes()


def block(t):
    """One random block of type t with sane scales (where each scale sits in the block)."""
    n, size = GGML_QUANT_SIZES[t]
    b = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    scale = lambda: f16(rng.uniform(-0.05, 0.05))
    if t in (T.Q4_0, T.Q8_0):
        b[0:2] = scale()
    elif t == T.Q4_1:
        b[0:2], b[2:4] = scale(), scale()
    elif t == T.Q4_K:
        b[0:2], b[2:4] = scale(), f16(abs(rng.uniform(0, 0.05)))
    elif t == T.Q6_K:
        b[size - 2:size] = scale()
    return bytes(b)


out = {}
for t, blocks in [(T.Q8_0, 3), (T.Q4_0, 3), (T.Q4_1, 3), (T.Q4_K, 2), (T.Q6_K, 2)]:
    raw = b"".join(block(t) for _ in range(blocks))
    n = GGML_QUANT_SIZES[t][0] * blocks
    values = quants.dequantize(np.frombuffer(raw, dtype=np.uint8), t)
    out[t.name] = {"type": int(t), "hex": raw.hex(), "values": [float(v) for v in values.reshape(-1)]}
    assert len(out[t.name]["values"]) == n
x = rng.standard_normal(40).astype(np.float32)
for t, data in [(T.F16, x.astype(np.float16).tobytes()), (T.BF16, quants.quantize(x, T.BF16).tobytes()),
                (T.F32, x.tobytes())]:
    values = quants.dequantize(np.frombuffer(data, dtype=np.uint8), t)
    out[t.name] = {"type": int(t), "hex": data.hex(), "values": [float(v) for v in values.reshape(-1)]}
with open(OUT, "w") as f:
    json.dump(out, f)
print("wrote", OUT)
