#!/usr/bin/env python3
"""qkv's mask functions against PyTorch's FlexAttention on the CPU, in the same run.

For each mask (causal, a causal sliding window, documents of uneven lengths) and head dim it
times, with the same threads:
  - qkv's fixed option where there is one (--causal, --causal --window) and the same mask as a
    mask function (--mask), forward, and forward + backward (`qkv bench attention --json`);
  - PyTorch's flex_attention under torch.compile (its fastest CPU mode), fp32, the BlockMask
    made outside the timing, forward only (its CPU backward is not implemented), and its
    create_block_mask's time beside qkv's;
  - for forward + backward, the best PyTorch does with gradients on a CPU for an arbitrary mask:
    scaled_dot_product_attention with the mask materialised as a boolean [T, T].
The document mask's target is stated against the dense causal time times the fraction of the
causal pairs it leaves visible.

  PY=build/peer/bin/python
  $PY bench/flex_compare.py                  # 16 heads, seq 4096, dims 32, 64, 128, 2 threads
  $PY bench/flex_compare.py --seq 8192 --dims 64 --json
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QKV = os.path.join(ROOT, "build", "release", "qkv")


def documents(seq):
    """8 documents of uneven lengths adding up to seq."""
    shares = [1500, 700, 2100, 300, 1200, 900, 800, 692]  # of 8192
    lengths = [max(1, s * seq // 8192) for s in shares]
    lengths[-1] += seq - sum(lengths)
    return lengths


def masks(seq, window):
    docs = documents(seq)
    return [
        {"name": "causal", "fixed": ["--causal"], "text": "kv_idx <= q_idx",
         "torch": lambda b, h, q, kv: q >= kv},
        {"name": f"window {window}", "fixed": ["--causal", "--window", str(window - 1)],
         "text": f"kv_idx <= q_idx && q_idx - kv_idx < {window}",
         "torch": lambda b, h, q, kv: (q >= kv) & (q - kv < window)},
        {"name": "documents", "fixed": None, "documents": docs,
         "text": "doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx", "torch": None},
    ]


def qkv_run(args, heads, seq, dim, extra, backward):
    cmd = [QKV, "bench", "attention", "--heads", str(heads), "--seq", str(seq), "--dim", str(dim),
           "--threads", str(args.threads), "--min-time", str(args.min_time), "--no-reference",
           "--json"] + extra + (["--backward"] if backward else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def median_seconds(fn, min_time):
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def torch_side(args, heads, seq, dim, mask_mod, docs):
    import torch
    from torch.nn.attention import flex_attention as flex
    torch.set_num_threads(args.threads)
    if docs is not None:
        ids = torch.repeat_interleave(torch.arange(len(docs)), torch.tensor(docs))
        mask_mod = lambda b, h, q, kv: (ids[q] == ids[kv]) & (q >= kv)  # noqa: E731
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.rand(1, heads, seq, dim, generator=g) * 2 - 1 for _ in range(3))
    t0 = time.perf_counter()
    block_mask = flex.create_block_mask(mask_mod, None, None, seq, seq, device="cpu")
    build = time.perf_counter() - t0
    compiled = torch.compile(flex.flex_attention)
    mode = "compiled"
    try:
        forward = median_seconds(lambda: compiled(q, k, v, block_mask=block_mask), args.min_time)
    except Exception as e:  # (torch.compile fails on some masks: say so, time eager mode)
        mode = f"compiling failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
        forward = median_seconds(lambda: flex.flex_attention(q, k, v, block_mask=block_mask),
                                 args.min_time)
    # Forward + backward: SDPA over the mask materialised.
    i = torch.arange(seq)
    keep = mask_mod(None, None, i.view(-1, 1), i.view(1, -1))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def train_step():
        out = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, attn_mask=keep)
        out.sum().backward()
    both = median_seconds(train_step, args.min_time)
    return {"flex_forward_ms": 1e3 * forward, "flex_mode": mode, "flex_block_mask_ms": 1e3 * build,
            "sdpa_bool_mask_forward_backward_ms": 1e3 * both, "torch": torch.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--dims", default="32,64,128")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--no-torch", action="store_true", help="qkv only")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for dim in (int(d) for d in args.dims.split(",")):
        causal_fwd = causal_both = None
        for m in masks(args.seq, args.window):
            extra = ["--mask", m["text"]]
            if m.get("documents"):
                extra += ["--documents", ",".join(str(n) for n in m["documents"])]
            row = {"mask": m["name"], "dim": dim, "heads": args.heads, "seq": args.seq,
                   "threads": args.threads}
            fn = qkv_run(args, args.heads, args.seq, dim, extra, False)
            fn_both = qkv_run(args, args.heads, args.seq, dim, extra, True)
            row.update(qkv_function_ms=fn["ms"], qkv_function_forward_backward_ms=fn_both["ms"],
                       qkv_block_mask_ms=fn["block_mask_ms"], block_mask_bytes=fn["block_mask_bytes"],
                       target=fn["target"], flops=fn["gflops"] * fn["ms"] * 1e6)
            if m["fixed"]:
                fx = qkv_run(args, args.heads, args.seq, dim, m["fixed"], False)
                fx_both = qkv_run(args, args.heads, args.seq, dim, m["fixed"], True)
                row.update(qkv_fixed_ms=fx["ms"], qkv_fixed_forward_backward_ms=fx_both["ms"])
                if m["name"] == "causal":
                    causal_fwd, causal_both = fx["ms"], fx_both["ms"]
                    causal_flops = row["flops"]
            elif causal_fwd:  # the document mask against causal × the fraction of pairs it keeps
                fraction = row["flops"] / causal_flops
                row.update(fraction_of_causal_pairs=fraction,
                           target_forward_ms=1.3 * causal_fwd * fraction,
                           target_forward_backward_ms=1.3 * causal_both * fraction)
            if not args.no_torch:
                row.update(torch_side(args, args.heads, args.seq, dim, m["torch"], m.get("documents")))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{args.heads} heads, seq {args.seq}, fp32, {args.threads} threads, qkv target "
          f"{rows[0]['target']}; PyTorch {rows[0].get('torch', '-')}")
    print("| mask | dim | qkv fixed option ms | qkv mask function ms | function / fixed | "
          "PyTorch flex (compiled) ms | qkv speed-up | BlockMask ms qkv / PyTorch | "
          "fwd+bwd qkv function ms | PyTorch SDPA + bool mask fwd+bwd ms | qkv speed-up |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def f(key, fmt="{:.2f}"):
            return fmt.format(r[key]) if key in r else "-"
        ratio = f"{r['qkv_function_ms'] / r['qkv_fixed_ms']:.2f}" if "qkv_fixed_ms" in r else (
            f"target {r['target_forward_ms']:.2f} ms" if "target_forward_ms" in r else "-")
        speed = f"{r['flex_forward_ms'] / r['qkv_function_ms']:.1f}x" if "flex_forward_ms" in r else "-"
        if r.get("flex_mode", "compiled") != "compiled":
            speed += " (PyTorch eager: " + r["flex_mode"] + ")"
        speed_both = (f"{r['sdpa_bool_mask_forward_backward_ms'] / r['qkv_function_forward_backward_ms']:.1f}x"
                      if "sdpa_bool_mask_forward_backward_ms" in r else "-")
        print(f"| {r['mask']} | {r['dim']} | {f('qkv_fixed_ms')} | {f('qkv_function_ms')} | {ratio} | "
              f"{f('flex_forward_ms')} | {speed} | {f('qkv_block_mask_ms')} / {f('flex_block_mask_ms')} | "
              f"{f('qkv_function_forward_backward_ms')} | {f('sdpa_bool_mask_forward_backward_ms')} | "
              f"{speed_both} |")


if __name__ == "__main__":
    main()
