#!/usr/bin/env python3
"""qkv's two arithmetics for quantized weights (matmul="exact", fp32 activations; matmul="int8",
llama.cpp's: activations rounded to int8 blocks) against llama.cpp (llama-cpp-python) on the
same GGUF file, in one process:

  speed       decode tokens/s, and prefill of a short (19-token) and a long (512-token) prompt,
              on 1 and 2 threads; rounds alternate between the engines, the best of each kept
  perplexity  on a text none of qkv's tests uses, windowed as llama.cpp's llama-perplexity
              (chunks of --ctx tokens, each chunk's second half scored): qkv's `qkv perplexity`
              in each mode, llama.cpp's from its logits with the same windows
  agreement   greedy continuations of held-out prompts, int8 against llama.cpp, token for token
  shapes      a 110M Llama shape (`qkv random-model`, `qkv quantize` into each type) decoded in
              each mode by `qkv bench generate`, against the read loop its process measures

   bench/report.py --setup && build/peer/bin/python bench/quantized_compare.py
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_cpp_compare import (DEFAULT, LLAMA_CPP_EXTRA_BUFTS, PROMPTS, LlamaCpp,  # noqa: E402
                               cpu_name, qkv_greedy, qkv_timed)

import llama_cpp  # noqa: E402
import qkv  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QKV = os.path.join(ROOT, "build", "release", "qkv")
# The GNU GPL v3 as Debian's base-files package installs it (verbatim copying is permitted):
# English prose of ~8,000 tokens that no test of qkv reads.
TEXT = "/usr/share/common-licenses/GPL-3"
MODES = ("exact", "int8")


def llama_perplexity(path, text_path, ctx, threads):
    """llama-perplexity's windows over llama.cpp's logits: chunks of ctx tokens (BOS first when
    the vocabulary adds it), each chunk's predictions from ctx/2 on scored."""
    m = LlamaCpp(path, threads, ctx)
    text = open(text_path, encoding="utf-8").read()
    add_bos = m.m._model.add_bos_token() if hasattr(m.m, "_model") else False
    tokens = m.m.tokenize(text.encode(), add_bos=add_bos, special=False)
    chunks, first, nll, count = len(tokens) // ctx, ctx // 2, 0.0, 0
    for k in range(chunks):
        chunk = tokens[k * ctx:(k + 1) * ctx]
        if add_bos:
            chunk = [m.m.token_bos()] + chunk[1:]
        logits = m.logits(chunk)
        for j in range(first, ctx - 1):
            z = logits[j]
            top = z.max()
            nll += top + np.log(np.exp(z - top).sum()) - z[tokens[k * ctx + j + 1]]
            count += 1
    return {"perplexity": float(np.exp(nll / count)), "tokens": len(tokens), "chunks": chunks,
            "scored": count}


def speeds(path, threads, rounds, decode):
    qkv.set_num_threads(threads)
    models = {mode: qkv.load_gguf(path, matmul=mode) for mode in MODES}
    ll = LlamaCpp(path, threads, 2048, logits_all=False, n_batch=2048)
    tok = models["exact"].tokenizer
    long_prompt = tok.encode(" ".join(PROMPTS) * 8, False, True)[:512]
    short_prompt = tok.encode(PROMPTS[1] + " " + PROMPTS[2], False, True)[:19]
    engines = [(f"qkv_{mode}", (lambda m: lambda ids, n: qkv_timed(m, ids, n))(models[mode]))
               for mode in MODES] + [("llama_cpp", ll.timed)]
    best = {name: {"prefill_short": 1e9, "prefill_long": 1e9, "decode": 1e9} for name, _ in engines}
    for _ in range(rounds):
        for name, timed in engines:
            b = best[name]
            p, d = timed(long_prompt, decode)
            b["prefill_long"], b["decode"] = min(b["prefill_long"], p), min(b["decode"], d)
            p, _ = timed(short_prompt, 2)
            b["prefill_short"] = min(b["prefill_short"], p)
    out = {}
    for name, b in best.items():
        out[name] = {"prefill_short_tokens_per_s": len(short_prompt) / b["prefill_short"],
                     "prefill_long_tokens_per_s": len(long_prompt) / b["prefill_long"],
                     "decode_tokens_per_s": (decode - 1) / b["decode"]}
    return out, len(short_prompt), len(long_prompt)


