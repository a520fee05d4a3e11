#!/usr/bin/env python3
"""qkv's KV cache storages (f32, f16, bf16, q8_0, q4_0) against each other and against llama.cpp
(llama-cpp-python, flash attention on, its cache in the same type), in one run:

  decode      `qkv bench attention --cache T`: one query over a 32k-position cache, dim 128, 8, 32
              and 64 query heads over 8 kv heads; the cache's stored bytes per second against a
              read loop over the same bytes measured in the same process (medians of rounds)
  generate    SmolLM2 decoding its last 1,000 tokens up to its 8,192-token context: qkv's
              `qkv bench generate` (--matmul int8, llama.cpp's arithmetic for the weights) and
              llama.cpp, each cache type, 1 and 2 threads; tokens/s over those 1,000 tokens
  perplexity  `qkv perplexity --cache T` on a text no test reads, and llama.cpp's logits with its
              cache in the same type, in llama-perplexity's windows
  chat        greedy replies of a long chat (qkv.Chat) with each cache against the f32 cache's

   bench/report.py --setup && build/peer/bin/python bench/kv_cache_compare.py
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_cpp_compare import DEFAULT, cpu_name  # noqa: E402

import llama_cpp  # noqa: E402
from llama_cpp import Llama  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QKV = os.path.join(ROOT, "build", "release", "qkv")
TEXT = "/usr/share/common-licenses/GPL-3"  # English prose no test of qkv reads
CACHES = ("f32", "f16", "q8_0", "q4_0")
GGML_TYPE = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16,
             "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}
# Held out: written for this comparison. Each reply stays in the cache for the next turn.
CHAT = ["Tell me about the history of the printing press.",
        "How did it change the way people learned?",
        "Which inventions of the last century had a similar effect, and why?",
        "Summarise everything we discussed in five bullet points.",
        "Now write a short story about a printer's apprentice in 1450.",
        "What would that apprentice think of the internet?"]


def qkv_json(args):
    out = subprocess.run([QKV] + args + ["--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def decode_fractions(min_time):
    rows = []
    for heads in (8, 32, 64):
        for cache in ("f32", "q8_0", "q4_0"):
            r = qkv_json(["bench", "attention", "--heads", str(heads), "--kv-heads", "8", "--seq",
                          "32768", "--queries", "1", "--dim", "128", "--cache", cache,
                          "--min-time", str(min_time), "--threads", "2"])
            rows.append({k: r[k] for k in ("heads", "kv_heads", "cache", "ms", "kv_gbps", "read_gbps",
                                           "fraction_of_read", "gflops", "fraction_of_peak",
                                           "peak_gflops", "max_abs_err", "target")})
    return rows


def llama(path, threads, ctx, cache, logits_all=False):
    t = GGML_TYPE[cache]
    return Llama(model_path=path, n_ctx=ctx, n_threads=threads, n_threads_batch=threads,
                 n_batch=512, flash_attn=True, type_k=t, type_v=t, logits_all=logits_all,
                 verbose=False)


def llama_generate(path, threads, cache, context, decode):
    """Tokens/s of llama.cpp's last `decode` tokens up to `context`: the cache filled by one
    prompt (random token ids: the attention's cost does not depend on them), then one token
    at a time, as `qkv bench generate --cache-lengths` does."""
    m = llama(path, threads, context, cache)
    rng = np.random.default_rng(1)
    ids = [int(t) for t in rng.integers(0, m.n_vocab(), context)]
    m.eval(ids[:context - decode])
    t0 = time.perf_counter()
    for t in ids[context - decode:]:
        m.eval([t])
    seconds = time.perf_counter() - t0
    del m
    return decode / seconds


def qkv_generate(path, threads, cache, context, decode):
    r = qkv_json(["bench", "generate", "--model", path, "--prompt", "16", "--repeats", "1",
                  "--cache-lengths", str(context - decode), "--decode", str(decode), "--cache",
                  cache, "--matmul", "int8", "--threads", str(threads)])
    return r["decode"][0]["tokens_per_s"]


def llama_perplexity(path, text_path, ctx, cache):
    """llama-perplexity's windows over llama.cpp's logits with its cache in `cache`."""
    m = llama(path, 2, ctx, cache, logits_all=True)
    text = open(text_path, encoding="utf-8").read()
    add_bos = m._model.add_bos_token()
    tokens = m.tokenize(text.encode(), add_bos=add_bos, special=False)
    chunks, first, nll, count = len(tokens) // ctx, ctx // 2, 0.0, 0
    for k in range(chunks):
        chunk = tokens[k * ctx:(k + 1) * ctx]
        if add_bos:
            chunk = [m.token_bos()] + chunk[1:]
        m.reset()
        m.eval(chunk)
        logits = np.array(m.scores[:ctx], dtype=np.float64)
        for j in range(first, ctx - 1):
            z = logits[j]
            top = z.max()
            nll += top + np.log(np.exp(z - top).sum()) - z[tokens[k * ctx + j + 1]]
            count += 1
    return float(np.exp(nll / count))


def chat_agreement(path, max_reply):
    import qkv
    qkv.set_num_threads(2)
    model = qkv.load_gguf(path)
    replies = {}
    for cache in ("f32", "bf16", "f16", "q8_0", "q4_0"):
        chat = qkv.Chat(model, temperature=0, max_reply=max_reply, cache=cache)
        replies[cache] = [chat.reply(turn) for turn in CHAT]
    out = {}
    for cache, texts in replies.items():
        same = sum(a == b for a, b in zip(texts, replies["f32"]))
        prefix = [next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
                  for a, b in zip(texts, replies["f32"])]
        out[cache] = {"identical_replies": same, "replies": len(CHAT),
                      "chars_before_divergence": sum(prefix),
                      "chars": sum(len(t) for t in replies["f32"]),
                      "last_reply": texts[-1]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT)
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--ctx", type=int, default=512, help="perplexity's chunk")
    ap.add_argument("--context", type=int, default=8192, help="generate up to this many tokens")
    ap.add_argument("--decode", type=int, default=1000, help="tokens timed before --context")
    ap.add_argument("--min-time", type=float, default=2.0)
    ap.add_argument("--max-reply", type=int, default=200)
    ap.add_argument("--threads", default="1,2", help="thread counts for generate")
    ap.add_argument("--caches", default=",".join(CACHES), help="cache types for generate and perplexity")
    ap.add_argument("--only", choices=("decode", "generate", "perplexity", "chat"), action="append")
    a = ap.parse_args()
    parts = a.only or ["decode", "generate", "perplexity", "chat"]
    res = {"cpu": cpu_name(), "model": os.path.basename(a.model),
           "llama_cpp_python": llama_cpp.__version__}
    if "decode" in parts:
        res["decode"] = decode_fractions(a.min_time)
    if "generate" in parts:
        res["generate"] = {"context": a.context, "decode": a.decode, "rows": []}
        for threads in (int(t) for t in a.threads.split(",")):
            for cache in a.caches.split(","):
                q = qkv_generate(a.model, threads, cache, a.context, a.decode)
                ll = llama_generate(a.model, threads, cache, a.context, a.decode)
                res["generate"]["rows"].append({"threads": threads, "cache": cache, "qkv": q,
                                                "llama_cpp": ll})
                print(json.dumps(res["generate"]["rows"][-1]), file=sys.stderr)
    if "perplexity" in parts:
        res["perplexity"] = {"text": a.text, "ctx": a.ctx, "rows": []}
        for cache in a.caches.split(","):
            r = qkv_json(["perplexity", "--model", a.model, "--text", a.text, "--ctx", str(a.ctx),
                          "--cache", cache, "--threads", "2"])
            res["perplexity"]["rows"].append({
                "cache": cache, "qkv": r["perplexity"], "tokens": r["tokens"], "chunks": r["chunks"],
                "scored": r["scored"], "llama_cpp": llama_perplexity(a.model, a.text, a.ctx, cache)})
            print(json.dumps(res["perplexity"]["rows"][-1]), file=sys.stderr)
    if "chat" in parts:
        res["chat"] = {"turns": len(CHAT), "max_reply": a.max_reply,
                       "caches": chat_agreement(a.model, a.max_reply)}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
