#!/usr/bin/env python3
"""Writes tests/data/quantize_blocks.json: floats and the bytes llama.cpp's own Python package
(`gguf.quants.quantize`, bit-exact with ggml's reference quantizers) makes of them in Q8_0,
Q4_0 and F16: the oracle of qkv's quantizers. The floats include the cases that test rounding:
an all-zero block, a block whose largest magnitude is negative, values halfway between two
steps, halves' subnormals, overflow to infinity.
   pip install gguf numpy && python3 tests/golden/make_quantize.py
"""
import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T, quants

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "quantize_blocks.json")
rng = np.random.default_rng(11)

blocks = [
    rng.standard_normal(32),
    rng.standard_normal(32) * 1e-3,
    np.zeros(32),
    -np.abs(rng.standard_normal(32)) * 3,               # the largest magnitude negative
    np.arange(32) - 15.5,                               # steps and halves
    np.concatenate([np.full(16, 2.5), np.full(16, -7.5)]),
    rng.uniform(-1, 1, 32) * np.array([1e-6] * 8 + [1] * 24),
]
x = np.concatenate(blocks).astype(np.float32)
out = {"values": [float(v) for v in x]}
for t in (T.Q8_0, T.Q4_0):
    out[t.name] = quants.quantize(x.reshape(-1, 32), t).tobytes().hex()
# Halves: ordinary values, the subnormal range, ties, the largest finite, overflow.
h = np.concatenate([rng.standard_normal(40), rng.uniform(-6e-5, 6e-5, 20) * np.array([1, 1e-2] * 10),
                    [65504, 65519, 65520, -1e9, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25, 1 + 2.0 ** -11,
                     1 + 3 * 2.0 ** -11, 0.0, -0.0]]).astype(np.float32)
out["f16_values"] = [float(v) for v in h]
with np.errstate(over="ignore"):
    out["F16"] = h.astype(np.float16).tobytes().hex()
with open(OUT, "w") as f:
    json.dump(out, f)
print("wrote", OUT)
