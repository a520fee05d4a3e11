#!/usr/bin/env python3
"""Runs qkv beside its peers and writes this CPU's page in docs/benchmarks/.

One run of this script writes one page whole (docs/benchmarks/<cpu>.md), headed by the CPU, the
date, qkv's version, commit and build, each peer's version, commit, build and threads, and the
yardsticks (the fp32 FMA peak of the SIMD target in use and the read bandwidth, from `qkv info`,
measured in the same run); each benchmark divides by its own yardsticks measured in its own
process. A peer that is not there is skipped, and the page says so. Then it rewrites the index
(docs/benchmarks/README.md) and the README's headline from every page's summary.

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
  bench/report.py --setup                  # once: build/peer (downloads PyTorch, builds llama.cpp)
  bench/report.py                          # every section (1-2 hours on 2 cores)
  bench/report.py --quick                  # fewer shapes and rounds (~45 minutes)
  bench/report.py --only units --merge     # sections into this CPU's page of the same commit
  bench/report.py --device-run DIR         # the page of a device-scale.py run (see the index)
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
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QKV = os.path.join(ROOT, "build", "release", "qkv")
PEER = os.path.join(ROOT, "build", "peer")
SMOLLM2 = os.path.join(ROOT, "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
STORIES = os.path.join(ROOT, "models", "stories260K")
SECTIONS = ["attention", "units", "gemm", "training", "generation", "quantized", "kv_cache",
            "cache_rotation", "quality", "python",
            "mpi", "ggml", "llama2c"]
GPL3 = "/usr/share/common-licenses/GPL-3"


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
    # The GEMM candidates from PyPI (bench/gemm_compare.cpp loads them with dlopen).
    subprocess.check_call(pip + ["scipy-openblas32", "mkl"])
    subprocess.check_call(pip + ["llama-cpp-python"],
                          env=dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=ON"))
    subprocess.check_call(pip + [ROOT])
    print(f"report.py: peers installed in {PEER}")


def qkv_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(qkv VERSION ([\d.]+)", f.read()).group(1)


def cmake_cache(build_dir, *keys):
    """The values of `keys` in build_dir/CMakeCache.txt ("?" for each one missing)."""
    values = {}
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt"), encoding="utf-8") as f:
            for line in f:
                m = re.match(r"([A-Za-z_]+):[A-Z]+=(.*)", line.strip())
                if m:
                    values[m.group(1)] = m.group(2)
    except OSError:
        pass
    return [values.get(k, "?") for k in keys]


def qkv_build():
    """How build/release was configured: its build type, optimisation flags and compiler."""
    kind, flags, cxx = cmake_cache(os.path.dirname(QKV), "CMAKE_BUILD_TYPE",
                                   "CMAKE_CXX_FLAGS_RELEASE", "CMAKE_CXX_COMPILER")
    version = run([cxx if cxx != "?" else "g++", "--version"]).splitlines()[0]
    return f"{kind} ({flags}), {version}; every SIMD target compiled in, the best chosen at start"


def llama_cpp_build(binary):
    """The commit and build of a llama.cpp / ggml binary, from its build tree (bin/..)."""
    build = os.path.dirname(os.path.dirname(os.path.abspath(binary)))
    kind, native, compiler = cmake_cache(build, "CMAKE_BUILD_TYPE", "GGML_NATIVE",
                                         "CMAKE_CXX_COMPILER")
    commit = "unknown"
    try:
        with open(os.path.join(build, "common", "build-info.cpp"), encoding="utf-8") as f:
            m = re.search(r'LLAMA_COMMIT = "([0-9a-f]+)"', f.read())
            commit = m.group(1) if m else commit
    except OSError:
        pass
    return commit, f"CMake {kind}, GGML_NATIVE={native}, {os.path.basename(compiler)}"


def git_state():
    """The commit the page's qkv was built from, and whether the tree had other changes."""
    try:
        commit = run(["git", "rev-parse", "--short=12", "HEAD"]).strip()
        dirty = run(["git", "status", "--porcelain", "--untracked-files=no", "--", "src",
                     "include", "apps", "bench", "python", "CMakeLists.txt"]).strip()
    except RuntimeError:
        return "unknown", False
    return commit, bool(dirty)


