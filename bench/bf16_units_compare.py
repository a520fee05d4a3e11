#!/usr/bin/env python3
"""bf16 attention on the unit the CPU-feature registry chooses against the bf16 dot unit forced
(QKV_UNITS=bf16=bf16_dot), beside fp32 and PyTorch's bf16 scaled_dot_product_attention in the
same run; then decoding over 32k caches of every type. What decides a row of the registry's
table (src/simd/cpu.cpp); its figures belong on the CPU pages (docs/benchmarks/).

usage: bench/bf16_units_compare.py QKV_CLI [THREADS]   (torch optional: its rows are skipped)
"""
import json, os, statistics, subprocess, sys, time

cli = sys.argv[1]
th = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
H, T, D = 16, 2048, 128
DOT = {"QKV_UNITS": "bf16=bf16_dot"}


def run(args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([cli] + args, capture_output=True, text=True, env=e)
    return r.stdout.strip() if r.returncode == 0 else "ERROR " + r.stderr.strip()[-300:]


def bench(args, env=None):
    out = run(["bench", "attention", "--threads", str(th), "--min-time", "0.5", "--no-reference",
               "--json"] + args, env)
    return {"error": out} if out.startswith("ERROR") else json.loads(out.splitlines()[-1])


print(run(["info", "--threads", str(th)]).rsplit("\n", 1)[0], flush=True)
base = ["--batch", "1", "--heads", str(H), "--seq", str(T), "--dim", str(D)]
for extra, label in (([], "fwd"), (["--backward"], "fwd+bwd")):
    for name, dtype, env in (("fp32", "fp32", None), ("bf16 table", "bf16", None),
                             ("bf16 dot unit", "bf16", DOT)):
        j = bench(base + ["--dtype", dtype] + extra, env)
        print(json.dumps({"case": f"{name} {label}", "target": j.get("target"), "ms": j.get("ms"),
                          "gflops": j.get("gflops"), "err": j.get("error")}), flush=True)
try:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(th)
    for bwd in (False, True):
        q, k, v = (torch.randn(1, H, T, D, dtype=torch.bfloat16, requires_grad=bwd) for _ in range(3))
        g = torch.randn(1, H, T, D, dtype=torch.bfloat16)

        def once():
            o = F.scaled_dot_product_attention(q, k, v)
            if bwd:
                o.backward(g)
        once(), once()
        ts, end = [], time.perf_counter() + 0.7
        while time.perf_counter() < end or len(ts) < 3:
            t0 = time.perf_counter()
            once()
            ts.append(time.perf_counter() - t0)
        ms = statistics.median(ts) * 1e3
        print(json.dumps({"case": "torch bf16 " + ("fwd+bwd" if bwd else "fwd"), "ms": ms,
                          "gflops": 4 * H * T * T * D * (3.5 if bwd else 1) / ms / 1e6,
                          "torch": torch.__version__}), flush=True)
except ImportError as e:
    print("torch:", e)
dec = ["--batch", "1", "--heads", "32", "--kv-heads", "8", "--queries", "1", "--seq", "32768",
       "--dim", str(D)]
for label, cache, env in (("bf16 table", "bf16", None), ("bf16 dot unit", "bf16", DOT),
                          ("f32", "f32", None), ("q8_0", "q8_0", None), ("q4_0", "q4_0", None),
                          ("q4_1", "q4_1", None)):
    j = bench(dec + ["--cache", cache], env)
    print(json.dumps({"case": "decode 32/8 32k " + label, "ms": j.get("ms"), "kv_gbps": j.get("kv_gbps"),
                      "frac_read": j.get("fraction_of_read"), "err": j.get("error")}), flush=True)
