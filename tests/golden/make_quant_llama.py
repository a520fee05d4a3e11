#!/usr/bin/env python3
"""Writes tests/data/quant_llama.json and tests/data/quant_llama.{q4_k,q6_k}.gguf: a random
Llama (`qkv random-model`, width 256 so that every matrix is whole K-quant super-blocks)
quantized by llama.cpp's own quantizer (`llama_model_quantize` in llama-cpp-python, every
matrix in the one type: `pure`) to Q8_0, Q4_0, Q4_1, Q4_K and Q6_K, from the F32 GGUF that
`qkv quantize --type f32` writes of it. Recorded:
  - per type, a checksum (64-bit FNV-1a) of each tensor's bytes, which `qkv quantize --type T`
    of the same model must reproduce (tests/cli_test.cpp); the script checks it here too;
  - the K-quant files themselves (the types qkv's tests have no other file of), and the
    logits of a prompt from a NumPy float64 forward (llama_numpy.py) over their weights as the
    `gguf` package dequantizes them: the oracle of qkv's K-quant kernels (tests/gguf_test.cpp).
Run with llama-cpp-python and gguf installed (bench/report.py --setup makes such a Python),
after building qkv:
   build/peer/bin/python tests/golden/make_quant_llama.py
"""
import ctypes
import json
import os
import subprocess
import tempfile

import gguf
import llama_cpp
import numpy as np

import llama_numpy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
DATA = os.path.join(ROOT, "tests", "data")
QKV = os.path.join(ROOT, "build", "release", "qkv")
# The model: `qkv random-model` with these arguments (tests/cli_test.cpp makes it again).
ARGS = ["--dim", "256", "--hidden", "256", "--layers", "1", "--heads", "4", "--kv-heads", "2",
        "--vocab", "64", "--seq-len", "64", "--seed", "5"]
TYPES = {  # qkv quantize's name: llama.cpp's file type
    "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    "q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1,
    "q4_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S,
    "q6_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
}
KEPT = ("q4_k", "q6_k")  # the files kept in tests/data
TOKENS = [1, 17, 42, 3, 63, 0, 15, 15, 60, 2, 33, 8]


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in bytes(data):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def tensors(path):
    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type, np.asarray(t.data)) for t in r.tensors}, r


def llama_quantize(src, dst, ftype):
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = ftype
    p.pure = True
    p.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    assert rc == 0, f"llama_model_quantize failed ({rc})"


def forward(path):
    """Logits of TOKENS: the NumPy float64 forward over the file's dequantized weights."""
    ts, r = tensors(path)
    field = lambda k: r.fields[k].parts[r.fields[k].data[0]][0]
    H, HKV = int(field("llama.attention.head_count")), int(field("llama.attention.head_count_kv"))
    eps, theta = float(field("llama.attention.layer_norm_rms_epsilon")), 10000.0
    if "llama.rope.freq_base" in r.fields:
        theta = float(field("llama.rope.freq_base"))
    w = {}
    for name, (qtype, data) in ts.items():
        raw = np.ascontiguousarray(data)
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w[name] = raw.astype(np.float64)
        else:
            w[name] = gguf.quants.dequantize(raw.view(np.uint8), qtype).astype(np.float64)
    return llama_numpy.forward(w, TOKENS, H, HKV, eps, theta).tolist()


def main():
    out = {"random_model": ARGS, "tokens": TOKENS, "checksums": {}, "logits": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model.bin")
        subprocess.check_call([QKV, "random-model", "-o", model] + ARGS)
        f32 = os.path.join(tmp, "model.f32.gguf")
        subprocess.check_call([QKV, "quantize", "--model", model, "--out", f32, "--type", "f32"])
        for name, ftype in TYPES.items():
            theirs = os.path.join(tmp, f"llama.{name}.gguf")
            ours = os.path.join(tmp, f"qkv.{name}.gguf")
            llama_quantize(f32, theirs, ftype)
            subprocess.check_call([QKV, "quantize", "--model", model, "--out", ours, "--type", name])
            a, _ = tensors(theirs)
            b, _ = tensors(ours)
            assert a.keys() == b.keys(), (name, sorted(a), sorted(b))
            sums = {}
            for t in sorted(a):
                ta, tb = a[t][1].tobytes(), b[t][1].tobytes()
                assert a[t][0] == b[t][0], (name, t, a[t][0], b[t][0])
                sums[t] = fnv1a(ta)
                same = ta == tb
                print(f"{name} {t}: {a[t][0].name} {'same bytes' if same else 'DIFFERENT BYTES'}")
                assert same, f"qkv quantize --type {name} differs from llama.cpp in {t}"
            out["checksums"][name] = sums
            if name in KEPT:
                kept = os.path.join(DATA, f"quant_llama.{name}.gguf")
                with open(theirs, "rb") as src, open(kept, "wb") as dst:
                    dst.write(src.read())
                out["logits"][name] = forward(kept)
                print("wrote", kept, os.path.getsize(kept), "bytes")
    path = os.path.join(DATA, "quant_llama.json")
    with open(path, "w") as f:
        json.dump(out, f)
    print("wrote", path)


if __name__ == "__main__":
    main()
