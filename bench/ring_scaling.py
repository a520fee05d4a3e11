#!/usr/bin/env python3
"""The scaling model of ring attention (docs/dist.md), held against measured loopback runs.

Runs `mpirun -np P qkv bench ring --json` over sequence lengths, fits the link (latency α and
bandwidth β of one ring hop, from the transfers timed alone) and the compute rate R (from the
ring's own kernel time), then predicts each run's unhidden wait and hidden fraction from

    per step:  t_compute = f · 4 · B · Hq · D · Tl² / R     (f = 1/2 causal zigzag, 1 full)
               t_link    = α + 8 · B · Hkv · Tl · D / β      (K and V of Tl positions, fp32)
    wait      = (P − 1) · max(0, t_link − t_compute)         (the last step sends nothing)

and prints predicted against measured. Then the model at 25 and 100 Gb/s: the shard length
Tl* = 2 · Hkv · R / (f · Hq · β) below which the link stops hiding, so the ranks P = L / Tl*
past which a context L stops scaling.

    python3 bench/ring_scaling.py [--qkv build/release/qkv] [--ranks 2] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys


def run(qkv, ranks, seq, causal, heads, dim, threads):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader", "-np", str(ranks), qkv,
           "bench", "ring", "--json", "--seq", str(seq), "--heads", str(heads), "--dim", str(dim),
           "--threads", str(threads), "--repeats", "7", "--min-time", "1"]
    if causal:
        cmd.append("--causal")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--qkv", default="build/release/qkv")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--seqs", default="64,128,256,512,1024,2048,4096,8192")
    p.add_argument("--json", help="write every run and the fit here")
    a = p.parse_args()
    P = a.ranks
    runs = [run(a.qkv, P, s, c, a.heads, a.dim, a.threads)
            for c in (False, True) for s in map(int, a.seqs.split(","))]

    # The link: hops timed alone, bytes per hop = 8·B·Hkv·Tl·D; least squares t = α + bytes/β.
    xs = [r["bytes_sent_per_rank"] / (P - 1) for r in runs]
    ys = [r["comm_alone_ms"] / 1e3 / (P - 1) for r in runs]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    beta = 1 / slope
    # The latency: the hop time of the smallest blocks, less their bytes' share.
    small = min(range(n), key=lambda i: xs[i])
    alpha = max(ys[small] - xs[small] / beta, 0.0)
    # The compute rate of one rank: its kernel time on the longest runs (flops it did / time).
    def rank_flops(r):
        Tl = r["seq"] / P
        f = 0.5 if r["causal"] else 1.0
        return f * 4 * r["batch"] * r["heads"] * r["dim"] * Tl * Tl * P  # P steps
    long_runs = [r for r in runs if r["seq"] == max(x["seq"] for x in runs)]
    R = sum(rank_flops(r) / (r["compute_ms_slowest_rank"] / 1e3) for r in long_runs) / len(long_runs)

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("Model name")), "?")
    print(f"CPU: {model}; {P} ranks x {a.threads} thread(s), target {runs[0]['target']}")
    print(f"fit: hop latency α = {alpha * 1e6:.1f} µs, loopback bandwidth β = {beta / 1e9:.2f} GB/s, "
          f"compute R = {R / 1e9:.1f} GFLOP/s per rank")
    print("(measured unhidden: the wait after each step's compute, plus the time inside MPI progress "
          "calls between kernels)")
    print("| mask | T | Tl | compute / step predicted (ms) | measured | link / step predicted (ms) | measured alone "
          "| unhidden predicted (ms) | measured | hidden predicted | measured | ring vs one process |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        Tl = r["seq"] // P
        f = 0.5 if r["causal"] else 1.0
        t_c = f * 4 * r["batch"] * r["heads"] * r["dim"] * Tl * Tl / R
        t_l = alpha + 8 * r["batch"] * r["kv_heads"] * Tl * r["dim"] / beta
        wait = (P - 1) * max(0.0, t_l - t_c)
        hidden = 1 - wait / ((P - 1) * t_l)
        print(f"| {'causal' if r['causal'] else 'full'} | {r['seq']} | {Tl} | {t_c * 1e3:.3f} "
              f"| {r['compute_ms_slowest_rank'] / P:.3f} | {t_l * 1e3:.3f} | {r['comm_alone_ms'] / (P - 1):.3f} "
              f"| {wait * 1e3:.3f} | {r['wait_ms'] + r['progress_ms']:.3f} | {100 * hidden:.0f}% "
              f"| {100 * r['hidden_fraction']:.0f}% | {r['speed_vs_one_process']:.2f}x |")

    # Past this machine: nodes of 64 cores each at this machine's per-core rate R.
    cores = 64
    Rn = cores * R
    print(f"\nPast this machine: nodes of {cores} cores at R = {R / 1e9:.0f} GFLOP/s per core "
          f"({Rn / 1e12:.1f} TFLOP/s per node); Tl* = 2 (Hkv/Hq) R / (f β):")
    for gbps in (25, 100):
        b = gbps / 8 * 1e9
        cells = []
        for f, mask in ((1.0, "full"), (0.5, "causal")):
            for g, heads in ((1, "MHA"), (4, "GQA 4:1")):
                cells.append(f"{mask} {heads} {2 * Rn / (g * f * b):.0f}")
        print(f"  {gbps} Gb/s: " + ", ".join(cells))
    # A GPT-2-small-shaped model (d 768, 12 layers, 12 heads of 64, vocab 50257) on 64 nodes.
    d, layers, heads, D, V, params = 768, 12, 12, 64, 50257, 124e6
    per_position = 4 * (layers * (11 * d + 2 * 4 * d) + (layers + 1) * d + 2 * V + 5 * d)
    print(f"  GPT-2-small shape: {per_position / 1e6:.2f} MB of activations per position in qkv; "
          "causal training step on 64 nodes:")
    for L in (2**17, 2**20, 2**22, 2**24):
        flops = 3.5 * 2 * L * L * D * heads * layers + 6 * params * L
        tl = L / 64
        hide25 = tl >= 2 * Rn / (0.5 * 25 / 8 * 1e9)
        print(f"    L = {L:>9,}: {tl:,.0f} positions and {tl * per_position / 1e9:.0f} GB per node, "
              f"{flops / (64 * Rn):,.0f} s per step, link {'hidden' if hide25 else 'NOT hidden'} at 25 Gb/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": runs, "alpha_s": alpha, "beta_Bps": beta, "R_flops": R, "cpu": model}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
