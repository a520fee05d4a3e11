"""SmolLM2-135M-Instruct for the golden scripts: the GGUF file (scripts/get-models), its
tokenizer rebuilt in Hugging Face's `tokenizers` from the file's vocabulary and merges, and its
weights as llama.cpp's `gguf` package dequantizes them."""
import os

import gguf
import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
GGUF = os.path.join(HERE, "..", "..", "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def reader():
    return gguf.GGUFReader(GGUF)


def strings(r, key):
    f = r.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def tokenizer(r):
    """SmolLM2's pre-tokenizer: every digit split off, then GPT-2's byte-level regex."""
    tokens = strings(r, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings(r, "tokenizer.ggml.merges")]
    f = r.fields["tokenizer.ggml.token_type"]
    types = [int(f.parts[i][0]) for i in f.data]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    return tok, tokens, merges


def weights(r, dtype=np.float64):
    """name -> array in (rows, cols) order, dequantized by the gguf package."""
    out = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(dtype)
    return out