# The 110M shape (llama2.c's stories110M: width 768, 12 layers, 32000 tokens) and its types.
SHAPE = ["--dim", "768", "--hidden", "2048", "--layers", "12", "--heads", "12", "--vocab",
         "32000", "--seq-len", "1024"]
SHAPE_TYPES = ("q8_0", "q4_0", "q4_k", "q6_k")


def shapes(rounds):
    """Decode tokens/s of the 110M shape in each type and mode, 2 threads, at a 16-token cache;
    the best of `rounds` runs, each with its own read loop (its fraction kept with it)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "m.bin")
        subprocess.run([QKV, "random-model", "-o", model] + SHAPE, check=True, capture_output=True)
        for t in SHAPE_TYPES:
            path = os.path.join(tmp, f"m.{t}.gguf")
            subprocess.run([QKV, "quantize", "--model", model, "--out", path, "--type", t],
                           check=True, capture_output=True)
            row = {"type": t, "bytes": os.path.getsize(path)}
            for mode in MODES:
                best = None
                for _ in range(rounds):
                    r = json.loads(subprocess.run(
                        [QKV, "bench", "generate", "--model", path, "--prompt", "64",
                         "--cache-lengths", "16", "--decode", "64", "--threads", "2",
                         "--matmul", mode, "--json"],
                        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
                    d = r["decode"][0]
                    if best is None or d["tokens_per_s"] > best["tokens_per_s"]:
                        best = {"tokens_per_s": d["tokens_per_s"], "fraction_of_read": d["fraction_of_read"],
                                "read_gbps": d["read_gbps"], "prefill_tokens_per_s": r["prefill_tokens_per_s"]}
                row[mode] = best
            out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT)
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--only-shapes", action="store_true", help="only the 110M shapes")
    a = ap.parse_args()
    if a.only_shapes:
        print(json.dumps({"cpu": cpu_name(), "shapes": shapes(a.rounds)}, indent=1))
        return
    res = {"cpu": cpu_name(), "model": os.path.basename(a.model), "text": a.text, "ctx": a.ctx,
           "llama_cpp_python": llama_cpp.__version__, "llama_cpp_amx": LLAMA_CPP_EXTRA_BUFTS,
           "speed": {}}
    for threads in (2, 1):
        s, short, long = speeds(a.model, threads, a.rounds, a.decode)
        res["speed"][str(threads)] = s
        res["prefill_short_tokens"], res["prefill_long_tokens"] = short, long

    res["perplexity"] = {}
    for mode in MODES:
        out = subprocess.run([QKV, "perplexity", "--model", a.model, "--text", a.text, "--ctx",
                              str(a.ctx), "--matmul", mode, "--threads", "2", "--json"],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        res["perplexity"][f"qkv_{mode}"] = {k: r[k] for k in ("perplexity", "tokens", "chunks", "scored")}
    res["perplexity"]["llama_cpp"] = llama_perplexity(a.model, a.text, a.ctx, 2)

    qkv.set_num_threads(2)
    q = qkv.load_gguf(a.model, matmul="int8")
    ll = LlamaCpp(a.model, 2, 2048)
    tok = q.tokenizer
    same = total = identical = 0
    for text in PROMPTS:
        ids = tok.encode(text, False, True)
        x, y = qkv_greedy(q, ids, a.tokens), ll.greedy(ids, a.tokens)
        n = min(len(x), len(y))
        agree = next((i for i in range(n) if x[i] != y[i]), n)
        same += agree
        total += max(len(x), len(y))
        identical += x == y
    res["greedy_int8_vs_llama_cpp"] = {"prompts": len(PROMPTS), "identical": identical,
                                       "tokens_before_divergence": same, "tokens": total}
    res["shapes"] = shapes(a.rounds)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
