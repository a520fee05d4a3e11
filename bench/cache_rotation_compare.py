#!/usr/bin/env python3
"""What a quantized key/value cache costs in perplexity, with and without its rotation, in qkv
and in llama.cpp, in one run: SmolLM2-135M on a text no test reads, llama-perplexity's windows.

  qkv        `qkv perplexity --cache T --cache-rotation on|off`, its weight products exact (fp32
             activations: the cache's cost alone; --matmul int8 for llama.cpp's arithmetic, whose
             rounding moves a perplexity by a few tenths of a percent either way)
  llama.cpp  its llama-perplexity binary (-fa on, -ctk T -ctv T), with its rotation (the
             default for a quantized cache whose head dim is a multiple of 64) and with
             LLAMA_ATTN_ROT_DISABLE=1; built in scratch space outside the repository

Then the rotation's cost in speed: `qkv bench attention --queries 1 --seq 32768 --dim 128
--kv-heads 8 --cache T --cache-rotation on|off` (the timed call rotating the queries and the
outputs back), the two interleaved round by round, medians.

Prints markdown tables (each cache's perplexity and its rise over the same program's f32 cache;
the decode times) and, with --json, the rows.

  bench/cache_rotation_compare.py --llama-perplexity /path/to/llama.cpp/build/bin/llama-perplexity
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QKV = os.path.join(ROOT, "build", "release", "qkv")
MODEL = os.path.join(ROOT, "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
TEXT = "/usr/share/common-licenses/GPL-3"  # English prose no test of qkv reads
CACHES = ("f32", "q8_0", "q4_1", "q4_0")


def qkv_perplexity(cache, rotation, ctx, threads, matmul):
    out = subprocess.run([QKV, "perplexity", "--model", MODEL, "--text", TEXT, "--ctx", str(ctx),
                          "--matmul", matmul, "--cache", cache, "--cache-rotation", rotation,
                          "--threads", str(threads), "--json"],
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["perplexity"], r["cache_rotation"], r["chunks"]


def llama_perplexity(binary, cache, rotate, ctx, threads):
    env = dict(os.environ)
    if not rotate:
        env["LLAMA_ATTN_ROT_DISABLE"] = "1"
    r = subprocess.run([binary, "-m", MODEL, "-f", TEXT, "-c", str(ctx), "-b", str(ctx), "-fa", "on",
                        "-ctk", cache, "-ctv", cache, "-t", str(threads)],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"llama-perplexity failed:\n{r.stderr[-2000:]}")
    log = r.stdout + r.stderr
    ppl = re.search(r"Final estimate: PPL = ([\d.]+)", log)
    rot = re.search(r"attn_rot_k = (\d)", log)
    chunks = re.search(r"calculating perplexity over (\d+) chunks", log)
    return float(ppl.group(1)), (rot.group(1) == "1") if rot else None, \
        int(chunks.group(1)) if chunks else None


def decode_ms(cache, rotation, heads, threads):
    out = subprocess.run([QKV, "bench", "attention", "--heads", str(heads), "--kv-heads", "8",
                          "--queries", "1", "--seq", "32768", "--dim", "128", "--cache", cache,
                          "--cache-rotation", rotation, "--threads", str(threads),
                          "--no-reference", "--min-time", "0.3", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["ms"]


def decode_rows(threads, rounds):
    rows = []
    for heads in (8, 32):
        for cache in ("q8_0", "q4_0"):
            times = {"on": [], "off": []}
            for _ in range(rounds):
                for rotation in ("off", "on"):
                    times[rotation].append(decode_ms(cache, rotation, heads, threads))
            off, on = (statistics.median(times[r]) for r in ("off", "on"))
            rows.append({"heads": heads, "kv_heads": 8, "cache": cache, "ms_off": off, "ms_on": on})
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def cpu_name():
    info = json.loads(subprocess.run([QKV, "info", "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    return f"{info['cpu']} ({info['cpu_id']})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-perplexity", required=True, help="llama.cpp's llama-perplexity binary")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--matmul", default="exact", choices=("exact", "int8"))
    ap.add_argument("--rounds", type=int, default=5, help="decode: interleaved rounds")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for cache in CACHES:
        for rotate in (False, True):
            q, q_rot, q_chunks = qkv_perplexity(cache, "on" if rotate else "off", a.ctx, a.threads,
                                                    a.matmul)
            ll, ll_rot, ll_chunks = llama_perplexity(a.llama_perplexity, cache, rotate, a.ctx,
                                                     a.threads)
            rows.append({"cache": cache, "rotation_asked": rotate, "qkv": q, "qkv_rotation": q_rot,
                         "llama_cpp": ll, "llama_cpp_rotation": ll_rot, "qkv_chunks": q_chunks,
                         "llama_cpp_chunks": ll_chunks})
            print(json.dumps(rows[-1]), file=sys.stderr)
    decode = decode_rows(a.threads, a.rounds)
    base = {(r["cache"], r["rotation_asked"]): r for r in rows}
    f32 = base[("f32", False)]
    if a.json:
        print(json.dumps({"cpu": cpu_name(), "ctx": a.ctx, "text": TEXT, "matmul": a.matmul,
                          "rows": rows, "decode": decode}))
        return
    print(f"SmolLM2-135M-Instruct (Q4_1 weights), {os.path.basename(TEXT)}, windows of {a.ctx}, "
          f"qkv's weight products {a.matmul}, {cpu_name()}")
    print()
    print("| cache | rotation | qkv perplexity | qkv vs f32 | llama.cpp perplexity | llama.cpp vs f32 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        rot = "on" if r["rotation_asked"] else "off"
        ll_note = "" if r["llama_cpp_rotation"] is None or r["llama_cpp_rotation"] == r["rotation_asked"] \
            else " (rotation " + ("on" if r["llama_cpp_rotation"] else "off") + ")"
        print(f"| {r['cache']} | {rot} | {r['qkv']:.3f} | {100 * (r['qkv'] / f32['qkv'] - 1):+.2f}% | "
              f"{r['llama_cpp']:.3f}{ll_note} | "
              f"{100 * (r['llama_cpp'] / f32['llama_cpp'] - 1):+.2f}% |")
    print()
    print("| heads | cache | ms, rotation off | ms, rotation on | on / off |")
    print("|---|---|---:|---:|---:|")
    for d in decode:
        print(f"| {d['heads']}/{d['kv_heads']} | {d['cache']} | {d['ms_off']:.2f} | "
              f"{d['ms_on']:.2f} | {d['ms_on'] / d['ms_off']:.3f} |")


if __name__ == "__main__":
    main()
