#!/usr/bin/env python3
"""qkv's score functions against qkv's fixed options and PyTorch on the CPU, in the same run.

For each score function (ALiBi with learned slopes, tanh softcap, T5's bucketed relative bias,
a 2-D relative bias over an image grid) it times, with the same threads, fp32, warm (the first
calls untimed):
  - qkv.torch.flex_attention with the score_mod, forward, and forward + backward (the
    learnable tensors' gradients included);
  - the same scores on qkv's fixed option where there is one: softcap, alibi, or the scores
    given as a materialised additive bias [H, T, T] (qkv.torch.attention);
  - PyTorch's flex_attention under torch.compile (its fastest CPU mode), forward;
  - for forward + backward, the best PyTorch does with gradients of a learnable score on a
    CPU: its math path over the materialised scores (score_mod applied to q kᵀ, softmax, · v).
Targets: the function within 15% of the fixed option (ALiBi, softcap, dim 64), T5's within 25%
of the materialised bias (dim 32), forward ≥ 2× compiled flex, forward + backward ≥ 3× the
math path.

  PYTHONPATH=build/python build/peer/bin/python bench/score_compare.py
  … --heads 8 --seq 2048 --dims 32,64 --threads 2 --json
"""
import argparse
import json
import math
import sys
import time

import torch

import qkv
import qkv.torch as qt


def functions(H, T):
    """(name, score_mod, learnable tensors, fixed-option kwargs of qkv.torch.attention or None)."""
    g = torch.Generator().manual_seed(3)
    slopes = torch.tensor([2 ** (-8 * (h + 1) / H) for h in range(H)], requires_grad=True)
    buckets = qt.relative_buckets(T, T)
    rel = (torch.randn(H, 32, generator=g) * 0.5).requires_grad_()
    W = 64
    R = T // W
    grid = (torch.randn(H, 2 * R - 1, 2 * W - 1, generator=g) * 0.5).requires_grad_()

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    def softcap(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / 30.0) * 30.0

    def t5(score, b, h, q_idx, kv_idx):
        return score + rel[h, buckets[q_idx - kv_idx + (T - 1)]]

    def grid_2d(score, b, h, q_idx, kv_idx):
        return score + grid[h, q_idx // W - kv_idx // W + (R - 1), q_idx % W - kv_idx % W + (W - 1)]

    i = torch.arange(T)
    t5_bias = rel.detach()[:, buckets[i.view(-1, 1) - i.view(1, -1) + (T - 1)].long()]
    return [("alibi (learned slopes)", alibi, [slopes], {"alibi": slopes.detach()}),
            ("softcap 30", softcap, [], {"softcap": 30.0}),
            ("T5 relative bias", t5, [rel], {"bias": t5_bias.contiguous()}),
            ("2-D relative bias", grid_2d, [grid], None)]


def median_seconds(fn, min_time):
    fn()
    fn()  # warm: no first touches timed
    times = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def materialised(q, k, v, score_mod):
    B, H, L, D = q.shape
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    grids = (torch.arange(B).view(-1, 1, 1, 1), torch.arange(H).view(1, -1, 1, 1),
             torch.arange(L).view(1, 1, -1, 1), torch.arange(L).view(1, 1, 1, -1))
    return torch.softmax(score_mod(s, *grids), dim=-1) @ v


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--dims", default="32,64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--no-torch", action="store_true", help="qkv only")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    qkv.set_num_threads(args.threads)
    H, T = args.heads, args.seq
    rows = []
    for dim in (int(d) for d in args.dims.split(",")):
        g = torch.Generator().manual_seed(1)
        q, k, v = (torch.rand(1, H, T, dim, generator=g) * 2 - 1 for _ in range(3))
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        for name, fn, params, fixed in functions(H, T):
            row = {"function": name, "dim": dim, "heads": H, "seq": T, "threads": args.threads}
            with torch.no_grad():
                row["qkv_function_ms"] = 1e3 * median_seconds(
                    lambda: qt.flex_attention(q, k, v, score_mod=fn), args.min_time)

            def qkv_step():
                qt.flex_attention(qg, kg, vg, score_mod=fn).sum().backward()
            row["qkv_function_forward_backward_ms"] = 1e3 * median_seconds(qkv_step, args.min_time)
            if fixed is not None:
                with torch.no_grad():
                    row["qkv_fixed_ms"] = 1e3 * median_seconds(
                        lambda: qt.attention(q, k, v, **fixed), args.min_time)
            if not args.no_torch:
                from torch.nn.attention import flex_attention as flex
                compiled = torch.compile(flex.flex_attention)
                try:
                    with torch.no_grad():
                        row["flex_forward_ms"] = 1e3 * median_seconds(
                            lambda: compiled(q, k, v, score_mod=fn), args.min_time)
                    row["flex_mode"] = "compiled"
                except Exception as e:  # (say so, time eager mode)
                    row["flex_mode"] = f"compiling failed ({type(e).__name__})"
                    with torch.no_grad():
                        row["flex_forward_ms"] = 1e3 * median_seconds(
                            lambda: flex.flex_attention(q, k, v, score_mod=fn), args.min_time)

                def math_step():
                    materialised(qg, kg, vg, fn).sum().backward()
                row["math_forward_backward_ms"] = 1e3 * median_seconds(math_step, args.min_time)
                row["torch"] = torch.__version__
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"batch 1, {H} heads, seq {T}, fp32, {args.threads} threads; PyTorch "
          f"{rows[0].get('torch', '-')}")
    print("| function | dim | qkv function ms | qkv fixed option ms | function / fixed | "
          "PyTorch flex (compiled) ms | qkv speed-up | fwd+bwd qkv ms | PyTorch math path ms | "
          "qkv speed-up |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def f(key):
            return f"{r[key]:.1f}" if key in r else "-"
        ratio = f"{r['qkv_function_ms'] / r['qkv_fixed_ms']:.2f}" if "qkv_fixed_ms" in r else "-"
        speed = f"{r['flex_forward_ms'] / r['qkv_function_ms']:.1f}x" if "flex_forward_ms" in r else "-"
        if r.get("flex_mode", "compiled") != "compiled":
            speed += f" ({r['flex_mode']})"
        both = (f"{r['math_forward_backward_ms'] / r['qkv_function_forward_backward_ms']:.1f}x"
                if "math_forward_backward_ms" in r else "-")
        print(f"| {r['function']} | {r['dim']} | {f('qkv_function_ms')} | {f('qkv_fixed_ms')} | "
              f"{ratio} | {f('flex_forward_ms')} | {speed} | "
              f"{f('qkv_function_forward_backward_ms')} | {f('math_forward_backward_ms')} | {both} |")


if __name__ == "__main__":
    main()
