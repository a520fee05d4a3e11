#!/usr/bin/env python3
"""Writes two small GGUF files that hold only a tokenizer (and a tiny Llama's metadata), with
llama.cpp's own `gguf` writer, and the token ids llama.cpp itself (llama-cpp-python, the vocabulary
loaded alone) gives a corpus of awkward text with each:
  tests/data/spm_tokenizer.gguf   tokenizer.ggml.model "llama": stories260K's 512-piece
                                  SentencePiece vocabulary (models/stories260K/tok512.bin)
  tests/data/bpe_tokenizer.gguf   "gpt2" with the "smollm" pre-tokenizer: GPT-2's 256 byte
                                  letters and the first 300 merges of SmolLM2's list
and tokenizer_ggufs.json. The oracle of Tokenizer::from_gguf; both files also seed the GGUF
fuzz target.
   scripts/get-models && pip install gguf numpy llama-cpp-python && python3 tests/golden/make_tokenizer_ggufs.py
"""
import json
import os
import struct

import gguf
from llama_cpp import Llama

import smollm2

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
CORPUS = [
    "Once upon a time, there was a little girl named Lily.",
    "Hello world",
    "  two leading spaces and a trailing one ",
    "tabs\tand\nnewlines\n\nhere",
    "Numbers 12345 and 3.14, 2026-12-02",
    "don't, I'll, we've, they're",
    "Größe café naïve",
    "日本語 😀 👩‍💻",
    "a" * 40,
    "",
]


def llama_meta(w, vocab):
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)


def write(path, fill):
    w = gguf.GGUFWriter(path, "llama")
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# SentencePiece: tok512.bin is llama2.c's export (max length, then score, length, bytes each).
raw = open(os.path.join(HERE, "..", "..", "models", "stories260K", "tok512.bin"), "rb").read()
pos, pieces, scores = 4, [], []
while pos < len(raw):
    score, n = struct.unpack_from("<fi", raw, pos)
    pieces.append(raw[pos + 8:pos + 8 + n].decode("utf-8", "replace").replace(" ", "\u2581"))
    scores.append(score)
    pos += 8 + n
types = [2 if i == 0 else 3 if i in (1, 2) else 6 if p.startswith("<0x") and len(p) == 6 else 1
         for i, p in enumerate(pieces)]


def spm(w):
    llama_meta(w, len(pieces))
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)


# Byte-level BPE: the byte letters, then each of SmolLM2's first merges' results.
r = smollm2.reader()
def byte_letter(b):
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    return chr(b) if b in printable else chr(0x100 + [x for x in range(256) if x not in printable].index(b))
vocab = ["<|endoftext|>"] + [byte_letter(b) for b in range(256)]
merges = []
for m in smollm2.strings(r, "tokenizer.ggml.merges"):
    a, b = m.split(" ", 1)
    if a in vocab and b in vocab and a + b not in vocab:
        merges.append(m)
        vocab.append(a + b)
    if len(merges) == 300:
        break


def bpe(w):
    llama_meta(w, len(vocab))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocab)
    w.add_token_types([3] + [1] * (len(vocab) - 1))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)


out = {}
for name, fill, bos in (("spm_tokenizer.gguf", spm, True), ("bpe_tokenizer.gguf", bpe, False)):
    path = os.path.join(DATA, name)
    write(path, fill)
    ll = Llama(model_path=path, vocab_only=True, verbose=False)
    out[name] = [{"text": t, "ids": ll.tokenize(t.encode(), add_bos=bos, special=False)} for t in CORPUS]
    print(name, os.path.getsize(path), "bytes")
with open(os.path.join(DATA, "tokenizer_ggufs.json"), "w") as f:
    json.dump(out, f, ensure_ascii=False, indent=0)
