#!/usr/bin/env python3
"""Writes tests/data/smollm2_llama_greedy.json: llama.cpp's greedy continuations (32 tokens) of a
few prompts with SmolLM2-135M-Instruct's Q4_1 file, and at each step the gap between its two
largest logits and its own error there: the largest difference between its logits and the
fp32 reference's (qkv with the file dequantized by the reference dequantizer, which
tests/smollm2_test.cpp holds to a NumPy float64 forward). A test of qkv's int8 products (the
same arithmetic as llama.cpp's) then asks for the same tokens, or a first divergence where
llama.cpp's top two lie within its error (the order there is rounding's, not the model's).
Run with llama-cpp-python and qkv installed (bench/report.py --setup makes such a Python):
   scripts/get-models && build/peer/bin/python tests/golden/make_smollm2_llama_greedy.py
"""
import json
import os

import llama_cpp
import numpy as np
from llama_cpp import Llama

import qkv

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "..", "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(HERE, "..", "data", "smollm2_llama_greedy.json")
STEPS = 32
PROMPTS = [  # none of them in bench/ or the other golden files
    "The first thing to do in the morning is",
    "Rivers flow into the sea because",
    "<|im_start|>user\nWhat is two plus three?<|im_end|>\n<|im_start|>assistant\n",
    "for i in range(10):\n",
    "A short story about a cat and a lamp:",
    "The most common element in the universe is",
]

llama = Llama(model_path=MODEL, n_ctx=256, n_threads=2, n_batch=256, logits_all=True, verbose=False)
ref = qkv.load_gguf(MODEL, dequantize=True)
cases = []
for text in PROMPTS:
    ids = llama.tokenize(text.encode(), add_bos=False, special=True)
    assert ids == ref.tokenizer.encode(text, False, True), "the tokenizers disagree"
    ctx, greedy, gaps, errors = list(ids), [], [], []
    for _ in range(STEPS):
        llama.reset()
        llama.eval(ctx)
        logits = np.array(llama.scores[len(ctx) - 1], dtype=np.float64)
        top = np.argsort(logits)[::-1][:2]
        greedy.append(int(top[0]))
        gaps.append(float(logits[top[0]] - logits[top[1]]))
        errors.append(float(np.max(np.abs(logits - ref.logits(ctx)[-1]))))
        ctx.append(int(top[0]))
    print(repr(text), "->", repr(ref.tokenizer.decode_bytes(ids[-1], greedy[0])), "…",
          "smallest gap", round(min(gaps), 4), "largest error", round(max(errors), 3))
    cases.append({"text": text, "ids": ids, "greedy": greedy, "gaps": gaps, "errors": errors})
with open(OUT, "w") as f:
    json.dump({"llama_cpp_python": llama_cpp.__version__, "steps": STEPS, "cases": cases}, f)
print(OUT)