def machine(peer_py, args):
    """`qkv info`, the build and each peer: what the page's header names."""
    info = json.loads(run([QKV, "info", "--json"]))
    commit, dirty = git_state()
    info["commit"] = commit
    versions = {"qkv": f"{qkv_version()}, commit {commit}"
                + (" with uncommitted changes" if dirty else ""),
                "qkv build": qkv_build()}
    peers = []  # name, version, commit, build, threads
    torch_v = python_version_of(peer_py, "torch")
    if torch_v:
        detail = run([peer_py, "-c", "import torch; print(torch.version.git_version); "
                      "import torch.backends; cpu = getattr(torch.backends, 'cpu', None); "
                      "print(cpu.get_cpu_capability() if cpu else 'unknown')"]).split()
        wheel = "Debian's package" if peer_py == "/usr/bin/python3" else "the PyPI wheel"
        peers.append(("PyTorch", torch_v, detail[0][:12],
                      f"{wheel}; CPU capability {detail[1]}", "as each table says"))
    llama_v = python_version_of(peer_py, "llama_cpp")
    if llama_v:
        flags = run([peer_py, "-c", "import llama_cpp; "
                     "print(llama_cpp.llama_print_system_info().decode())"]).strip()
        flags = " ".join(f.split("=")[0].strip() for f in flags.split("|")
                         if f.strip().endswith("= 1"))
        peers.append(("llama-cpp-python (llama.cpp)", llama_v, "unknown (the package does not say)",
                      f"built from source by pip with GGML_NATIVE=ON; {flags}",
                      "as each table says"))
    for name, path in (("llama.cpp's llama-perplexity", args.llama_perplexity),
                       ("ggml's test-backend-ops", args.ggml)):
        if path:
            commit, build = llama_cpp_build(path)
            out = subprocess.run([path, "--version"], capture_output=True, text=True)
            m = re.search(r"version: (\S+)(?: \((build \d+))?", out.stdout + out.stderr)
            version = (f"{m.group(1)} ({m.group(2)})" if m.group(2) else m.group(1)) if m else "unknown"
            peers.append((name, version, commit, build, "its default (all logical CPUs)"))
    if args.llama2c:
        peers.append(("llama2.c's run.c", "-", args.llama2c_commit, args.llama2c_flags,
                      "OpenMP's default (all logical CPUs)"))
    numpy_v = python_version_of(peer_py, "numpy")
    if numpy_v:
        peers.append(("NumPy", numpy_v, "-", "Debian's package" if peer_py == "/usr/bin/python3"
                      else "the PyPI wheel", "-"))
    mpirun = shutil.which("mpirun")
    if mpirun:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
        version = (re.findall(r"[\d.]+", out.splitlines()[0]) or ["?"])[-1] if out else "?"
        peers.append(("Open MPI", version, "-", "Debian's package", "2 ranks"))
    return info, versions, peers


# Intel's server families by CPUID model (family 6); AMD's Zen by family and model.
INTEL_MODELS = {85: "Skylake/Cascade Lake", 106: "Ice Lake", 108: "Ice Lake",
                143: "Sapphire Rapids", 207: "Emerald Rapids", 173: "Granite Rapids",
                174: "Granite Rapids"}


# The CPU classes qkv is built and tested for, and the mark of their pages' file names.
CPU_CLASSES = [("AMD Zen 3 (AVX2)", "zen-3"), ("AMD Zen 4 (AVX-512 with BF16)", "zen-4"),
               ("Intel Ice Lake (AVX-512 without BF16)", "ice-lake"),
               ("Intel Sapphire/Emerald Rapids (AMX)", "rapids")]


def cpu_of(info):
    """(title, file name) of the CPU `qkv info --json` describes: its name, and for AMD and
    Intel servers the microarchitecture (lscpu's "AMD EPYC" alone does not say which Zen)."""
    m = re.match(r"(\w+) family (\d+) model (\d+)(?::\s*(.*))?", info.get("cpu_id", ""))
    name = info.get("cpu") or "unknown CPU"
    if not m:
        slug = re.sub(r"[^a-z0-9]+", "-", f"{info.get('arch', '')} {name}".lower()).strip("-")
        return name, slug
    vendor, family, model, features = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
    arch = None
    if vendor == "AuthenticAMD":
        zen3 = model < 0x10 or 0x20 <= model < 0x60
        arch = {23: "Zen 2", 25: "Zen 3" if zen3 else "Zen 4", 26: "Zen 5"}.get(family)
    elif vendor == "GenuineIntel" and family == 6:
        arch = INTEL_MODELS.get(model)
    title = f"{name} ({arch or f'family {family} model {model}'}; {vendor} family {family} model {model}"
    title += f": {features})" if features else ")"
    base = re.sub(r"\(r\)|\(tm\)|processor|cpu", "", name.lower())
    slug = re.sub(r"[^a-z0-9]+", "-", f"{base} {arch or f'f{family}-m{model}'}".lower()).strip("-")
    return title, slug


