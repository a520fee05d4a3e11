#!/usr/bin/env python3
"""qkv's attention against PyTorch's, on the same shapes, in the same run.

For each shape it runs `qkv bench attention ... --json` (which measures the fp32 FMA peak of
the SIMD target that ran and the read bandwidth in the same process) and then times PyTorch on
the same shape and thread count, taking PyTorch's fastest CPU path of the ones it has: its
scaled_dot_product_attention (whose CPU kernel is a flash attention, forward and backward, in
PyTorch 2; torch.nn.functional._scaled_dot_product_attention in 1.13) and the explicit
softmax(q kᵀ / √d + mask) v in matmuls. FLOPs are counted the same way for both.

Run it with the Python that has the PyTorch to compare with: the newest from PyPI is the peer
(`python3 -m venv /opt/peer && /opt/peer/bin/pip install torch numpy`); Debian's 1.13
(/usr/bin/python3) works too.

  PY=/opt/peer/bin/python
  $PY bench/compare_torch.py                          # a table of the CPU pages in docs/benchmarks/
  $PY bench/compare_torch.py --target avx2            # qkv's AVX2 code, PyTorch's AVX2 code
  $PY bench/compare_torch.py --seq 2048 --dim 128 --causal --threads 2
  $PY bench/compare_torch.py --quick                  # a few shapes
  $PY bench/compare_torch.py --units                  # bf16 on the bf16 units beside fp32

--target runs qkv on that SIMD target (qkv --target) and PyTorch at the same level
(ATEN_CPU_CAPABILITY for ATen's kernels, MKL_ENABLE_INSTRUCTIONS and ONEDNN_MAX_CPU_ISA for
the GEMMs below them), so that an AVX-512 machine can stand in for an AVX2-only one. Prints one markdown row per shape (and the JSON with --json).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QKV = os.path.join(ROOT, "build", "release", "qkv")


def qkv_bench(shape, threads, min_time, target):
    cmd = [QKV, "bench", "attention", "--batch", "1", "--heads", str(shape["heads"]),
           "--seq", str(shape["seq"]), "--dim", str(shape["dim"]), "--threads", str(threads),
           "--min-time", str(min_time), "--no-reference", "--json"]
    if shape.get("queries"):
        cmd += ["--queries", str(shape["queries"])]
    if shape.get("kv_heads"):
        cmd += ["--kv-heads", str(shape["kv_heads"])]
    if shape["causal"]:
        cmd.append("--causal")
    if shape.get("window"):
        cmd += ["--window", str(shape["window"])]
    if shape.get("kv_len"):
        cmd += ["--kv-len", str(shape["kv_len"])]
    if shape["backward"]:
        cmd.append("--backward")
    if target:
        cmd += ["--target", target]
    cmd += ["--dtype", shape.get("dtype") or "fp32"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def torch_time(shape, threads, min_time):
    """Median seconds of PyTorch's fastest path, and which path that was."""
    torch.set_num_threads(threads)
    H, T, D = shape["heads"], shape["seq"], shape["dim"]
    Tq = shape.get("queries") or T
    Hkv = shape.get("kv_heads") or H
    g = torch.Generator().manual_seed(1)
    q = torch.rand(1, H, Tq, D, generator=g) * 2 - 1
    k = torch.rand(1, Hkv, T, D, generator=g) * 2 - 1
    v = torch.rand(1, Hkv, T, D, generator=g) * 2 - 1
    new_sdpa = hasattr(F, "scaled_dot_product_attention")
    gqa = Hkv != H and new_sdpa and "enable_gqa" in F.scaled_dot_product_attention.__doc__
    if Hkv != H and not gqa:  # PyTorch 1.13 has no GQA: expand the shared heads
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    causal = shape["causal"]
    window, kv_len = shape.get("window"), shape.get("kv_len")
    # Bottom-right aligned masks, as qkv's (True = attend).
    keep = None
    if causal or window or kv_len:
        pos = torch.arange(Tq).view(Tq, 1) + (T - Tq)
        j = torch.arange(T).view(1, T)
        keep = torch.ones(Tq, T, dtype=torch.bool)
        if causal:
            keep &= j <= pos
        if window:
            keep &= j >= pos - window
        if kv_len:
            keep &= j < kv_len
    backward = shape["backward"]
    if backward:
        q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    dout = torch.rand(1, H, Tq, D, generator=g)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
        shape.get("dtype") or "fp32"]
    q, k, v, dout = (x.detach().to(dtype).requires_grad_(x.requires_grad) for x in (q, k, v, dout))

    plain_causal = causal and Tq == T and not window and not kv_len

    def sdpa():
        if new_sdpa:
            extra = {"enable_gqa": True} if gqa else {}
            if plain_causal:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, **extra)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, **extra)
        if plain_causal:
            out, _ = F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)
        else:
            out, _ = F._scaled_dot_product_attention(q, k, v, keep, 0.0, False, False)
        return out

    additive = None
    if keep is not None:
        additive = torch.zeros(Tq, T, dtype=dtype).masked_fill(~keep, float("-inf"))

    kx = k.repeat_interleave(H // Hkv, dim=1) if gqa else k
    vx = v.repeat_interleave(H // Hkv, dim=1) if gqa else v

    def matmuls():
        s = torch.matmul(q, kx.transpose(-1, -2)) * (1 / math.sqrt(D))
        if additive is not None:
            s = s + additive
        return torch.matmul(torch.softmax(s, dim=-1), vx)

    best = None
    for name, fn in (("sdpa", sdpa), ("matmul+softmax", matmuls)):
        def run():
            out = fn()
            if backward:
                out.backward(dout)
                q.grad = k.grad = v.grad = None
        run()  # warm up
        times = []
        start = time.perf_counter()
        while len(times) < 2 or (time.perf_counter() - start < min_time and len(times) < 50):
            t0 = time.perf_counter()
            with torch.set_grad_enabled(backward):
                run()
            times.append(time.perf_counter() - t0)
        times.sort()
        median = times[len(times) // 2]
        if best is None or median < best[0]:
            best = (median, name)
    return best


def row(shape, threads, min_time, target):
    r = qkv_bench(shape, threads, min_time, target)
    torch_s, path = torch_time(shape, threads, min_time)
    flops = r["gflops"] * r["ms"] / 1e3 * 1e9  # the same FLOP count for PyTorch
    torch_gflops = flops / torch_s / 1e9
    r.update({"torch_ms": torch_s * 1e3, "torch_gflops": torch_gflops, "torch_path": path,
              "ratio_to_torch": torch_s * 1e3 / r["ms"], "torch": torch.__version__,
              "torch_capability": torch.backends.cpu.get_cpu_capability()
              if hasattr(torch.backends, "cpu") else "default"})
    return r


def mask_text(r):
    text = "yes" if r["causal"] else "no"
    if r.get("window", -1) >= 0:
        text += f", window {r['window']}"
    if r.get("kv_len", r["seq"]) < r["seq"]:
        text += f", kv_len {r['kv_len']}"
    return text


def peak_text(r):
    """The fraction of the fp32 FMA peak, and of the bf16 dot peak where the target has one."""
    text = f"{100 * r['fraction_of_peak']:.0f}%"
    if r.get("fraction_of_bf16_peak") is not None:
        text += f" (bf16 dot: {100 * r['fraction_of_bf16_peak']:.0f}%)"
    return text


def markdown(r):
    kind = "decode" if r["queries"] == 1 else ("fwd+bwd" if r["backward"] else "fwd")
    return (f"| {r['target']} | {r.get('dtype', 'fp32')} | {kind} | {r['heads']}/{r['kv_heads']} | {r['queries']} | {r['seq']} | {r['dim']} "
            f"| {mask_text(r)} | {r['threads']} | {r['ms']:.2f} "
            f"| {r['gflops']:.0f} | {peak_text(r)} "
            f"| {r['kv_gbps']:.1f} ({100 * r['fraction_of_read']:.0f}%) "
            f"| {r['torch_ms']:.2f} ({r['torch_path']}) | {r['ratio_to_torch']:.1f}x |")


HEADER = ("| target | dtype | kind | Hq/Hkv | Tq | Tk | D | mask | threads | qkv ms | qkv GFLOP/s "
          "| of FMA peak | K+V GB/s (of read loop) | PyTorch ms (path) | qkv speed-up |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def table_shapes(quick):
    seqs = [512, 2048] if quick else [512, 2048, 8192]
    shapes = []
    for backward in (False, True):
        for dim in (64, 128):
            for seq in seqs:
                for causal in (False, True):
                    shapes.append(dict(heads=8, seq=seq, dim=dim, causal=causal,
                                       backward=backward))
    for seq in ([1024, 32768] if quick else [1024, 4096, 32768]):
        shapes.append(dict(heads=8, seq=seq, dim=128, causal=False, backward=False, queries=1))
    # Decoding with the GQA groups of Llama-style models: 4 and 8 query rows per kv head.
    for heads, kv_heads in ((32, 8), (64, 8)):
        shapes.append(dict(heads=heads, kv_heads=kv_heads, seq=32768, dim=128, causal=False,
                           backward=False, queries=1, threads=[2]))
    # bf16 and fp16 (q, k, v, out and the gradients) against PyTorch in the same dtype, beside
    # the fp32 rows above: the arithmetic is fp32 in qkv, half the bytes.
    for dtype in ("bf16", "fp16"):
        for backward in (False, True):
            for dim in (64, 128):
                for causal in (False, True):
                    shapes.append(dict(heads=8, seq=2048, dim=dim, causal=causal,
                                       backward=backward, threads=[2], dtype=dtype))
        for heads, kv_heads in ((8, 8), (32, 8), (64, 8)):
            shapes.append(dict(heads=heads, kv_heads=kv_heads, seq=32768, dim=128, causal=False,
                               backward=False, queries=1, threads=[2], dtype=dtype))
            # Where the bf16 units run decoding (avx512_bf16), the widening kernels beside them.
            if dtype == "bf16" and "avx512_bf16" in supported_targets():
                shapes.append(dict(shapes[-1], target="avx512_dl"))
    # The masks and GQA, against the plain forward of the same size (2 threads).
    for dim in (64, 128):
        for extra in (dict(causal=True, window=512), dict(causal=False, kv_len=1536),
                      dict(causal=False, kv_heads=2), dict(causal=True, kv_heads=2)):
            shapes.append(dict(heads=8, seq=2048, dim=dim, backward=False, threads=[2], **extra))
    return shapes


def units_shapes():
    """bf16 where the CPU's bf16 units run it (avx512_bf16), beside qkv's own fp32 on the same
    shape, 2 threads: the forward and forward + backward at dims 128 and 64 (causal too), and
    decoding over a 32k bf16 cache with 4, 8 and 16 query rows per kv head on the units and on
    the widening kernels (avx512_dl)."""
    shapes = []
    for backward, dim, causal in ((False, 128, False), (False, 64, False), (True, 128, False),
                                  (True, 128, True), (True, 64, False)):
        for dtype in ("bf16", "fp32"):
            shapes.append(dict(heads=8, seq=2048, dim=dim, causal=causal, backward=backward,
                               threads=[2], dtype=dtype))
    for heads in (32, 64, 128):
        for target in ("avx512_bf16", "avx512_dl"):
            shapes.append(dict(heads=heads, kv_heads=8, seq=32768, dim=128, causal=False,
                               backward=False, queries=1, threads=[2], dtype="bf16",
                               target=target))
    return shapes


def supported_targets():
    """The SIMD targets qkv runs on this CPU (from `qkv info --json`)."""
    global _supported
    if _supported is None:
        out = subprocess.run([QKV, "info", "--json"], capture_output=True, text=True, check=True)
        _supported = json.loads(out.stdout.strip().splitlines()[-1])["targets_supported"]
    return _supported


_supported = None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--queries", type=int)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--window", type=int, help="sliding window: keys at most N positions back")
    ap.add_argument("--kv-len", type=int, help="padding: only the first N keys count")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32",
                    help="of q, k, v, out (and the gradients), in qkv and in PyTorch")
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--units", action="store_true",
                    help="bf16 on the bf16 units beside fp32 (needs a CPU with AVX512-BF16)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--target", help="qkv's SIMD target (sse4, avx2, avx512, avx512_dl); "
                    "PyTorch runs at the matching ATEN_CPU_CAPABILITY")
    a = ap.parse_args()
    if a.target in ("avx2", "sse4"):  # read by PyTorch when it loads: set before the import
        # ATen's own kernels, and the GEMMs of MKL and oneDNN under them, at the same level.
        level = "AVX2" if a.target == "avx2" else "SSE4_2"
        os.environ["ATEN_CPU_CAPABILITY"] = "avx2" if a.target == "avx2" else "default"
        os.environ["MKL_ENABLE_INSTRUCTIONS"] = level
        os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2" if a.target == "avx2" else "SSE41"
    global torch, F
    import torch
    import torch.nn.functional as F
    if not os.path.exists(QKV):
        sys.exit(f"compare_torch.py: {QKV} is missing; run `make build` first")
    if a.units:
        if "avx512_bf16" not in supported_targets():
            sys.exit("compare_torch.py: --units needs the avx512_bf16 target, which this CPU "
                     "or build does not have (qkv info)")
        shapes = units_shapes()
    elif a.seq:
        shapes = [dict(heads=a.heads, kv_heads=a.kv_heads, seq=a.seq, dim=a.dim,
                       causal=a.causal, backward=a.backward, queries=a.queries,
                       window=a.window, kv_len=a.kv_len, dtype=a.dtype)]
    else:
        shapes = table_shapes(a.quick)
    cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?"
    print(f"PyTorch {torch.__version__} (CPU capability {cap}); {os.cpu_count()} cores; "
          f"{cpu_model()}")
    print(HEADER)
    for shape in shapes:
        for threads in shape.get("threads") or a.threads:
            r = row(shape, threads, a.min_time, shape.get("target") or a.target)
            print(markdown(r), flush=True)
            if a.json:
                print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
