#!/usr/bin/env python3
"""Writes tests/data/quantize_blocks.json: floats and the bytes llama.cpp makes of them: the
oracle of qkv's quantizers. Q8_0, Q4_0, Q4_1 and F16 from llama.cpp's own Python package
(`gguf.quants.quantize`, bit-exact with ggml's reference quantizers); Q4_K and Q6_K, which that
package does not write, from ggml itself (`ggml_quantize_chunk` in the library that
llama-cpp-python carries, without an importance matrix: the reference quantizers). The floats
include the cases that test rounding: an all-zero block, a block whose largest magnitude is
negative, values halfway between two steps, halves' subnormals, overflow to infinity; and for
the K-quants super-blocks of normal values, of values over very different magnitudes, and of
zeros.
   pip install gguf numpy llama-cpp-python && python3 tests/golden/make_quantize.py
"""
import ctypes
import glob
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
for t in (T.Q8_0, T.Q4_0, T.Q4_1):
    out[t.name] = quants.quantize(x.reshape(-1, 32), t).tobytes().hex()


def ggml_quantize(values, t, bytes_per_block):
    """values (whole 256-blocks, one row) in type t by ggml's own quantizer."""
    import llama_cpp
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    lib = ctypes.CDLL(glob.glob(os.path.join(libdir, "libggml-base.so*"))[0])
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    src = np.ascontiguousarray(values, dtype=np.float32)
    dst = np.zeros(len(src) // 256 * bytes_per_block, dtype=np.uint8)
    n = lib.ggml_quantize_chunk(int(t), src.ctypes.data, dst.ctypes.data, 0, 1, len(src), None)
    assert n == len(dst), (n, len(dst))
    return dst.tobytes().hex()


k = np.concatenate([
    rng.standard_normal(256),
    rng.standard_normal(256) * np.repeat(10.0 ** rng.uniform(-4, 1, 16), 16),
    np.abs(rng.standard_normal(256)) + 0.5,              # no negative value: min > 0
    np.zeros(256),
    rng.standard_normal(256) * 1e-3,
]).astype(np.float32)
out["k_values"] = [float(v) for v in k]
out["Q4_K"] = ggml_quantize(k, T.Q4_K, 144)
out["Q6_K"] = ggml_quantize(k, T.Q6_K, 210)
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
