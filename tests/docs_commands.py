#!/usr/bin/env python3
"""Runs every `qkv …` command that README.md and docs/*.md show, and checks every option the
docs name against the command's --help.

usage: docs_commands.py QKV_BINARY SOURCE_DIR

- Commands: each line of a fenced code block that starts with `qkv`, `build/release/qkv`,
  `$ qkv`, `mpirun … qkv` or `printf … | qkv` (continuations joined, comments dropped), and each
  inline `qkv …` span with an option and no placeholder. Each runs in one scratch folder per
  document, in the document's order (a checkpoint one command writes, the next reads), with
  the models from models/ and the files a reader would have made (book.txt, my.json). A
  command that would take long runs smaller: SMALLER says how and why; one that cannot run
  here (no mpirun, no SmolLM2) is skipped with the reason. Every other must exit 0.
- Options: every `--option` a document names next to `qkv SUBCOMMAND` (in a code line or in
  its `## qkv SUBCOMMAND` section of cli.md) must be one that `qkv SUBCOMMAND --help` lists.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

QKV, SOURCE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
DOCS = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(SOURCE, "docs"))
                              if f.endswith(".md"))
MODELS = os.environ.get("QKV_MODELS", os.path.join(SOURCE, "models"))
SMOLLM2 = os.path.join(MODELS, "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
GPL3 = "/usr/share/common-licenses/GPL-3"

# (pattern in the command, [(pattern, replacement)], why): the first match runs smaller.
SMALLER = [
    (r"\bbench attention\b", [(r"--seq 32768", "--seq 1024"), (r"--seq (4096|8192)", "--seq 512"),
                              (r"--seq 2048", "--seq 256"), (r"--kv-len 3000", "--kv-len 400"),
                              (r"--documents [\d,]+", "--documents 100,300,40,72"),
                              (r"$", " --min-time 0.01")],
     "shorter sequences and a 10 ms minimum time"),
    (r"\bbench ring\b", [(r"--seq \d+", "--seq 512"), (r"$", " --min-time 0.01")],
     "512 positions"),
    (r"\bbench train\b", [(r"--d-model \d+", "--d-model 64"), (r"--layers \d+", "--layers 2"),
                          (r"--heads \d+", "--heads 2"), (r"--context \d+", "--context 64")],
     "a 2-layer model of width 64"),
    (r"\bbench generate\b", [(r"$", " --prompt 16 --cache-lengths 16 --decode 2")],
     "a 16-token prompt, 2 decoding steps"),
    (r"\btrain\b", [(r"--steps \d+", ""), (r"--seq 8192", "--seq 64"), (r"--d-model \d+", "--d-model 32"),
                    (r"--batch \d+", "--batch 4"), (r"$", " --steps 3 --warmup 1")],
     "3 optimizer steps"),
    (r"\bperplexity\b", [(re.escape(GPL3), "small.txt")],
     "the first 4 KB of the GPL-3 instead of all of it"),
    (r"\bgenerate\b.*smollm2", [(r"-n \d+", "-n 8")], "8 tokens"),
    (r"\bdemo\b", [(r"$", " --no-training")], "without the training"),
]


SYNOPSIS = re.compile(r"[\[\]…]|\b(FILE|N|T|PATH|K)\b|\.\.\.|\w\|\w")


def commands_of(path):
    """(line number, command, runs) of each qkv command in a Markdown file: those of code
    blocks run unless they are a synopsis (placeholders, [optional] parts, a|b choices);
    inline ones are references (their options are checked, they do not run)."""
    lines = open(path, encoding="utf-8").read().splitlines()
    found, fence, i = [], False, 0
    start = re.compile(r"^\s*(\$ )?((printf .*\| )|(mpirun .*?))?(build/release/)?qkv( |$)")
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("```"):
            fence = not fence
        elif fence and start.match(line):
            number, text = i + 1, line
            while text.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text.rstrip()[:-1] + " " + lines[i].strip()
            text = text.strip()
            runs = not SYNOPSIS.search(without_comment(text).replace("--model …", ""))
            found.append((number, text, runs))
        elif not fence:
            for span in re.findall(r"`(qkv [a-z][^`]*)`", line):
                found.append((i + 1, span, False))
        i += 1
    return found


def without_comment(command):
    """The command without its trailing `# comment` (a # outside quotes after a space)."""
    quote, out = None, []
    for ch in command:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (not out or out[-1] == " "):
            break
        out.append(ch)
    return "".join(out).strip()


def help_options(subcommand, cache={}):
    if subcommand not in cache:
        out = subprocess.run([QKV] + subcommand.split() + ["--help"], capture_output=True,
                             text=True).stdout
        cache[subcommand] = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", out))
    return cache[subcommand]


SUBCOMMANDS = ["bench attention", "bench generate", "bench train", "bench ring", "explain",
               "params", "demo", "train", "generate", "chat", "perplexity", "quantize",
               "random-model", "viz", "info"]


def subcommand_of(command):
    """The subcommand a command line runs (the longest of SUBCOMMANDS its words start with)."""
    m = re.search(r"qkv(?: --target \S+)? ([a-z-]+(?: [a-z]+)?)", command)
    if not m:
        return None
    words = m.group(1) + " "
    matches = [s for s in SUBCOMMANDS if words.startswith(s + " ")]
    return max(matches, key=len) if matches else None


MPI_OPTIONS = {"--bind-to", "--oversubscribe", "--allow-run-as-root", "--hostfile"}


def check_options(doc, number, command, problems):
    sub = subcommand_of(command)
    if not sub:
        return
    known = help_options(sub) | help_options("") | MPI_OPTIONS
    for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", without_comment(command)):
        if option not in known:
            problems.append(f"{doc}:{number}: `{option}` is not an option of `qkv {sub}` "
                            f"(its --help): {command}")


def check_cli_sections(problems):
    """Each `--option` in a `## qkv X` section of cli.md is one that `qkv X --help` lists."""
    text = open(os.path.join(SOURCE, "docs", "cli.md"), encoding="utf-8").read()
    for section in re.split(r"(?m)^(?=## )", text):
        m = re.match(r"## qkv ([a-z -]+)\n", section)
        if not m or m.group(1).strip() not in SUBCOMMANDS:
            continue
        sub = m.group(1).strip()
        known = help_options(sub) | help_options("")
        # Options of other programs or of other subcommands the prose names by their command.
        prose = re.sub(r"`(mpirun|make|qkv (?!" + re.escape(sub) + r")[a-z]+)[^`]*`", "", section)
        prose = re.sub(r"(?m) # .*$", "", prose)  # a code line's comment names other commands
        # A command's output shown as a sample (scripts/docs-samples) names other commands' options.
        prose = re.sub(r"(?s)<!-- sample: .*?<!-- /sample -->", "", prose)
        for option in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", prose))):
            if option not in known | MPI_OPTIONS:
                problems.append(f"docs/cli.md `## qkv {sub}`: `{option}` is not in "
                                f"`qkv {sub} --help`")


def prepared(command):
    """(the command as it runs here, what was made smaller or None)."""
    command = without_comment(command)
    command = re.sub(r"^\$ ", "", command)
    command = re.sub(r"(^|\| |np \d+ |--causal )build/release/qkv\b", r"\1" + QKV, command)
    command = re.sub(r"(^|\| |np \d+ )qkv\b", r"\1" + QKV, command)
    command = command.replace("--model …", f"--model {SMOLLM2}")
    why = None
    for pattern, edits, reason in SMALLER:
        if re.search(pattern, command):
            for a, b in edits:
                command = re.sub(a, b, command, count=1)
            why = reason
            break
    if command.startswith("mpirun"):
        extra = "--oversubscribe" + (" --allow-run-as-root" if os.geteuid() == 0 else "")
        command = command.replace("mpirun ", f"mpirun {extra} ", 1)
    return command, why


def scratch_files(folder):
    for name in os.listdir(os.path.join(MODELS, "stories260K")):
        os.symlink(os.path.join(MODELS, "stories260K", name), os.path.join(folder, name))
    os.symlink(MODELS, os.path.join(folder, "models"))
    with open(GPL3, encoding="utf-8") as f:
        text = f.read()
    for name, size in (("small.txt", 4096), ("book.txt", 20000)):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text[:size])
    shutil.copy(os.path.join(SOURCE, "tests", "data", "cross_example.json"),
                os.path.join(folder, "my.json"))