def header(info, versions, peers, peer_py, quick, date=None):
    title, _ = cpu_of(info)
    lines = [
        f"# Benchmarks: {title}",
        "",
        "Written whole by `bench/report.py` in one run on this CPU (the index: "
        "[README.md](README.md)). Every ratio divides by a peer measured in the same run; every "
        "fraction by a yardstick measured in the same process.",
        "",
        f"- **CPU:** {title}; {info['logical_cpus']} logical CPUs; qkv's SIMD target "
        f"`{info['target']}`; caches " + ", ".join(f"{c['name']} {c['size']}" for c in info["caches"]),
        f"- **Date:** {date or datetime.date.today().isoformat()}; {platform.platform()}",
        f"- **qkv:** {versions['qkv']}; built {versions['qkv build']}",
        f"- **Yardsticks at the run's start:** fp32 FMA peak {info['fma_peak_gflops']:.1f} GFLOP/s "
        f"({info['threads']} threads, `{info['target']}`), read bandwidth {info['read_gbps']:.1f} "
        "GB/s. Each table's fractions divide by the yardsticks its own process measured beside it.",
        f"- **Threads:** each table names them; {info['logical_cpus']} is every logical CPU.",
    ]
    if quick:
        lines.append("- **`--quick`:** fewer shapes and rounds than the full report.")
    lines.append("- **Run time:** RUN_MINUTES minutes for the sections below.")
    lines += ["", "| peer | version | commit | build | threads |", "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(p)} |" for p in peers]
    if not peers:
        lines.append("| (none installed: `bench/report.py --setup`) | | | | |")
    if peer_py == "/usr/bin/python3":
        lines.append("\nPeers' Python: Debian's (`bench/report.py --setup` installs the newest "
                     "PyTorch).")
    return "\n".join(lines) + "\n"


# What each section measured, for the index and the README's headline: section → {key: value}.
SUMMARY = {}


