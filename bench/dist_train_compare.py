#!/usr/bin/env python3
"""Parallel training against one process, in the same run: `qkv train --json` with all cores
in one process, then `mpirun -np P qkv train --json` data-parallel (plain and ZeRO-1) and
context-parallel on the same model, batches and steps. Prints tokens/s, the ratio to one
process, the share of the time spent exchanging gradients (not overlapped: it follows the
backward), and for the context-parallel run the ring's wait (and time in MPI progress calls) against its
transfers' time alone (the loopback bandwidth measured by `qkv bench ring`): the hidden fraction.

    python3 bench/dist_train_compare.py [--qkv build/release/qkv] [--ranks 2]
"""
import argparse
import json
import os
import subprocess
import tempfile

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def last_json(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--qkv", default="build/release/qkv")
    p.add_argument("--ranks", type=int, default=2)
    a = p.parse_args()
    P, qkv = a.ranks, a.qkv
    mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader", "-np", str(P)]
    cores = os.cpu_count()
    tmp = tempfile.mkdtemp()
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:  # bytes to train on: the repository's docs, repeated
        here = os.path.dirname(os.path.abspath(__file__))
        docs = "".join(open(os.path.join(here, "..", "docs", n)).read()
                       for n in ("kernels.md", "api.md", "dist.md"))
        f.write(docs * 4)
    loopback = last_json(mpirun + [qkv, "bench", "ring", "--json", "--seq", "2048"])
    beta = loopback["loopback_gbps"] * 1e9
    shapes = {
        "data-parallel (small, recall, batch 64)":
            (["train", "--size", "small", "--steps", "60", "--batch", "64", "--eval-every", "0"], []),
        "data-parallel + ZeRO-1 (same)":
            (["train", "--size", "small", "--steps", "60", "--batch", "64", "--eval-every", "0"], ["--zero1"]),
        "context-parallel (text, seq 4096, batch 2)":
            (["train", "--text", text, "--seq", "4096", "--batch", "2", "--steps", "6", "--eval-every", "0",
              "--d-model", "128", "--layers", "2", "--heads", "4"], ["--context-parallel"]),
    }
    print(f"{P} ranks x {max(1, cores // P)} thread(s) against one process with {cores} threads; "
          f"loopback {beta / 1e9:.1f} GB/s ({loopback['target']})")
    print("| run | one process tok/s | parallel tok/s | ratio | exchange share | ring wait + progress / transfers alone | hidden |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (args, extra) in shapes.items():
        ck = ["--checkpoint", os.path.join(tmp, "c.safetensors"), "--json", "--quiet"]
        one = last_json([qkv] + args + ck + ["--threads", str(cores)])
        par = last_json(mpirun + [qkv] + args + ck + extra)
        share = par["exchange_seconds"] / par["seconds"]
        ring, hidden = "", ""
        if "ring_bytes" in par:
            # The link as it is now (a VM's loopback moves 1-6 GB/s from minute to minute):
            # the training's own block size through bench ring, right after.
            link = last_json(mpirun + [qkv, "bench", "ring", "--json", "--batch", "2", "--heads", "4",
                                       "--dim", "32", "--seq", "4096", "--backward"])
            alone = par["ring_bytes"] / (link["bytes_sent_per_rank"] / (link["comm_alone_ms"] / 1e3))
            unhidden = par["ring_wait_seconds"] + par["ring_progress_seconds"]
            ring = f"{1e3 * unhidden:.1f} / {1e3 * alone:.1f} ms"
            hidden = f"{100 * max(0.0, 1 - unhidden / alone):.0f}%"
        print(f"| {name} | {one['tokens_per_s']:.0f} | {par['tokens_per_s']:.0f} "
              f"| {par['tokens_per_s'] / one['tokens_per_s']:.2f}x | {100 * share:.1f}% | {ring} | {hidden} |")
        if abs(par["final_loss"] - one["final_loss"]) > 1e-4 * abs(one["final_loss"]):
            print(f"  (final losses differ: {par['final_loss']} vs {one['final_loss']})")


if __name__ == "__main__":
    main()
