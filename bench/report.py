#!/usr/bin/env python3
"""Runs qkv beside its peers and writes docs/benchmarks.md.

Every table comes from one run of this script on one machine: the CPU, the date, the versions
and the yardsticks (the fp32 FMA peak of the SIMD target in use and the read bandwidth, from
`qkv info`, measured in the same run) head the page; each benchmark divides by its own
yardsticks measured in its own process. A peer that is not there is skipped, and the page says
so.

The peers:
  PyTorch         the newest from PyPI in a virtual environment (--peer-python; `--setup`
                  makes build/peer with torch, llama-cpp-python, numpy and qkv itself); without
                  it, Debian's PyTorch 1.13 (/usr/bin/python3), named as such.
  llama.cpp       llama-cpp-python in the peer's Python, on SmolLM2's GGUF (scripts/get-models).
  ggml            --ggml PATH: ggml's test-backend-ops, built in scratch space outside the
                  repository; its FLASH_ATTN_EXT decoding cases beside qkv's on the same shapes.
  llama2.c        --llama2c PATH: llama2.c's run.c built in scratch space; stories260K, greedy.
  llama-perplexity  --llama-perplexity PATH: llama.cpp's, built in scratch space; quantized
                  caches' perplexity with and without its rotation, beside qkv's.

  make build && scripts/get-models
  bench/report.py --setup                 # once: build/peer (downloads PyTorch, builds llama.cpp)
  bench/report.py                          # every section (~30-40 minutes on 2 cores)
  bench/report.py --quick                  # fewer shapes (~10 minutes)
  bench/report.py --only attention,python  # some sections; the page keeps only those
  bench/report.py --only units --splice    # replace those sections in the page, keep the rest
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QKV = os.path.join(ROOT, "build", "release", "qkv")
PEER = os.path.join(ROOT, "build", "peer")
SMOLLM2 = os.path.join(ROOT, "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
STORIES = os.path.join(ROOT, "models", "stories260K")
SECTIONS = ["attention", "units", "training", "generation", "quantized", "kv_cache",
            "cache_rotation", "python",
            "mpi", "ggml", "llama2c"]


def run(cmd, timeout=3600, env=None):
    """stdout of `cmd`; raises with its stderr's tail when it fails."""
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-600:]}")
    return r.stdout


def python_has(py, module):
    return subprocess.run([py, "-c", f"import {module}"], capture_output=True).returncode == 0


def python_version_of(py, module):
    try:
        return run([py, "-c", f"import {module}; print({module}.__version__)"]).strip()
    except RuntimeError:
        return None


