#!/usr/bin/env python3
"""qkv against llama.cpp (through llama-cpp-python) on the same GGUF file, in one process:

  exactness  greedy continuations of held-out prompts, token for token; at the first
             divergence, both engines' top two logits there (a tie within the quantized
             arithmetic's error is reported as such); next-token top-1 agreement over every
             position of a corpus; each engine's logits against qkv's fp32 reference (the
             weights dequantized by the reference dequantizer).
  speed      prefill and decode tokens/s, same threads, rounds alternating between the two.

   pip install llama-cpp-python numpy && pip install .   (qkv's package)
   scripts/get-models && python3 bench/llama_cpp_compare.py --threads 2
"""
import argparse
import json
import os
import platform
import time

import numpy as np
import llama_cpp
import llama_cpp.llama_cpp as llama_cpp_c
from llama_cpp import Llama


def cpu_has_amx():
    with open("/proc/cpuinfo") as f:
        return " amx_int8" in f.read()


# On a CPU with AMX, llama.cpp runs its quantized products through its AMX kernels (an "extra
# buffer type"), which crashed (SIGSEGV in ggml_backend_amx_mul_mat, llama-cpp-python 0.3.36
# built with GGML_NATIVE) on the Sapphire Rapids-class VM measured: there llama.cpp is run
# without them (its model parameter use_extra_bufts off), its AVX-512 VNNI kernels instead.
LLAMA_CPP_EXTRA_BUFTS = not cpu_has_amx()
if not LLAMA_CPP_EXTRA_BUFTS:
    _default_model_params = llama_cpp_c.llama_model_default_params

    def _without_extra_bufts():
        p = _default_model_params()
        p.use_extra_bufts = False
        return p

    llama_cpp_c.llama_model_default_params = _without_extra_bufts

import qkv

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "..", "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

# Held out: written for this comparison, not taken from any test.
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "To make a cup of tea, first",
    "The three primary colors are",
    "def fibonacci(n):",
    "Photosynthesis is the process by which",
    "In 1969, the first humans",
    "The quick brown fox",
    "A good way to learn a new language is",
    "Water boils at a temperature of",
    "The largest planet in our solar system is",
    "Here is a list of fruits: apple, banana,",
    "The meaning of the word 'ephemeral' is",
    "My favourite book is",
    "The function of the heart is to",
    "import numpy as np\nx = np.",
]
CHAT = ["What is the capital of Japan?", "Give me three tips for sleeping better.",
        "Write a short poem about autumn.", "Explain what a transformer is in one paragraph."]


def chatml(user):
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


class LlamaCpp:
    # logits_all: every position's logits (the exactness checks); the speed runs use a model
    # without it, which computes the head for the last position only, as qkv does.
    # (Without logits_all, llama-cpp-python keeps n_batch rows of scores, indexed by position:
    # a prompt and its continuation must fit in n_batch.)
    def __init__(self, path, threads, ctx, logits_all=True, n_batch=512):
        self.m = Llama(model_path=path, n_ctx=ctx, n_threads=threads, n_threads_batch=threads, n_batch=n_batch,
                       logits_all=logits_all, verbose=False)

    def tokenize(self, text):
        return self.m.tokenize(text.encode(), add_bos=False, special=True)

    def logits(self, ids):
        self.m.reset()
        self.m.eval(ids)
        return np.array(self.m.scores[: len(ids)], dtype=np.float64)

    def greedy(self, ids, n):
        self.m.reset()
        self.m.eval(ids)
        out = []
        for _ in range(n):
            t = int(np.argmax(self.m.scores[self.m.n_tokens - 1]))
            if t == self.m.token_eos():
                break
            out.append(t)
            self.m.eval([t])
        return out

    def timed(self, ids, n):
        """(prefill seconds, decode seconds for n − 1 tokens after the first)."""
        self.m.reset()
        t0 = time.perf_counter()
        self.m.eval(ids)
        t1 = time.perf_counter()
        t = int(np.argmax(self.m.scores[self.m.n_tokens - 1]))
        for _ in range(n - 1):
            self.m.eval([t])
            t = int(np.argmax(self.m.scores[self.m.n_tokens - 1]))
        return t1 - t0, time.perf_counter() - t1


def qkv_greedy(model, ids, n):
    return list(model.tokens(ids, max_tokens=n, temperature=0))