def ratios(values):
    values = sorted(v for v in values if v)
    return {"min": values[0], "max": values[-1], "median": values[len(values) // 2],
            "n": len(values)} if values else None


def table_and_rows(out):
    """compare_torch.py --json's output: its markdown lines, and its rows as dicts."""
    lines, rows = [], []
    for line in out.splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
        else:
            lines.append(line)
    return "\n".join(lines) + "\n", rows


def section_attention(peer_py, quick, args):
    out, rows = table_and_rows(run([peer_py, "bench/compare_torch.py", "--json"] +
                                   (["--quick"] if quick else [])))
    def kind(r):
        return "decode" if r["queries"] == 1 else ("fwd_bwd" if r["backward"] else "fwd")
    targets = [r["target"] for r in rows]
    usual = max(set(targets), key=targets.count) if rows else None  # not a forced one
    SUMMARY["attention"] = {
        f"{dtype}_{k}": ratios(r["ratio_to_torch"] for r in rows
                               if r.get("dtype", "fp32") == dtype and kind(r) == k
                               and r["target"] == usual)
        for dtype in ("fp32", "bf16") for k in ("fwd", "fwd_bwd", "decode")}
    SUMMARY["attention"]["torch"] = rows[0]["torch"] if rows else None
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
    out, rows = table_and_rows(run([peer_py, "bench/compare_torch.py", "--units", "--json"]))
    return ("## bf16 on the bf16 units (`avx512_bf16`)\n\n"
            "`bench/compare_torch.py --units`: qkv's bf16 kernels on the CPU's bf16 dot-product "
            "instruction (vdpbf16ps) beside qkv's own fp32 on the same shape and PyTorch's in the "
            "same dtype. \"of FMA peak\" divides by the fp32 FMA loop and \"bf16 dot\" by the "
            "vdpbf16ps loop, both measured in the same process. The decode rows show the units "
            "(`avx512_bf16`) and the widening kernels (`avx512_dl`) on the same bf16 cache.\n\n"
            + out)


def pypi_library(peer_py, code):
    """A path printed by `code` run in the peer Python, or None where that fails."""
    try:
        path = run([peer_py, "-c", code]).strip()
        return path if os.path.exists(path) else None
    except RuntimeError:
        return None


def section_gemm(peer_py, quick, args):
    binary = os.path.join(ROOT, "build", "release", "bench", "gemm_compare")
    if not os.path.exists(binary):
        return ("## GEMM libraries\n\nNot measured: build/release/bench/gemm_compare is built "
                "where libblis-dev and libdnnl-dev are installed.\n")
    cmd = [binary, "--threads", str(os.cpu_count()) if quick else f"1,{os.cpu_count()}"]
    openblas = pypi_library(peer_py, "import scipy_openblas32, os; print(os.path.join("
                            "scipy_openblas32.get_lib_dir(), 'libscipy_openblas.so'))")
    mkl = pypi_library(peer_py, "import sys, os; print(os.path.join(sys.prefix, 'lib', "
                       "'libmkl_rt.so.2' if os.path.exists(os.path.join(sys.prefix, 'lib', "
                       "'libmkl_rt.so.2')) else 'libmkl_rt.so.3'))")
    if openblas:
        cmd += ["--pypi-openblas", openblas]
    if mkl:
        cmd += ["--mkl", mkl]
    out = run(cmd, timeout=3600)
    # What Debian's OpenBLAS does on a CPU it does not know (Sapphire/Emerald Rapids): its
    # Prescott kernels, forced here for this one process.
    prescott = run([binary, "--threads", str(os.cpu_count())], env={"OPENBLAS_CORETYPE": "Prescott"}, timeout=3600)
    rows = [l for l in prescott.split("### bf16")[0].splitlines() if l.startswith("|")]
    return ("## GEMM libraries\n\n"
            "`bench/gemm_compare.cpp`: the dense products of GPT-2 small (1,024 tokens) and a "
            "768-wide Llama's prefill in every candidate library, in one process: GFLOP/s and the "
            "fraction of the FMA or bf16-dot peak measured beside them. \"qkv\" is qkv's own "
            "call (the library its table picks on this CPU, cut into thread-independent blocks); "
            "the others are called whole with their own threads. \"WRONG\" would mark a result "
            "off the exact product. " + ("" if openblas and mkl else
            "PyPI's OpenBLAS and oneMKL were not installed in the peer Python (`report.py "
            "--setup`). ") + "\n\n" + out +
            "\n### Debian's OpenBLAS on a CPU it does not know\n\n"
            "The same fp32 products with `OPENBLAS_CORETYPE=Prescott` set for that process "
            "alone: the kernels Debian's OpenBLAS 0.3.21 runs on Intel Sapphire and Emerald "
            "Rapids, where qkv's table picks oneDNN.\n\n" + "\n".join(rows) + "\n")


def section_training(peer_py, quick, args):
    # --quick: both models (gpt2-small is the MFU yardstick's shape) on every core only.
    out = run([peer_py, "bench/compare_torch_train.py"] + (["--threads", str(os.cpu_count())] if quick else []))
    return ("## Training\n\n"
            "`bench/compare_torch_train.py`: one AdamW step of the same model in qkv (`qkv bench "
            "train`) and in PyTorch, tokens per second, in fp32 and in bf16 mixed precision "
            "(qkv's `--dtype bf16`, PyTorch's autocast to bf16; both keep fp32 weights and AdamW "
            "state); MFU counts 6 × parameters + attention FLOPs per token against the fp32 FMA "
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
        SUMMARY["generation"] = {"llama_cpp": r["llama_cpp_python"], "threads": r["threads"],
                                 "prefill": s["ratio_prefill"], "decode": s["ratio_decode"]}
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
    SUMMARY["quantized"] = {
        "int8_decode": ratios(s["qkv_int8"]["decode_tokens_per_s"] /
                              s["llama_cpp"]["decode_tokens_per_s"] for s in r["speed"].values()),
        "int8_prefill": ratios(s["qkv_int8"]["prefill_long_tokens_per_s"] /
                               s["llama_cpp"]["prefill_long_tokens_per_s"]
                               for s in r["speed"].values())}
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
    SUMMARY["kv_cache"] = {"decode": ratios(row["qkv"] / row["llama_cpp"] for row in g["rows"])}
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


# The quality table: (label, `qkv perplexity` options); the first row is what the others are
# measured against.
QUALITY_RUNS = [
    ("weights exact, f32 cache", []),
    ("weights int8", ["--matmul", "int8"]),
    ("bf16 cache", ["--cache", "bf16"]),
    ("f16 cache", ["--cache", "f16"]),
    ("q8_0 cache, rotated", ["--cache", "q8_0"]),
    ("q8_0 cache, not rotated", ["--cache", "q8_0", "--cache-rotation", "off"]),
    ("q4_0 cache, rotated", ["--cache", "q4_0"]),
    ("q4_0 cache, not rotated", ["--cache", "q4_0", "--cache-rotation", "off"]),
    ("q4_1 cache, rotated", ["--cache", "q4_1"]),
    ("q4_1 cache, not rotated", ["--cache", "q4_1", "--cache-rotation", "off"]),
    # Keys and values each in a type of their own: 8-bit keys with 4-bit values, and the reverse.
    ("q8_0 keys, q4_0 values, rotated", ["--cache-k", "q8_0", "--cache-v", "q4_0"]),
    ("q8_0 keys, q4_1 values, rotated", ["--cache-k", "q8_0", "--cache-v", "q4_1"]),
    ("q4_0 keys, q8_0 values, rotated", ["--cache-k", "q4_0", "--cache-v", "q8_0"]),
    ("q8_0 keys, q4_0 values, not rotated",
     ["--cache-k", "q8_0", "--cache-v", "q4_0", "--cache-rotation", "off"]),
    ("q4_0 keys, q8_0 values, not rotated",
     ["--cache-k", "q4_0", "--cache-v", "q8_0", "--cache-rotation", "off"]),
    ("f16 keys, q4_0 values, rotated", ["--cache-k", "f16", "--cache-v", "q4_0"]),
]


def section_quality(peer_py, quick, args):
    """Every quality figure the docs quote, in one table: SmolLM2's perplexity on one text per
    weight arithmetic, cache type, rotation and cache-score arithmetic, from `qkv perplexity`."""
    text = ["## Quality: perplexity per arithmetic and cache\n"]
    if not os.path.exists(SMOLLM2) or not os.path.exists(GPL3):
        text.append(f"Not measured: it needs SmolLM2 (`scripts/get-models`) and {GPL3}.\n")
        return "\n".join(text)
    ctx = 512
    if args.quality_json:  # `qkv perplexity --json` of each run, in QUALITY_RUNS' order
        with open(args.quality_json, encoding="utf-8") as f:
            results = json.load(f)
    else:
        results = [json.loads(run([QKV, "perplexity", "--model", SMOLLM2, "--text", GPL3, "--ctx",
                                   str(ctx), "--json"] + options, timeout=3600))
                   for _, options in QUALITY_RUNS]
    rows = [(label, options, r) for (label, options), r in zip(QUALITY_RUNS, results)]
    base = rows[0][2]
    text.append(
        f"SmolLM2-135M-Instruct (Q4_1) on {GPL3} ({base['tokens']:,} tokens, {base['chunks']} "
        f"chunks of {ctx}, {base['scored']:,} scored in llama-perplexity's windows; "
        f"`qkv perplexity`, weights exact unless the row says int8). Each chunk runs at once "
        f"through the tiled kernels, which widen every cache to fp32: the rows measure the "
        f"storage's rounding. The page's other sections hold llama.cpp's perplexities beside "
        f"qkv's." + (f" (The perplexities of a run of `qkv perplexity` before this page's, read "
                     f"from {os.path.basename(args.quality_json)}.)" if args.quality_json else "")
        + "\n\n| run | options | perplexity | against the first row |\n|---|---|---:|---:|")
    SUMMARY["quality"] = {}
    for label, options, r in rows:
        v = r["perplexity"]
        SUMMARY["quality"][label] = round(v, 4)
        text.append(f"| {label} | `{' '.join(options) or '(defaults)'}` | {v:.4f} | "
                    f"{100 * (v / base['perplexity'] - 1):+.2f}% |")
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


SUMMARY_MARK = "<!-- report.py summary: "


def page_summary(text):
    """The summary a page carries in its last line (None for a page without one)."""
    for line in reversed(text.splitlines()):
        if line.startswith(SUMMARY_MARK):
            return json.loads(line[len(SUMMARY_MARK):-len(" -->")])
    return None


def page_text(head, sections, summary):
    return "\n".join([head] + sections).rstrip("\n") + "\n\n" + SUMMARY_MARK + \
        json.dumps(summary, sort_keys=True) + " -->\n"


def merge(path, head, sections, info, summary):
    """The page at `path` with `sections` in place of its sections of the same heading (or
    added): only a page of the same CPU and commit, each merged section labelled with its run."""
    with open(path, encoding="utf-8") as f:
        old = f.read()
    was = page_summary(old) or {}
    for key in ("cpu", "commit"):
        if was.get(key) != summary[key]:
            sys.exit(f"report.py: --merge combines runs of one commit on one CPU; {path} is "
                     f"{key} {was.get(key)!r}, this run {summary[key]!r}: run every section")
    parts = re.split(r"(?m)^(?=## )", old.split(SUMMARY_MARK)[0])
    for new in sections:
        title, body = new.split("\n", 1)
        stamped = (f"{title}\n\n_From a run of `bench/report.py --only ... --merge` on "
                   f"{summary['date']}, the same CPU and commit; its yardsticks at its start: fp32 "
                   f"FMA peak {info['fma_peak_gflops']:.1f} GFLOP/s, read bandwidth "
                   f"{info['read_gbps']:.1f} GB/s._\n" + body)
        at = [i for i, p in enumerate(parts) if p.splitlines()[0] == title]
        if at:
            parts[at[0]] = stamped.rstrip("\n") + "\n\n"
        else:
            parts.append(stamped.rstrip("\n") + "\n\n")
    merged = dict(was, **{k: v for k, v in summary.items() if k in SECTIONS})
    return page_text(parts[0].rstrip("\n") + "\n", parts[1:], merged)


def device_page(run_dir):
    """A page from a run of ../shared/tools/device-scale.py on a lent machine: run_dir holds
    info.json (`qkv info --json` there), date (its `date -u +%F`) and scale.txt
    (device-scale.py's output)."""
    with open(os.path.join(run_dir, "info.json"), encoding="utf-8") as f:
        info = json.loads(f.read().strip().splitlines()[-1])
    with open(os.path.join(run_dir, "date"), encoding="utf-8") as f:
        date = f.read().strip()
    rows, torch_v = [], "?"
    with open(os.path.join(run_dir, "scale.txt"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("{"):
                rows.append(json.loads(line))
            m = re.match(r"torch (\S+);", line)
            torch_v = m.group(1) if m else torch_v
    title, slug = cpu_of(info)
    head = "\n".join([
        f"# Benchmarks: {title}",
        "",
        "Written whole by `bench/report.py --device-run DIR` from one run of "
        "`device-scale.py` (qkv's CLI beside PyTorch's SDPA at several thread counts) on this "
        "CPU (the index: [README.md](README.md)). It has only the attention rows: the other "
        "sections need peers and models that machine does not have.",
        "",
        f"- **CPU:** {title}; {info['logical_cpus']} logical CPUs; qkv's SIMD target "
        f"`{info['target']}`",
        f"- **Date:** {date}",
        f"- **qkv:** {info.get('version', '?')}, commit {info.get('commit', 'unknown')}",
        f"- **Yardsticks:** fp32 FMA peak {info['fma_peak_gflops']:.1f} GFLOP/s, read "
        f"bandwidth {info['read_gbps']:.1f} GB/s (`qkv info`, {info['threads']} threads); each "
        "row's fractions divide by the peaks its own process measured",
        f"- **Peer:** PyTorch {torch_v} (its wheel on that machine; SDPA, the same threads)",
        ""])
    table = ["## Attention at several thread counts", "",
             "H 16, T 2048, D 128, batch 1 (FLOPs 4·T²·D·H forward, 3.5× that forward + "
             "backward); decoding: one query over a 32k cache, 32 query heads over 8 kv heads.",
             "", "| case | threads | qkv ms | qkv GFLOP/s | of FMA peak | of bf16 peak | "
             "PyTorch ms | qkv / PyTorch speed |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    f = lambda x, spec: "-" if x is None else format(x, spec)
    summary = {"cpu": slug, "commit": info.get("commit"), "date": date, "title": title,
               "torch": torch_v, "device": {}}
    for r in rows:
        if r.get("err") or r.get("qkv_ms") is None:
            table.append(f"| {r['case']} | {r['threads']} | not measured: {r.get('err')} | | | | | |")
            continue
        t = r.get("torch_ms")
        table.append(f"| {r['case']} | {r['threads']} | {r['qkv_ms']:.2f} | "
                     f"{f(r.get('qkv_gflops'), '.0f')} | {f(r.get('qkv_frac_fma'), '.0%')} | "
                     f"{f(r.get('qkv_frac_bf16'), '.0%')} | {f(t, '.2f')} | "
                     f"{f(t / r['qkv_ms'] if t else None, '.2f')}x |")
        if t:
            summary["device"].setdefault(r["case"], {})[str(r["threads"])] = t / r["qkv_ms"]
    return slug, page_text(head, ["\n".join(table) + "\n"], summary)


PAGES = os.path.join(ROOT, "docs", "benchmarks")


def span(values):
    values = [v for v in values if v]
    if not values:
        return None
    lo, hi = min(values), max(values)
    return f"{lo:.2f}×" if abs(hi - lo) < 0.005 else f"{lo:.2f}–{hi:.2f}×"


def write_index():
    """docs/benchmarks/README.md: one row per page; and the README's headline, from the pages."""
    pages = []
    for name in sorted(os.listdir(PAGES)):
        if name.endswith(".md") and name != "README.md":
            with open(os.path.join(PAGES, name), encoding="utf-8") as f:
                summary = page_summary(f.read())
            if summary:
                pages.append((name, summary))
    rows = ["| CPU | date | qkv commit | fp32 attention fwd ÷ PyTorch | bf16 fwd ÷ PyTorch | "
            "decode ÷ llama.cpp (SmolLM2) |", "|---|---|---|---:|---:|---:|"]
    for name, s in pages:
        if "device" in s:
            cell = lambda case: span(s["device"].get(case, {}).values()) or "-"
            rows.append(f"| [{s['title']}]({name}) | {s['date']} | {s['commit']} | "
                        f"{cell('fp32 fwd')} | {cell('bf16 fwd')} | - |")
            continue
        fwd, bf16 = range_of_pair(s, "attention", "fp32_fwd"), range_of_pair(s, "attention", "bf16_fwd")
        gen = (s.get("generation") or {}).get("decode")
        rows.append(f"| [{s['title']}]({name}) | {s['date']} | {s['commit']} | "
                    f"{span(fwd or []) or '-'} | {span(bf16 or []) or '-'} | "
                    f"{span([gen]) or '-'} |")
    missing = [cpu for cpu, mark in CPU_CLASSES if not any(mark in name for name, _ in pages)]
    text = f"""# Benchmarks, one page per CPU

Each page is written whole by `bench/report.py` in one run on one CPU, headed by the CPU, its
yardsticks, the qkv version and commit, the date and each peer's version, commit, build and
threads. The ratios below are speeds (above 1: qkv faster), each the range over that page's
shapes and thread counts; a page that lists sections (`--only`) has only those.

{chr(10).join(rows)}

CPU classes qkv runs on with no page yet: {", ".join(missing) or "none"}.

## Adding a page

- **A CPU you have:** `make build && scripts/get-models`, once `bench/report.py --setup`, then
  `bench/report.py` (`--ggml`, `--llama2c`, `--llama-perplexity` name peers built outside the
  repository). It writes the page of this CPU (its name from `qkv info`), this index and the
  README's headline. `--only SECTIONS --merge` adds sections to a page of the same commit on
  the same CPU, never across: a new commit or CPU is a new run of every section.
- **A lent machine** (the 16-core Xeon): pack `build/release/qkv` with
  `../shared/tools/device-pack`, run there `qkv info --json > $OUT/info.json; date -u +%F >
  $OUT/date; python3 device-scale.py ./qkv 1 4 8 16 > $OUT/scale.txt`, then here
  `bench/report.py --device-run DIR` on the files that came back.
- A change that moves a kernel's speed regenerates the page of the CPU it was measured on.
"""
    with open(os.path.join(PAGES, "README.md"), "w", encoding="utf-8") as f:
        f.write(text)
    headline(pages)


def headline(pages):
    """The README's lines between the headline markers: per CPU page, the range of qkv's speed
    over the peer's on that page's shapes and thread counts."""
    lines = []
    for name, s in pages:
        cpu = f"[{s['title'].split(' (')[0]} ({s['title'].split('(')[1].split(';')[0]})]" \
              f"(docs/benchmarks/{name})"
        parts = []
        for label, key, case in (("fp32 attention forward", "fp32_fwd", "fp32 fwd"),
                                 ("forward + backward", "fp32_fwd_bwd", "fp32 fwd+bwd"),
                                 ("bf16 forward", "bf16_fwd", "bf16 fwd"),
                                 ("bf16 forward + backward", "bf16_fwd_bwd", "bf16 fwd+bwd")):
            values = (list(s["device"].get(case, {}).values()) if "device" in s
                      else list(range_of_pair(s, "attention", key) or []))
            if values:
                parts.append(f"{label} {span(values)}")
        torch_v = s.get("torch") or (s.get("attention") or {}).get("torch")
        line = f"- {cpu}, {s['date']}: " + (", ".join(parts) + f" PyTorch {torch_v}'s"
                                            if parts else "no attention rows")
        if s.get("generation"):
            line += f"; SmolLM2 decoding {span([s['generation']['decode']])} llama.cpp's"
        lines.append(line + ".")
    text = (textwrap.fill("Speed against a peer on the same shapes and threads (above 1×: qkv "
                          "faster), the range over each page's shapes and thread counts ([all "
                          "pages, how they are made](docs/benchmarks/README.md)):", 99) + "\n\n" +
            "\n".join(textwrap.fill(l, 99, subsequent_indent="  ") for l in lines))
    path = os.path.join(ROOT, "README.md")
    with open(path, encoding="utf-8") as f:
        readme = f.read()
    begin, end = "<!-- headline: written by bench/report.py -->", "<!-- /headline -->"
    if begin in readme and end in readme:
        head, rest = readme.split(begin, 1)
        readme = head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1]
        with open(path, "w", encoding="utf-8") as f:
            f.write(readme)


def range_of_pair(s, section, key):
    r = (s.get(section) or {}).get(key)
    return r and (r["min"], r["max"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", action="store_true", help="install the peers in build/peer, then stop")
    ap.add_argument("--peer-python", help="the Python with the peers (default: build/peer's, "
                    "else /usr/bin/python3)")
    ap.add_argument("--ggml", help="ggml's test-backend-ops binary (in its CMake build tree)")
    ap.add_argument("--llama2c", help="llama2.c's run binary")
    ap.add_argument("--llama2c-commit", default="unknown", help="the llama2.c commit it was built from")
    ap.add_argument("--llama2c-flags", default="unknown", help="how run.c was compiled")
    ap.add_argument("--llama-perplexity", help="llama.cpp's llama-perplexity binary (in its "
                    "CMake build tree)")
    ap.add_argument("--cache-rotation-json", help="the cache_rotation section from this output "
                    "of bench/cache_rotation_compare.py --json instead of running it")
    ap.add_argument("--quality-json", help="the quality section from this file: a JSON list of "
                    "`qkv perplexity --json` outputs, one per run of QUALITY_RUNS, in order")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--kv-cache-json", help="the kv_cache section from this output of "
                    "bench/kv_cache_compare.py instead of running it (it takes the better part "
                    "of an hour: llama.cpp decodes slowly over quantized caches)")
    ap.add_argument("--only", help="comma-separated sections: " + ",".join(SECTIONS))
    ap.add_argument("--merge", action="store_true",
                    help="with --only: put those sections into this CPU's page of the same "
                    "commit, keeping its others")
    ap.add_argument("--device-run", metavar="DIR", help="write the page of a device-scale.py "
                    "run (DIR: info.json, date, scale.txt) and the index, then stop")
    ap.add_argument("--index", action="store_true", help="rewrite the index and the README's "
                    "headline from the pages, then stop")
    args = ap.parse_args()
    if args.setup:
        return setup()
    os.makedirs(PAGES, exist_ok=True)
    if args.index:
        return write_index()
    if args.device_run:
        slug, text = device_page(args.device_run)
        with open(os.path.join(PAGES, slug + ".md"), "w", encoding="utf-8") as f:
            f.write(text)
        return write_index()
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
    if args.merge and not args.only:
        sys.exit("report.py: --merge goes with --only (a run of every section writes the page whole)")
    info, versions, peers = machine(peer_py, args)
    title, slug = cpu_of(info)
    path = os.path.join(PAGES, slug + ".md")
    if args.merge and not os.path.exists(path):
        sys.exit(f"report.py: --merge: {path} does not exist yet: run every section first")
    started = time.time()
    head = header(info, versions, peers, peer_py, args.quick)
    texts = []
    for s in sections:
        t0 = time.time()
        print(f"report.py: {s} …", file=sys.stderr, flush=True)
        try:
            texts.append(globals()[f"section_{s}"](peer_py, args.quick, args))
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError, KeyError) as e:
            texts.append(f"## {s}\n\nNot measured: {e}\n")
        print(f"report.py: {s} took {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    minutes = (time.time() - started) / 60
    head = head.replace("RUN_MINUTES", f"{minutes:.0f}")
    summary = dict(SUMMARY, cpu=slug, commit=info["commit"], title=title,
                   date=datetime.date.today().isoformat(), minutes=round(minutes, 1))
    text = (merge(path, head, texts, info, summary) if args.merge
            else page_text(head, texts, summary))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    write_index()
    print(f"report.py: wrote {path}, the index and the README's headline", file=sys.stderr)


if __name__ == "__main__":
    main()