def main():
    problems, ran, smaller, skipped = [], 0, 0, []
    check_cli_sections(problems)
    have_mpi = shutil.which("mpirun") is not None
    start = time.time()
    for doc in DOCS:
        found = commands_of(os.path.join(SOURCE, doc))
        if not found:
            continue
        with tempfile.TemporaryDirectory() as folder:
            scratch_files(folder)
            for number, original, runs in found:
                check_options(doc, number, original, problems)
                if not runs:
                    continue
                command, why = prepared(original)
                reason = None
                if command.startswith("mpirun") and not have_mpi:
                    reason = "no mpirun"
                elif "smollm2" in command.lower() and not os.path.exists(SMOLLM2):
                    reason = "SmolLM2 is not in models/ (scripts/get-models)"
                if reason:
                    skipped.append(f"{doc}:{number}: {original} ({reason})")
                    continue
                stdin = "Hello\n" if re.search(r"\bchat\b", command) and "printf" not in command else None
                t0 = time.time()
                r = subprocess.run(command, shell=True, cwd=folder, capture_output=True,
                                   input=stdin.encode() if stdin else None, timeout=300)
                ran += 1
                smaller += why is not None
                print(f"{time.time() - t0:6.1f} s  {doc}:{number}: {command}"
                      + (f"   [smaller: {why}]" if why else ""), flush=True)
                if r.returncode != 0:
                    problems.append(f"{doc}:{number}: `{original}` exited {r.returncode}: "
                                    f"{(r.stderr or r.stdout).decode(errors='replace').strip()[-400:]}")
    for s in skipped:
        print("skipped:", s)
    print(f"{ran} commands ran ({smaller} smaller, as stated), {len(skipped)} skipped, "
          f"{time.time() - start:.0f} s")
    for p in problems:
        print("PROBLEM:", p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
