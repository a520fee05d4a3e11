#!/usr/bin/env python3
"""Checks that every speed or quality figure README.md, docs/*.md and CHANGELOG.md quote comes
from a benchmark page, or says where it was measured.

usage: docs_figures.py SOURCE_DIR

A figure is a number with a unit of speed or quality: a ratio (1.45×, 2.6x), a percentage,
GFLOP/s, GB/s, tokens/s, ms or µs, or a number with two or more decimals in a sentence about
perplexity. Each must be either
- on a page of docs/benchmarks/: some number there rounds to it (the page's 1.4932 backs the
  docs' 1.49×, its +0.32% backs 0.3 %), or
- in a paragraph (or a table and the paragraph just before it) that names the commit it was
  measured at ("commit 1a2b3c4"), the way a figure from another CPU or an older run is quoted.
Derived figures that are no measurement (sizes, byte ratios, limits) are spelled without those
units or sit in a paragraph marked `<!-- figures: derived -->`.
"""
import bisect
import os
import re
import sys

SOURCE = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else \
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = os.path.join(SOURCE, "docs", "benchmarks")

NUMBER = r"[-−+]?\d[\d,]*(?:\.\d+)?"
# (× before a number is a product: 40 × 128.)
UNIT = (r"\s?(?:×(?!\s?\d)|x(?![\w-])|%|GFLOP/s|TFLOP/s|GB/s|MB/s|tok/s|tokens/s|ms\b|µs\b)")
# A figure: a number or a range of two (1.3–2.2×) before a unit.
FIGURE = re.compile(rf"(?<![\w.])({NUMBER})(?:\s?[–-]\s?({NUMBER}))?({UNIT})")
PERPLEXITY = re.compile(r"perplexit|\bNLL\b", re.I)
DECIMALS = re.compile(rf"(?<![\w.]){NUMBER}")
COMMIT = re.compile(r"\bcommits?\s+`?[0-9a-f]{7,40}\b")
DERIVED = "<!-- figures: derived -->"


def value(text):
    t = text.replace(",", "").replace("−", "-").lstrip("+")
    return float(t), (len(t.split(".")[1]) if "." in t else 0)


# The units a page writes on the number itself: a ratio or a percentage in the docs is looked for
# among the page's ratios or percentages; other figures among all of its numbers (its tables
# carry their units in the header).
KIND = {"×": "x", "x": "x", "%": "%"}


def page_numbers():
    """Every number on every page, as sorted floats: {"x": ratios, "%": percentages, "": all}."""
    numbers = {"x": set(), "%": set(), "": set()}
    tagged = re.compile(rf"(?<![\w.])({NUMBER})(x(?![\w-])|%)?")
    for name in sorted(os.listdir(PAGES)):
        if name.endswith(".md") and name != "README.md":
            with open(os.path.join(PAGES, name), encoding="utf-8") as f:
                page = f.read()
            for m in tagged.finditer(page):
                v = abs(value(m.group(1))[0])
                numbers[""].add(v)
                if m.group(2):
                    numbers[m.group(2)].add(v)
            # The summary's exact ranges, which the README's headline quotes, are ratios.
            for line in page.split("\n"):
                if line.startswith("<!-- report.py summary:"):
                    for m in DECIMALS.finditer(line):
                        numbers["x"].add(abs(value(m.group(0))[0]))
    return {k: sorted(v) for k, v in numbers.items()}


def backed(number, unit, numbers):
    """Whether some page number of the unit's kind rounds to `number` (as written)."""
    v, decimals = value(number)
    pool = numbers[KIND.get(unit.strip(), "")]
    half = 0.5 * 10 ** -decimals + 1e-9
    i = bisect.bisect_left(pool, abs(v) - half)
    return i < len(pool) and pool[i] <= abs(v) + half


def paragraphs(text):
    """(first line number, lines) of each block: paragraphs, tables, fenced code blocks. A table
    is joined to the paragraph just before it (its caption)."""
    blocks, current, start, fenced = [], [], 1, False
    for n, line in enumerate(text.split("\n"), 1):
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and not line.strip():
            if current:
                blocks.append((start, current))
            current, start = [], n + 1
            continue
        current.append(line)
    if current:
        blocks.append((start, current))
    joined = []
    for start, lines in blocks:
        if lines[0].startswith("|") and joined and not joined[-1][1][0].startswith(("#", "|")):
            joined[-1] = (joined[-1][0], joined[-1][1] + lines)
        else:
            joined.append((start, lines))
    return joined


def unbacked(path, numbers):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    found = []
    for start, lines in paragraphs(text):
        block = "\n".join(lines)
        if COMMIT.search(block) or DERIVED in block or block.startswith("#"):
            continue
        for k, line in enumerate(lines):
            figures = [(n, m.group(3)) for m in FIGURE.finditer(line) for n in m.group(1, 2) if n]
            if PERPLEXITY.search(line):
                figures += [(m.group(0), "") for m in DECIMALS.finditer(line)
                            if value(m.group(0))[1] >= 2]
            for figure, unit in figures:
                if not backed(figure, unit, numbers):
                    found.append(f"{os.path.relpath(path, SOURCE)}:{start + k}: {figure} "
                                 f"({line.strip()[:100]})")
    return found


def main():
    numbers = page_numbers()
    docs = [os.path.join(SOURCE, "README.md"), os.path.join(SOURCE, "CHANGELOG.md")] + [
        os.path.join(SOURCE, "docs", f) for f in sorted(os.listdir(os.path.join(SOURCE, "docs")))
        if f.endswith(".md")]
    found = [line for path in docs for line in unbacked(path, numbers)]
    for line in found:
        print(line)
    if found:
        sys.exit(f"docs_figures: {len(found)} figures on no benchmark page and with no commit "
                 f"named (bench/report.py writes the pages; name the commit of a figure measured "
                 f"elsewhere)")
    print(f"docs_figures: every figure is on a page or names its commit")


if __name__ == "__main__":
    main()
