#!/usr/bin/env python3
"""Two builds of qkv, interleaved in one run: every attention row below with build A, then B,
round after round, so that both see the same phases of the machine (memory bandwidth in these
VMs jumps between phases). Prints each row's median and best ms for A and B and B's speed-up.
With --generate, the rows are `qkv bench generate` on the models named instead: each model's
prefill (ms for the prompt) and decoding (ms per token), with exact products and, for
block-format weights, int8 ones.

usage: bench/ab_compare.py A/qkv B/qkv [--rounds 5] [--threads 2] [--quick]
       bench/ab_compare.py A/qkv B/qkv --generate MODEL.gguf ... [--prompt 128]
"""
import argparse, json, statistics, subprocess

COMMON = ["--no-reference", "--json", "--min-time", "0.3"]
# (label, arguments): the forward, forward + backward, and decoding rows of the benchmark pages,
# and decoding over every cache type at 8, 32 and 64 query heads per 8 key/value heads.
ROWS = [
    ("fwd fp32 8/8 T2048 causal", ["--heads", "8", "--seq", "2048", "--dim", "128", "--causal"]),
    ("fwd bf16 8/8 T2048 causal",
     ["--heads", "8", "--seq", "2048", "--dim", "128", "--causal", "--dtype", "bf16"]),
    ("fwd+bwd fp32 8/8 T512", ["--heads", "8", "--seq", "512", "--dim", "128", "--backward"]),
]
for hq in (8, 32, 64):
    for cache in ("f32", "bf16", "f16", "q8_0", "q4_0", "q4_1"):
        ROWS.append((f"decode {hq}/8 32k {cache}",
                     ["--heads", str(hq), "--kv-heads", "8", "--queries", "1", "--seq", "32768",
                      "--dim", "128", "--cache", cache]))
ROWS.append(("decode 8/8 4k head dim 8 (keys in lanes)",
             ["--heads", "8", "--queries", "1", "--seq", "4096", "--dim", "8"]))


def run(cli, args, threads):
    cmd = [cli, "bench", "attention", "--threads", str(threads)] + COMMON + args
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["ms"]


# Weights whose products have an int8 mode (the block formats).
INT8_FORMATS = ("q8_0", "q4_0", "q4_1", "q4_k", "q6_k")


def generate_rows(models, prompt):
    """(label, arguments) per model and products mode; each run gives two rows' times."""
    rows = []
    for model in models:
        name = model.rsplit("/", 1)[-1]
        modes = ["exact"] + (["int8"] if any(f in name.lower() for f in INT8_FORMATS) else [])
        for mode in modes:
            rows.append((f"{name} {mode}",
                         ["--model", model, "--matmul", mode, "--prompt", str(prompt),
                          "--cache-lengths", "256", "--decode", "16", "--repeats", "2"]))
    return rows


def run_generate(cli, args, threads):
    cmd = [cli, "bench", "generate", "--threads", str(threads), "--json"] + args
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["prefill_ms"], r["decode"][0]["ms_per_token"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="decoding rows at 8/8 and 32/8 only")
    p.add_argument("--generate", nargs="+", metavar="MODEL", help="models for generate rows")
    p.add_argument("--prompt", type=int, default=128, help="prefill length of the generate rows")
    o = p.parse_args()
    if o.generate:
        runs = generate_rows(o.generate, o.prompt)
        labels = [f"{label} {part}" for label, _ in runs for part in ("prefill", "decode")]
    else:
        runs = [r for r in ROWS if not o.quick or "64/8" not in r[0]]
        labels = [label for label, _ in runs]
    times = {label: ([], []) for label in labels}
    for _ in range(o.rounds):
        for label, args in runs:
            for side, cli in enumerate((o.a, o.b)):
                if o.generate:
                    prefill, decode = run_generate(cli, args, o.threads)
                    times[f"{label} prefill"][side].append(prefill)
                    times[f"{label} decode"][side].append(decode)
                else:
                    times[label][side].append(run(cli, args, o.threads))
    print(f"| row | A ms (median, best) | B ms (median, best) | B speed-up (median, best) |")
    print("|---|---|---|---|")
    for label in labels:
        a, b = (statistics.median(t) for t in times[label])
        a1, b1 = (min(t) for t in times[label])
        print(f"| {label} | {a:.3f}, {a1:.3f} | {b:.3f}, {b1:.3f} | {a / b:.3f}x, {a1 / b1:.3f}x |")


if __name__ == "__main__":
    main()
