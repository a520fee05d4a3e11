#!/usr/bin/python3
"""Training throughput: qkv against PyTorch on the same model, in the same script.

For each shape and thread count it runs `qkv bench train ... --json`, then the same
GPT-2-style model written with torch ops (LayerNorm, GELU, learned positions, biases, tied
embeddings; torch.optim.AdamW; cross-entropy) in a child process, so that each side's peak
memory is its own. FLOPs per token are counted the same way for both (6 · parameters plus
causal attention), and MFU divides by the FMA peak qkv measured in the same run.

  /usr/bin/python3 bench/compare_torch_train.py            # a table of the CPU pages in docs/benchmarks/
  /usr/bin/python3 bench/compare_torch_train.py --quick    # the small shape only
  /usr/bin/python3 bench/compare_torch_train.py --dtype bf16
        # mixed precision only: qkv's `--dtype bf16` against PyTorch's autocast to bf16 (both
        # keep fp32 weights and AdamW state); the default runs fp32 and bf16

  /usr/bin/python3 bench/compare_torch_train.py --torch-tuned
        # PyTorch with glibc huge pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1) and OpenBLAS's
        # AVX-512 kernels (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset) — for its process only.
"""
import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QKV = os.path.join(ROOT, "build", "release", "qkv")

SHAPES = [
    dict(name="256x4", d_model=256, layers=4, heads=4, context=256, batch=8, vocab=50257),
    dict(name="gpt2-small", d_model=768, layers=12, heads=12, context=1024, batch=1, vocab=50257),
]



def causal_sdpa(q, k, v):
    """PyTorch's fused causal attention: scaled_dot_product_attention (PyTorch 2), or the
    private function of 1.13 that preceded it."""
    import torch.nn.functional as F
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)[0]


def torch_worker(shape, threads, steps, dtype):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    C, L, H, T, B, V = (shape[k] for k in ("d_model", "layers", "heads", "context", "batch", "vocab"))
    P = torch.nn.ParameterDict()
    n = lambda *s: torch.nn.Parameter(torch.randn(*s) * 0.02)
    z = lambda *s: torch.nn.Parameter(torch.zeros(*s))
    o = lambda *s: torch.nn.Parameter(torch.ones(*s))
    P["wte"], P["wpe"] = n(V, C), n(T, C)
    for l in range(L):
        P[f"ln1w{l}"], P[f"ln1b{l}"] = o(C), z(C)
        P[f"qkvw{l}"], P[f"qkvb{l}"] = n(3 * C, C), z(3 * C)
        P[f"ow{l}"], P[f"ob{l}"] = n(C, C), z(C)
        P[f"ln2w{l}"], P[f"ln2b{l}"] = o(C), z(C)
        P[f"fcw{l}"], P[f"fcb{l}"] = n(4 * C, C), z(4 * C)
        P[f"pw{l}"], P[f"pb{l}"] = n(C, 4 * C), z(C)
    P["lnfw"], P["lnfb"] = o(C), z(C)
    tokens = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def forward():
        x = P["wte"][tokens] + P["wpe"][:T]
        for l in range(L):
            h = F.layer_norm(x, (C,), P[f"ln1w{l}"], P[f"ln1b{l}"])
            q, k, v = F.linear(h, P[f"qkvw{l}"], P[f"qkvb{l}"]).split(C, dim=-1)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            att = causal_sdpa(q, k, v)
            x = x + F.linear(att.transpose(1, 2).reshape(B, T, C), P[f"ow{l}"], P[f"ob{l}"])
            h = F.layer_norm(x, (C,), P[f"ln2w{l}"], P[f"ln2b{l}"])
            x = x + F.linear(F.gelu(F.linear(h, P[f"fcw{l}"], P[f"fcb{l}"]), approximate="tanh"),
                             P[f"pw{l}"], P[f"pb{l}"])
        x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"])
        return F.cross_entropy((x @ P["wte"].T).view(B * T, V), targets.view(-1))

    opt = torch.optim.AdamW(P.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = forward()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(P.parameters(), 1.0)
        opt.step()

    step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    params = sum(p.numel() for p in P.values())
    print(json.dumps({"ms_per_step": times[len(times) // 2] * 1e3, "parameters": params,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "torch": torch.__version__}))


def run_torch(shape, threads, steps, dtype, env=None):
    out = subprocess.run([sys.executable, __file__, "--torch-worker", json.dumps(shape),
                          str(threads), str(steps), dtype], check=True, capture_output=True,
                         text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_qkv(shape, threads, steps, dtype):
    cmd = [QKV, "bench", "train", "--json", "--threads", str(threads), "--steps", str(steps),
           "--dtype", dtype]
    for k in ("d_model", "layers", "heads", "context", "batch", "vocab"):
        cmd += ["--" + k.replace("_", "-"), str(shape[k])]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-worker":
        return torch_worker(json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                            sys.argv[5])
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--torch-tuned", action="store_true")
    ap.add_argument("--dtype", nargs="*", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    a = ap.parse_args()
    env = None
    if a.torch_tuned:
        env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
    shapes = SHAPES[:1] if a.quick else SHAPES
    print("| model | dtype | threads | qkv tokens/s | qkv MFU | qkv RSS MB | PyTorch tokens/s "
          "| PyTorch MFU | PyTorch RSS MB | qkv speed-up | qkv bf16 / qkv fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    gemm = None
    for shape in shapes:
        for threads in a.threads:
            fp32_tps = None
            for dtype in a.dtype:
                q = run_qkv(shape, threads, a.steps, dtype)
                t = run_torch(shape, threads, a.steps, dtype, env)
                gemm = q.get("gemm")
                tokens = shape["batch"] * shape["context"]
                t_tps = tokens / (t["ms_per_step"] / 1e3)
                # MFU against the fp32 FMA peak for both dtypes (bf16 work in fp32 FLOPs).
                t_mfu = t_tps * q["flops_per_token"] / (q["peak_gflops"] * 1e9)
                if dtype == "fp32":
                    fp32_tps = q["tokens_per_s"]
                gain = (f"{q['tokens_per_s'] / fp32_tps:.2f}x"
                        if dtype == "bf16" and fp32_tps else "")
                print(f"| {shape['name']} ({q['parameters'] / 1e6:.1f}M) | {dtype} | {threads} "
                      f"| {q['tokens_per_s']:.0f} | {100 * q['mfu']:.0f}% | {q['peak_rss_mb']:.0f} "
                      f"| {t_tps:.0f} | {100 * t_mfu:.0f}% | {t['peak_rss_mb']:.0f} "
                      f"| {q['tokens_per_s'] / t_tps:.2f}x | {gain} |", flush=True)
    print(f"\nqkv's products: {gemm}. PyTorch's bf16 rows run under torch.autocast('cpu', "
          "dtype=torch.bfloat16). MFU divides by the fp32 FMA peak for both dtypes.")


if __name__ == "__main__":
    main()
