#!/usr/bin/env python3
"""qkv.attention from Python against `qkv bench attention` (C++), on the same shapes, in the
same run: what the Python layer costs (argument checks, array views, the GIL released).

Rounds alternate C++ and Python so that both see the same machine; each reports GFLOP/s from
the C++ benchmark's FLOP count and the median time of calls repeated for --min-time seconds.

  python3 bench/python_overhead.py                 # a table of the CPU pages in docs/benchmarks/
  python3 bench/python_overhead.py --rounds 5 --threads 1
Needs `pip install .` (the qkv package) and build/release/qkv.
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import numpy as np

import qkv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QKV = os.path.join(ROOT, "build", "release", "qkv")

SHAPES = [
    dict(seq=2048, dim=128, heads=8, causal=False, backward=False),
    dict(seq=2048, dim=128, heads=8, causal=True, backward=False),
    dict(seq=2048, dim=64, heads=8, causal=True, backward=False),
    dict(seq=2048, dim=128, heads=8, causal=True, backward=True),
]


def cpp(shape, threads, min_time):
    cmd = [QKV, "bench", "attention", "--seq", str(shape["seq"]), "--dim", str(shape["dim"]), "--heads",
           str(shape["heads"]), "--threads", str(threads), "--min-time", str(min_time), "--no-reference", "--json"]
    cmd += ["--causal"] * shape["causal"] + ["--backward"] * shape["backward"]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    return r["gflops"] * 1e9 * r["ms"] / 1e3, r["ms"] / 1e3, r  # FLOPs, seconds, the JSON


def python(shape, min_time):
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((1, shape["heads"], shape["seq"], shape["dim"]), dtype=np.float32)
                     for _ in range(4))
    out, lse = np.empty_like(q), np.empty((1, shape["heads"], shape["seq"]), np.float32)
    grads = [np.empty_like(q) for _ in range(3)]

    def call():
        qkv.attention(q, k, v, causal=shape["causal"], out=out, lse=lse, return_lse=True)
        if shape["backward"]:
            qkv.attention_backward(q, k, v, out, lse, dout, causal=shape["causal"], dq=grads[0], dk=grads[1],
                                   dv=grads[2])

    call()  # warm: scratch buffers, pages
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < min_time or len(times) < 3:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    qkv.set_num_threads(a.threads)
    print(f"qkv {qkv.__version__}, target {qkv.current_target()}, {a.threads} threads")
    print("| shape | C++ GFLOP/s | C++ fraction of FMA peak | Python GFLOP/s | Python / C++ |")
    print("| --- | ---: | ---: | ---: | ---: |")
    rows = []
    for shape in SHAPES:
        c_rates, p_rates, fractions = [], [], []
        for _ in range(a.rounds):
            flops, seconds, r = cpp(shape, a.threads, a.min_time)
            c_rates.append(flops / seconds / 1e9)
            fractions.append(r["fraction_of_peak"])
            p_rates.append(flops / python(shape, a.min_time) / 1e9)
        c, p = statistics.median(c_rates), statistics.median(p_rates)
        name = (f"seq {shape['seq']}, dim {shape['dim']}, {shape['heads']} heads"
                f"{', causal' if shape['causal'] else ''}{', fwd+bwd' if shape['backward'] else ''}")
        print(f"| {name} | {c:.1f} | {statistics.median(fractions):.2f} | {p:.1f} | {p / c:.3f} |", flush=True)
        rows.append(dict(shape=shape, cpp_gflops=c, python_gflops=p, ratio=p / c, target=r["target"]))
    if a.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