def qkv_timed(model, ids, n):
    gen = iter(model.tokens(ids, max_tokens=n, temperature=0))
    t0 = time.perf_counter()
    next(gen)  # the prompt's forward (prefill), and the first token drawn
    t1 = time.perf_counter()
    for _ in range(n - 1):
        next(gen)
    return t1 - t0, time.perf_counter() - t1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prefill", type=int, default=128)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    qkv.set_num_threads(a.threads)
    ref = qkv.load_gguf(a.model, dequantize=True)
    q = qkv.load_gguf(a.model)
    ll = LlamaCpp(a.model, a.threads, 2048)
    tok = q.tokenizer
    res = {"cpu": cpu_name(), "threads": a.threads, "model": os.path.basename(a.model),
           "llama_cpp_python": llama_cpp.__version__}

    # Tokenizers agree first (else nothing below compares like with like).
    texts = PROMPTS + [chatml(c) for c in CHAT]
    mismatched = [t for t in texts if tok.encode(t, False, True) != ll.tokenize(t)]
    res["tokenizer_mismatches"] = len(mismatched)

    # Greedy continuations.
    greedy = []
    for text in texts:
        ids = tok.encode(text, False, True)
        a_ids, b_ids = qkv_greedy(q, ids, a.tokens), ll.greedy(ids, a.tokens)
        n = min(len(a_ids), len(b_ids))
        same = next((i for i in range(n) if a_ids[i] != b_ids[i]), n)
        case = {"prompt": text[-60:], "agree": same, "qkv_len": len(a_ids), "llama_len": len(b_ids)}
        if same < n or len(a_ids) != len(b_ids):
            ctx = ids + a_ids[:same]
            lq = q.logits(ctx)[-1].astype(np.float64)
            lr = ref.logits(ctx)[-1].astype(np.float64)
            ll_l = ll.logits(ctx)[-1]
            def gap(l):
                top = np.argsort(l)[::-1][:2]
                return [int(top[0]), int(top[1]), float(l[top[0]] - l[top[1]])]
            case.update({"qkv_top2": gap(lq), "fp32_top2": gap(lr), "llama_top2": gap(ll_l),
                         "llama_minus_fp32_max": float(np.max(np.abs(ll_l - lr)))})
        greedy.append(case)
    res["greedy"] = greedy

    # Top-1 over every position, and logits against the fp32 reference.
    agree = total = 0
    err_q, err_l = [], []
    for text in texts:
        ids = tok.encode(text, False, True)
        lq, lr, ll_l = q.logits(ids).astype(np.float64), ref.logits(ids).astype(np.float64), ll.logits(ids)
        agree += int(np.sum(np.argmax(lq, 1) == np.argmax(ll_l, 1)))
        total += len(ids)
        scale = np.max(np.abs(lr))
        err_q.append(float(np.max(np.abs(lq - lr)) / scale))
        err_l.append(float(np.max(np.abs(ll_l - lr)) / scale))
    res["top1_agreement"] = [agree, total]
    res["max_rel_error_vs_fp32"] = {"qkv": max(err_q), "llama_cpp": max(err_l)}

    # Speed: alternating rounds, the best of each.
    del ll
    ll = LlamaCpp(a.model, a.threads, 2048, logits_all=False)
    prompt = (tok.encode(" ".join(PROMPTS) * 8, False, True))[: a.prefill]
    best = {"qkv": [1e9, 1e9], "llama_cpp": [1e9, 1e9]}
    for _ in range(a.rounds):
        for name, fn in (("qkv", lambda: qkv_timed(q, prompt, a.decode)), ("llama_cpp", lambda: ll.timed(prompt, a.decode))):
            p, d = fn()
            best[name] = [min(best[name][0], p), min(best[name][1], d)]
    speed = {}
    for name, (p, d) in best.items():
        speed[name] = {"prefill_tokens_per_s": len(prompt) / p, "decode_tokens_per_s": (a.decode - 1) / d}
    speed["ratio_prefill"] = speed["qkv"]["prefill_tokens_per_s"] / speed["llama_cpp"]["prefill_tokens_per_s"]
    speed["ratio_decode"] = speed["qkv"]["decode_tokens_per_s"] / speed["llama_cpp"]["decode_tokens_per_s"]
    res["speed"] = speed
    res["prefill_tokens"], res["decode_tokens"] = len(prompt), a.decode

    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
