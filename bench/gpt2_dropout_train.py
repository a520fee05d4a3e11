#!/usr/bin/env python3
"""Training Hugging Face transformers' GPT-2 (its default configuration: 124M parameters,
attention, residual and embedding dropout 0.1) with qkv's SDPA drop-in as its attention, against
the same model on PyTorch's own SDPA, in the same run.

Three runs from the same initial weights over the same batches (bytes of docs/*.md, as token ids):
  torch A, torch B   attn_implementation "sdpa" (PyTorch's SDPA, which runs dropout on its math
                     path on a CPU), with different dropout seeds: their gap is the noise that
                     dropout's randomness alone makes;
  qkv                the attention function registered as "qkv": qkv.torch's
                     scaled_dot_product_attention (dropout in qkv's tiled kernels).
It reports each run's loss curve, the mean |qkv − torch A| against the mean |torch B − torch A|
over the steps (the loss curves agree within noise when the first is not larger than about the
second), and the median time of a step (forward, backward, AdamW) of each.

Needs transformers and the newest torch from PyPI (never in CI):
  PYTHONPATH=build/python build/peer/bin/python bench/gpt2_dropout_train.py --steps 20 --seq 256
  … --batch 4 --threads 2 --json
"""
import argparse
import glob
import json
import os
import statistics
import sys
import time

import torch
import transformers
from transformers import AttentionInterface, GPT2Config, GPT2LMHeadModel

import qkv
import qkv.torch as qt


def qkv_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                  is_causal=None, **kwargs):
    """transformers' attention interface over qkv's SDPA drop-in (query [B, H, T, D])."""
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(is_causal) and attention_mask is None and query.shape[2] > 1
    out = qt.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                          dropout_p=dropout, scale=scaling, is_causal=is_causal,
                                          enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def batches(steps, batch, seq, seed):
    """Token ids [batch, seq + 1] per step: byte windows of the project's docs."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs")
    text = b"".join(open(p, "rb").read() for p in sorted(glob.glob(os.path.join(root, "*.md"))))
    data = torch.tensor(list(text), dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - seq - 1, (steps, batch), generator=g)
    return [torch.stack([data[s:s + seq + 1] for s in row]) for row in starts]


def run(implementation, initial, data, dropout_seed, lr):
    model = GPT2LMHeadModel(GPT2Config())
    model.load_state_dict(initial)
    model.set_attn_implementation(implementation)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(dropout_seed)  # every dropout mask, torch's and qkv's seeds
    losses, seconds = [], []
    for tokens in data:
        start = time.perf_counter()
        out = model(input_ids=tokens[:, :-1], labels=tokens[:, :-1])
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
        losses.append(out.loss.item())
    return losses, seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    qkv.set_num_threads(args.threads)
    AttentionInterface.register("qkv", qkv_attention)
    config = GPT2Config()
    torch.manual_seed(0)
    initial = GPT2LMHeadModel(config).state_dict()
    data = batches(args.steps, args.batch, args.seq, seed=1)
    runs = {}
    for name, implementation, seed in (("torch A", "sdpa", 10), ("qkv", "qkv", 20),
                                       ("torch B", "sdpa", 30)):
        runs[name] = run(implementation, initial, data, seed, args.lr)
        if not args.json:
            losses, seconds = runs[name]
            print(f"{name:8s} losses " + " ".join(f"{l:.3f}" for l in losses))
            print(f"{'':8s} median step {statistics.median(seconds):.2f} s")
            sys.stdout.flush()
    gap = lambda a, b: statistics.mean(abs(x - y) for x, y in zip(runs[a][0], runs[b][0]))
    step = {name: statistics.median(r[1][1:] or r[1]) for name, r in runs.items()}
    summary = {
        "steps": args.steps, "batch": args.batch, "seq": args.seq, "threads": args.threads,
        "dropout": {"attn": config.attn_pdrop, "resid": config.resid_pdrop, "embd": config.embd_pdrop},
        "losses": {name: r[0] for name, r in runs.items()},
        "mean_gap_qkv_torch": gap("qkv", "torch A"), "mean_gap_torch_torch": gap("torch B", "torch A"),
        "median_step_s": step, "speedup": min(step["torch A"], step["torch B"]) / step["qkv"],
        "torch": torch.__version__, "transformers": transformers.__version__,
        "qkv": qkv.__version__,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"mean |qkv − torch A| {summary['mean_gap_qkv_torch']:.4f}, mean |torch B − torch A| "
              f"{summary['mean_gap_torch_torch']:.4f} (the noise); step time qkv "
              f"{step['qkv']:.2f} s, torch {step['torch A']:.2f} and {step['torch B']:.2f} s "
              f"({summary['speedup']:.2f}× faster)")


if __name__ == "__main__":
    main()