def setup():
    """build/peer: the newest PyTorch, llama-cpp-python (compiled for this CPU), NumPy and qkv."""
    py = os.path.join(PEER, "bin", "python")
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", PEER])
    pip = [py, "-m", "pip", "install", "-q"]
    subprocess.check_call(pip + ["--upgrade", "pip"])
    subprocess.check_call(pip + ["torch", "numpy"])
    subprocess.check_call(pip + ["llama-cpp-python"],
                          env=dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=ON"))
    subprocess.check_call(pip + [ROOT])
    print(f"report.py: peers installed in {PEER}")


def qkv_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(qkv VERSION ([\d.]+)", f.read()).group(1)


def machine(peer_py):
    info = json.loads(run([QKV, "info", "--json"]))
    gxx = run(["g++", "--version"]).splitlines()[0]
    versions = {"qkv": qkv_version(), "compiler": gxx}
    for name, module in (("PyTorch", "torch"), ("llama-cpp-python", "llama_cpp"),
                         ("NumPy", "numpy")):
        versions[name] = python_version_of(peer_py, module) or "not installed"
    mpirun = shutil.which("mpirun")
    if mpirun:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
        versions["Open MPI"] = (re.findall(r"[\d.]+", out.splitlines()[0]) or ["?"])[-1] if out else "?"
    return info, versions


def cpu_name():
    """The model name, and for AMD the family and model (lscpu's "AMD EPYC" alone does not say
    which Zen)."""
    fields = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if ":" in line:
                k, v = (x.strip() for x in line.split(":", 1))
                fields.setdefault(k, v)
            elif fields:
                break
    name = fields.get("model name", platform.processor() or "?")
    if fields.get("vendor_id") == "AuthenticAMD":
        family, model = int(fields.get("cpu family", 0)), int(fields.get("model", 0))
        zen3 = model < 0x10 or 0x20 <= model < 0x60  # family 25: Milan, Vermeer, Cezanne, …
        zen = {23: "Zen 1/2", 25: "Zen 3" if zen3 else "Zen 4", 26: "Zen 5"}.get(family, "?")
        name += f" (family {family}, model {model}: {zen})"
    flags = fields.get("flags", "").split()
    units = [u for u in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
             if u in flags]
    return name + (", " + " ".join(units) if units else "")


def header(info, versions, peer_py, quick):
    lines = [
        "# Benchmarks",
        "",
        "Written by `bench/report.py`, which runs qkv and its peers on one machine in one run; "
        "regenerate it with `bench/report.py` (after `make build`, `scripts/get-models` and, once, "
        "`bench/report.py --setup`). Why each kernel is built the way it is, and what was tried: "
        "[tuning.md](tuning.md).",
        "",
        f"- **CPU:** {cpu_name()}, {info['logical_cpus']} logical CPUs; SIMD target in use "
        f"`{info['target']}`; caches " + ", ".join(f"{c['name']} {c['size']}" for c in info["caches"]),
        f"- **Date:** {datetime.date.today().isoformat()}; {platform.platform()}",
        "- **Versions:** " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"- **Yardsticks, measured at the start of this run:** fp32 FMA peak "
        f"{info['fma_peak_gflops']:.1f} GFLOP/s ({info['threads']} threads, `{info['target']}`), read bandwidth {info['read_gbps']:.1f} GB/s. Each "
        "table's fractions divide by the yardsticks its own process measured beside it.",
        f"- **Peers' Python:** `{peer_py}`" + (" (Debian's PyTorch 1.13: `bench/report.py --setup` "
                                               "installs the newest)" if peer_py == "/usr/bin/python3" else ""),
    ]
    if quick:
        lines.append("- **`--quick`:** fewer shapes and rounds than the full report.")
    return "\n".join(lines) + "\n"


def section_attention(peer_py, quick, args):
    out = run([peer_py, "bench/compare_torch.py"] + (["--quick"] if quick else []))
    return ("## Attention and decoding\n\n"
            "`bench/compare_torch.py`: qkv's forward, forward + backward and one-query decoding against PyTorch's fastest "
            "CPU path on the same shape and threads (its scaled_dot_product_attention or the "
            "explicit softmax(q kᵀ/√d) v, whichever is faster). FLOPs count the visible "
            "(query, key) pairs; the backward counts 2.5 forwards. \"of FMA peak\" divides by the "
            "peak loop run after each round in the same process; decoding's \"K+V GB/s\" by a "
            "read loop over as many bytes.\n\n" + out)


def section_units(peer_py, quick, args):
    if "avx512_bf16" not in json.loads(run([QKV, "info", "--json"]))["targets_supported"]:
        return ("## bf16 on the bf16 units (`avx512_bf16`)\n\n"
                "Not measured: this CPU has no AVX512-BF16 (or the build lacks the target).\n")
    out = run([peer_py, "bench/compare_torch.py", "--units"])
    return ("## bf16 on the bf16 units (`avx512_bf16`)\n\n"
            "`bench/compare_torch.py --units`: qkv's bf16 kernels on the CPU's bf16 dot-product "
            "instruction (vdpbf16ps) beside qkv's own fp32 on the same shape and PyTorch's in the "
            "same dtype. \"of FMA peak\" divides by the fp32 FMA loop and \"bf16 dot\" by the "
            "vdpbf16ps loop, both measured in the same process. The decode rows show the units "
            "(`avx512_bf16`) and the widening kernels (`avx512_dl`) on the same bf16 cache.\n\n"
            + out)


def section_training(peer_py, quick, args):
    out = run([peer_py, "bench/compare_torch_train.py"] + (["--quick"] if quick else []))
    return ("## Training\n\n"
            "`bench/compare_torch_train.py`: one AdamW step of the same model in qkv (`qkv bench train`) and in PyTorch, tokens "
            "per second; MFU counts 6 × parameters + attention FLOPs per token against the FMA "
            "peak.\n\n" + out)


def section_generation(peer_py, quick, args):
    text = ["## Models: generation\n"]
    model = os.path.join(ROOT, "build", "report-r110m.bin")
    if not os.path.exists(model):
        run([QKV, "random-model", "-o", model, "--dim", "768", "--layers", "12", "--heads", "12"])
    models = [os.path.join(STORIES, "stories260K.bin"), model]
    out = run([peer_py, "bench/compare_torch_generate.py"] + models +
              (["--repeats", "1"] if quick else []))
    text.append("`bench/compare_torch_generate.py`: the same llama2.c checkpoint in qkv and in PyTorch (a KV cache in both, "
                "greedy); prefill's yardstick is the FMA peak, decode's a read loop over the "
                "weights' bytes.\n\n" + out)
    if not python_has(peer_py, "llama_cpp"):
        text.append("\n**llama.cpp:** not measured (llama-cpp-python is not installed in the peer's "
                    "Python: `bench/report.py --setup`).\n")
    elif not os.path.exists(SMOLLM2):
        text.append("\n**llama.cpp:** not measured (SmolLM2 missing: `scripts/get-models`).\n")
    else:
        r = json.loads(run([peer_py, "bench/llama_cpp_compare.py", "--rounds",
                            "2" if quick else "5"]))
        s = r["speed"]
        text.append(
            f"\n**Against llama.cpp** (llama-cpp-python {r['llama_cpp_python']}) on "
            f"{r['model']}, {r['threads']} threads, the best of alternating rounds: "
            f"{r['prefill_tokens']} prompt tokens, then {r['decode_tokens']} greedy ones.\n\n"
            "| phase | qkv tokens/s | llama.cpp tokens/s | qkv / llama.cpp |\n|---|---:|---:|---:|\n"
            f"| prefill | {s['qkv']['prefill_tokens_per_s']:,.0f} | "
            f"{s['llama_cpp']['prefill_tokens_per_s']:,.0f} | {s['ratio_prefill']:.2f}x |\n"
            f"| decode | {s['qkv']['decode_tokens_per_s']:,.0f} | "
            f"{s['llama_cpp']['decode_tokens_per_s']:,.0f} | {s['ratio_decode']:.2f}x |\n\n"
            f"Same tokens: the tokenizers disagree on {r['tokenizer_mismatches']} of the test "
            f"texts; top-1 tokens agree at {r['top1_agreement'][0]} of {r['top1_agreement'][1]} "
            f"positions; largest logit error against the fp32 forward, as a fraction of the "
            f"largest logit: qkv {r['max_rel_error_vs_fp32']['qkv']:.2e}, llama.cpp "
            f"{r['max_rel_error_vs_fp32']['llama_cpp']:.2e}.\n")
    return "\n".join(text)


def section_quantized(peer_py, quick, args):
    text = ["## Quantized weights: exact and int8 products\n"]
    if not python_has(peer_py, "llama_cpp") or not os.path.exists(SMOLLM2):
        text.append("Not measured: it needs llama-cpp-python in the peer's Python "
                    "(`bench/report.py --setup`) and SmolLM2 (`scripts/get-models`).\n")
        return "\n".join(text)
    r = json.loads(run([peer_py, "bench/quantized_compare.py", "--rounds", "2" if quick else "3"]))
    text.append(
        f"`bench/quantized_compare.py`: {r['model']} in qkv with fp32 activations (`--matmul exact`) "
        f"and with llama.cpp's arithmetic (`--matmul int8`: activations rounded to int8 blocks, "
        f"integer dot products), beside llama.cpp (llama-cpp-python {r['llama_cpp_python']}) on "
        f"the same file in the same process; tokens/s, the best of alternating rounds; prompts of "
        f"{r['prefill_short_tokens']} and {r['prefill_long_tokens']} tokens; decode after the long "
        f"prompt."
        + ("" if r.get("llama_cpp_amx", True) else
           " This CPU has AMX, and llama.cpp's AMX kernels crashed on it (SIGSEGV in "
           "`ggml_backend_amx_mul_mat`): llama.cpp ran without them (`use_extra_bufts` off), on "
           "its AVX-512 VNNI kernels.") + "\n")
    text.append("| threads | phase | qkv exact | qkv int8 | llama.cpp | int8 / llama.cpp |\n"
                "|---|---|---:|---:|---:|---:|")
    for threads, s in r["speed"].items():
        for key, name in (("decode_tokens_per_s", "decode"),
                          ("prefill_short_tokens_per_s", f"prefill {r['prefill_short_tokens']}"),
                          ("prefill_long_tokens_per_s", f"prefill {r['prefill_long_tokens']}")):
            e, i, l = s["qkv_exact"][key], s["qkv_int8"][key], s["llama_cpp"][key]
            text.append(f"| {threads} | {name} | {e:,.0f} | {i:,.0f} | {l:,.0f} | {i / l:.2f}x |")
    p = r["perplexity"]
    exact = p["qkv_exact"]["perplexity"]
    text.append(
        f"\nPerplexity on {r['text']} (the GNU GPL v3 from Debian's base-files; "
        f"{p['qkv_exact']['tokens']:,} tokens, {p['qkv_exact']['chunks']} chunks of {r['ctx']}, "
        f"{p['qkv_exact']['scored']:,} scored; `qkv perplexity`, and llama.cpp's logits in the same "
        f"windows):\n\n| | perplexity | against qkv exact |\n|---|---:|---:|")
    for name, label in (("qkv_exact", "qkv exact"), ("qkv_int8", "qkv int8"), ("llama_cpp", "llama.cpp")):
        v = p[name]["perplexity"]
        text.append(f"| {label} | {v:.4f} | {100 * (v / exact - 1):+.2f}% |")
    g = r["greedy_int8_vs_llama_cpp"]
    text.append(
        f"\nGreedy text of qkv int8 against llama.cpp on {g['prompts']} held-out prompts: "
        f"{g['identical']} identical; {g['tokens_before_divergence']} of {g['tokens']} tokens "
        f"before the first divergence of each.\n")
    text.append(
        "A 110M Llama shape (width 768, 12 layers, 32,000 tokens: `qkv random-model`, then "
        "`qkv quantize --type T`), decoding at a 16-token cache on 2 threads (`qkv bench "
        "generate`, the best of the rounds); the fraction divides the bytes a token reads (the "
        "file's tensors and the cache) per second by the read loop measured in the same "
        "process:\n\n| type | file | exact tok/s | of read | int8 tok/s | of read | "
        "int8 prefill 64 tok/s | exact prefill |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in r["shapes"]:
        e, i = s["exact"], s["int8"]
        text.append(f"| {s['type'].upper()} | {s['bytes'] / 2**20:.0f} MiB | {e['tokens_per_s']:.0f} | "
                    f"{e['fraction_of_read']:.0%} | {i['tokens_per_s']:.0f} | "
                    f"{i['fraction_of_read']:.0%} | {i['prefill_tokens_per_s']:.0f} | "
                    f"{e['prefill_tokens_per_s']:.0f} |")
    text.append("")
    return "\n".join(text)


def section_kv_cache(peer_py, quick, args):
    text = ["## Quantized KV caches\n"]
    if args.kv_cache_json:  # the output of an earlier bench/kv_cache_compare.py run
        with open(args.kv_cache_json, encoding="utf-8") as f:
            r = json.load(f)
    elif not python_has(peer_py, "llama_cpp") or not os.path.exists(SMOLLM2):
        text.append("Not measured: it needs llama-cpp-python in the peer's Python "
                    "(`bench/report.py --setup`) and SmolLM2 (`scripts/get-models`).\n")
        return "\n".join(text)
    else:
        r = json.loads(run([peer_py, "bench/kv_cache_compare.py"] +
                           (["--decode", "200", "--min-time", "0.5"] if quick else []), timeout=7200))
    text.append(
        "`bench/kv_cache_compare.py`: keys and values stored as fp32, fp16, or ggml's 32-value "
        "blocks (q8_0: 34 bytes per 32 values, q4_0: 18), read in place by every attention "
        "kernel.\n\n**Decoding over a 32k cache** (`qkv bench attention --queries 1 --seq 32768 "
        "--dim 128 --kv-heads 8 --cache T`, 2 threads): the cache's stored bytes per second "
        "against a read loop over the same bytes in the same process, and the arithmetic against "
        "the fp32 FMA peak (medians of 5 rounds):\n\n| heads | cache | ms | GB/s | of read | "
        "GFLOP/s | of FMA peak | vs f32 cache |\n|---|---|---:|---:|---:|---:|---:|---:|")
    f32_ms = {d["heads"]: d["ms"] for d in r["decode"] if d["cache"] == "f32"}
    for d in r["decode"]:
        text.append(f"| {d['heads']}/{d['kv_heads']} | {d['cache']} | {d['ms']:.2f} | "
                    f"{d['kv_gbps']:.1f} | {d['fraction_of_read']:.0%} | {d['gflops']:.0f} | "
                    f"{d['fraction_of_peak']:.0%} | {f32_ms[d['heads']] / d['ms']:.2f}x |")
    g = r["generate"]
    text.append(
        f"\n**SmolLM2 near its full context** ({r['model']}): tokens/s over the last "
        f"{g['decode']:,} tokens before position {g['context']:,} — the cache filled by a prompt, "
        f"then one token at a time; qkv's `qkv bench generate --matmul int8` (llama.cpp's "
        f"arithmetic for the weights) and llama.cpp (llama-cpp-python {r['llama_cpp_python']}, "
        f"flash attention on, `type_k` and `type_v` the same cache type), one after the other in "
        f"one run:\n\n| threads | cache | qkv tok/s | llama.cpp tok/s | qkv / llama.cpp |\n"
        f"|---|---|---:|---:|---:|")
    for row in g["rows"]:
        text.append(f"| {row['threads']} | {row['cache']} | {row['qkv']:.1f} | "
                    f"{row['llama_cpp']:.1f} | {row['qkv'] / row['llama_cpp']:.2f}x |")
    p = r["perplexity"]
    rows = {row["cache"]: row for row in p["rows"]}
    first = p["rows"][0]
    text.append(
        f"\n**Perplexity** on {p['text']} ({first['tokens']:,} tokens, {first['chunks']} chunks "
        f"of {p['ctx']}, {first['scored']:,} scored): `qkv perplexity --cache T` (fp32 "
        f"activations), and llama.cpp's logits with its cache in the same type, in the same "
        f"windows:\n\n| cache | qkv | against f32 | llama.cpp | against its f32 |\n"
        f"|---|---:|---:|---:|---:|")
    for cache, row in rows.items():
        text.append(f"| {cache} | {row['qkv']:.4f} | {100 * (row['qkv'] / rows['f32']['qkv'] - 1):+.2f}% | "
                    f"{row['llama_cpp']:.4f} | "
                    f"{100 * (row['llama_cpp'] / rows['f32']['llama_cpp'] - 1):+.2f}% |")
    c = r["chat"]
    text.append(
        f"\n**A long chat** ({c['turns']} turns, greedy, up to {c['max_reply']} tokens a reply, "
        f"each reply kept in the cache for the next turn; `qkv.Chat`): each cache's replies "
        f"against the f32 cache's:\n\n| cache | identical replies | characters before the "
        f"first divergence |\n|---|---:|---:|")
    for cache, s in c["caches"].items():
        text.append(f"| {cache} | {s['identical_replies']} of {s['replies']} | "
                    f"{s['chars_before_divergence']:,} of {s['chars']:,} |")
    text.append("")
    return "\n".join(text)


def section_python(peer_py, quick, args):
    if not python_has(peer_py, "qkv"):
        return ("## Python\n\nNot measured: qkv is not installed in the peer's Python "
                "(`bench/report.py --setup`).\n")
    out = run([peer_py, "bench/python_overhead.py"] + (["--rounds", "1"] if quick else []))
    return ("## Python\n\n"
            "`bench/python_overhead.py`: `qkv.attention` from Python against `qkv bench attention` (C++) on the same shapes in "
            "the same run: what the Python layer costs.\n\n" + out)


def section_mpi(peer_py, quick, args):
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return "## Beyond one machine: MPI\n\nNot measured: no mpirun (`make deps` installs Open MPI).\n"
    ring = []
    for seq in ([8192] if quick else [8192, 16384]):
        ring.append(json.loads(run([mpirun, "--bind-to", "none", "--oversubscribe", "-np",
                                    "2", QKV, "bench", "ring", "--seq", str(seq), "--causal",
                                    "--json"]).strip().splitlines()[-1]))
    rows = ["| T | ring ms | 1 process ms | ring ÷ 1 process | of ranks' FMA peak | hidden |",
            "|---:|---:|---:|---:|---:|---:|"]
    for r in ring:
        rows.append(f"| {r['seq']} | {r['ring_ms']:.0f} | {r['one_process_ms']:.0f} | "
                    f"{r['speed_vs_one_process']:.2f}x | {r['ring_fraction_of_peak']:.0%} | "
                    f"{r['hidden_fraction']:.0%} |")
    train = run([sys.executable, "bench/dist_train_compare.py", "--qkv", QKV])
    return ("## Beyond one machine: MPI\n\n"
            "`qkv bench ring`: ring attention on 2 ranks of one thread (Open MPI over shared memory) against one "
            "process with 2 threads, causal, 8 heads of 64; \"hidden\": the share of the ring's "
            "transfers that compute covered.\n\n" + "\n".join(rows) + "\n\n" +
            "`bench/dist_train_compare.py`: training on 2 ranks against one process:\n\n" + train)


def section_ggml(peer_py, quick, args):
    """ggml's own decoding cases (one query against an f16 cache, 8 kv heads, GQA 1 and 4) beside
    qkv's decoding of the same shape from an fp16 cache (the same bytes) and from an fp32 one,
    alternating, the best of each."""
    if not args.ggml:
        return ("## Decoding against ggml\n\nNot measured in this run: give `--ggml PATH` "
                "(ggml's `test-backend-ops`, built outside the repository).\n")
    kvs = "4096|16384" if quick else "4096|8192|16384"
    pattern = rf"hsk=(64|128),hsv=(64|128),nh=8,nr23=\[[14],1\],kv=({kvs}),nb=1,"
    case = re.compile(r"hsk=(\d+),hsv=\d+,nh=(\d+),nr23=\[(\d+),1\],kv=(\d+),nb=1,.*"
                      r"type_K=(\w+).*?(\d[\d.]*) us/run")
    ggml_us, qkv_us = {}, {"fp16": {}, "fp32": {}}
    for _ in range(2 if quick else 3):
        out = run([args.ggml, "perf", "-o", "FLASH_ATTN_EXT", "-b", "CPU", "-p", pattern],
                  timeout=3600)
        for line in out.splitlines():
            m = case.search(line)
            if not m:
                continue
            d, nh, nr, kv, kv_type, us = m.groups()
            key = (int(d), int(nh), int(nr), int(kv), kv_type)
            ggml_us[key] = min(ggml_us.get(key, 1e30), float(us))
        for key in ggml_us:
            d, nh, nr, kv, _ = key
            for dtype, best in qkv_us.items():
                r = json.loads(run([QKV, "bench", "attention", "--heads", str(nh * nr),
                                    "--kv-heads", str(nh), "--seq", str(kv), "--queries", "1",
                                    "--dim", str(d), "--dtype", dtype, "--min-time", "0.5",
                                    "--no-reference", "--json"]))
                best[key] = min(best.get(key, 1e30), r["ms"] * 1e3)
    if not ggml_us:
        raise RuntimeError("ggml printed no FLASH_ATTN_EXT decoding cases")
    rows = ["| head dim | query heads / kv heads | keys | ggml µs (cache) | qkv µs (fp16 cache) "
            "| qkv ÷ ggml time | qkv µs (fp32 cache) |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for key in sorted(ggml_us):
        d, nh, nr, kv, kv_type = key
        half, full = qkv_us["fp16"][key], qkv_us["fp32"][key]
        rows.append(f"| {d} | {nh * nr} / {nh} | {kv} | {ggml_us[key]:,.0f} ({kv_type}) | "
                    f"{half:,.0f} | {half / ggml_us[key]:.2f} | {full:,.0f} |")
    return ("## Decoding against ggml\n\n"
            "ggml's `test-backend-ops perf -o FLASH_ATTN_EXT -b CPU` decoding cases (one query "
            "row per query head, a mask, its default threads) and `qkv bench attention "
            "--queries 1 --dtype fp16` (q and the cache in fp16, the bytes ggml reads) on the "
            "same shapes, alternating, the best of each; below 1 qkv is faster. qkv from an fp32 "
            "cache (twice the bytes) beside it.\n\n"
            + "\n".join(rows) + "\n")


def section_cache_rotation(peer_py, quick, args):
    text = ["## Rotated quantized caches\n"]
    if args.cache_rotation_json:  # the output of an earlier bench/cache_rotation_compare.py --json
        with open(args.cache_rotation_json, encoding="utf-8") as f:
            r = json.load(f)
    elif not args.llama_perplexity or not os.path.exists(SMOLLM2):
        text.append("Not measured in this run: give `--llama-perplexity PATH` (llama.cpp's "
                    "`llama-perplexity`, built outside the repository) and get SmolLM2 "
                    "(`scripts/get-models`).\n")
        return "\n".join(text)
    else:
        r = json.loads(run([sys.executable, "bench/cache_rotation_compare.py", "--json",
                            "--llama-perplexity", args.llama_perplexity], timeout=7200))
    base = {(row["cache"], row["rotation_asked"]): row for row in r["rows"]}
    f32 = base[("f32", False)]
    text.append(
        f"`bench/cache_rotation_compare.py`: SmolLM2-135M-Instruct's perplexity on "
        f"{r['text']} in windows of {r['ctx']} (llama-perplexity's), each cache type with its "
        f"rows stored rotated (a normalised Walsh–Hadamard transform over the head dim, 64 "
        f"here) and not: `qkv perplexity --cache T --cache-rotation on|off` (weight products "
        f"{r['matmul']}) and llama.cpp's `llama-perplexity -fa on -ctk T -ctv T`, rotated by "
        f"default and not with `LLAMA_ATTN_ROT_DISABLE=1`, in one run. The rise of each over "
        f"the same program's f32 cache:\n\n"
        f"| cache | rotation | qkv | against f32 | llama.cpp | against its f32 |\n"
        f"|---|---|---:|---:|---:|---:|")
    for row in r["rows"]:
        text.append(f"| {row['cache']} | {'on' if row['rotation_asked'] else 'off'} | "
                    f"{row['qkv']:.3f} | {100 * (row['qkv'] / f32['qkv'] - 1):+.2f}% | "
                    f"{row['llama_cpp']:.3f} | "
                    f"{100 * (row['llama_cpp'] / f32['llama_cpp'] - 1):+.2f}% |")
    text.append(
        "\n**What it costs in speed**: decoding over a 32k cache (`qkv bench attention --queries 1 "
        "--seq 32768 --dim 128 --kv-heads 8 --cache T --cache-rotation off|on`, 2 threads; the "
        "timed call rotates the query and the output back), the two interleaved round by round, "
        "medians:\n\n| heads | cache | ms, rotation off | ms, rotation on | on / off |\n"
        "|---|---|---:|---:|---:|")
    for d in r["decode"]:
        text.append(f"| {d['heads']}/{d['kv_heads']} | {d['cache']} | {d['ms_off']:.2f} | "
                    f"{d['ms_on']:.2f} | {d['ms_on'] / d['ms_off']:.3f} |")
    text.append("")
    return "\n".join(text)


def section_llama2c(peer_py, quick, args):
    if not args.llama2c:
        return ("## llama2.c\n\nNot measured in this run: give `--llama2c PATH` (llama2.c's `run`, "
                "built from run.c outside the repository).\n")
    model, tok = os.path.join(STORIES, "stories260K.bin"), os.path.join(STORIES, "tok512.bin")
    best = {"run.c": 0.0, "qkv": 0.0}
    for _ in range(2 if quick else 5):
        out = subprocess.run([args.llama2c, model, "-z", tok, "-t", "0", "-n", "256", "-i",
                              "Once upon a time"], capture_output=True, text=True, cwd=ROOT)
        m = re.search(r"achieved tok/s: ([\d.]+)", out.stderr + out.stdout)
        best["run.c"] = max(best["run.c"], float(m.group(1)) if m else 0.0)
        out = subprocess.run([QKV, "generate", "--model", model, "--prompt", "Once upon a time",
                              "-n", "256", "--temperature", "0"], capture_output=True, text=True,
                             cwd=ROOT)
        m = re.search(r"decode: [\d,]+ tokens, [\d.]+ ms, ([\d,.]+) tokens/s", out.stderr)
        best["qkv"] = max(best["qkv"], float(m.group(1).replace(",", "")) if m else 0.0)
    return ("## llama2.c's run.c\n\nstories260K, greedy, 256 steps from \"Once upon a time\", the "
            "best of alternating runs (run.c's \"achieved tok/s\", qkv's decode rate):\n\n"
            "| run.c tokens/s | qkv tokens/s | qkv / run.c |\n|---:|---:|---:|\n"
            f"| {best['run.c']:,.0f} | {best['qkv']:,.0f} | "
            f"{best['qkv'] / best['run.c'] if best['run.c'] else 0:.2f}x |\n")


def splice(path, sections, info):
    """The page at `path` with each of `sections` in place of the section of the same "## "
    heading (or appended), each under a line naming the run it came from."""
    with open(path, encoding="utf-8") as f:
        parts = re.split(r"(?m)^(?=## )", f.read())
    for new in sections:
        heading = new.splitlines()[0]
        title, body = new.split("\n", 1)
        stamped = (f"{title}\n\n_(This section from a later run of `bench/report.py --only "
                   f"... --splice` on {datetime.date.today().isoformat()}, {cpu_name()}; its "
                   f"yardsticks at that run's start: fp32 FMA peak "
                   f"{info['fma_peak_gflops']:.1f} GFLOP/s, read bandwidth "
                   f"{info['read_gbps']:.1f} GB/s.)_\n" + body)
        at = [i for i, p in enumerate(parts) if p.splitlines()[0] == heading]
        if at:
            parts[at[0]] = stamped + ("\n" if not stamped.endswith("\n\n") else "")
        else:  # a new section after the last, a blank line between
            parts[-1] = parts[-1].rstrip("\n") + "\n\n"
            parts.append(stamped)
    return ["".join(parts).rstrip("\n") + "\n"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", action="store_true", help="install the peers in build/peer, then stop")
    ap.add_argument("--peer-python", help="the Python with the peers (default: build/peer's, "
                    "else /usr/bin/python3)")
    ap.add_argument("--ggml", help="ggml's test-backend-ops binary")
    ap.add_argument("--llama2c", help="llama2.c's run binary")
    ap.add_argument("--llama-perplexity", help="llama.cpp's llama-perplexity binary")
    ap.add_argument("--cache-rotation-json", help="the cache_rotation section from this output "
                    "of bench/cache_rotation_compare.py --json instead of running it")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--kv-cache-json", help="the kv_cache section from this output of "
                    "bench/kv_cache_compare.py instead of running it (it takes the better part "
                    "of an hour: llama.cpp decodes slowly over quantized caches)")
    ap.add_argument("--only", help="comma-separated sections: " + ",".join(SECTIONS))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--splice", action="store_true",
                    help="with --only: replace those sections of the existing page (by their "
                    "heading) and keep the rest, each new one headed by the run it came from")
    args = ap.parse_args()
    if args.setup:
        return setup()
    if os.geteuid() == 0:  # Open MPI refuses root unless told
        os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if not os.path.exists(QKV):
        sys.exit(f"report.py: {QKV} is missing: run `make build` first")
    peer_py = args.peer_python or (os.path.join(PEER, "bin", "python")
                                   if os.path.exists(os.path.join(PEER, "bin", "python"))
                                   else "/usr/bin/python3")
    sections = args.only.split(",") if args.only else SECTIONS
    for s in sections:
        if s not in SECTIONS:
            sys.exit(f"report.py: unknown section {s!r}; the sections: {', '.join(SECTIONS)}")
    info, versions = machine(peer_py)
    page = [header(info, versions, peer_py, args.quick)]
    for s in sections:
        t0 = time.time()
        print(f"report.py: {s} …", file=sys.stderr, flush=True)
        try:
            page.append(globals()[f"section_{s}"](peer_py, args.quick, args))
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError, KeyError) as e:
            page.append(f"## {s}\n\nNot measured: {e}\n")
        print(f"report.py: {s} took {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    if args.splice:
        page = splice(args.out, page[1:], info)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(page))
    print(f"report.py: wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
