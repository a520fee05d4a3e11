"""The Python in README.md and docs/python.md runs as written (each file's blocks in order, in
one namespace, as a reader pastes them into a notebook)."""
import os
import re

import pytest

from conftest import source_dir


@pytest.mark.parametrize("doc", ["README.md", "docs/python.md"])
def test_the_docs_python_runs(doc, tmp_path, monkeypatch, capsys):
    text = open(os.path.join(source_dir(), doc), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, f"no Python in {doc}"
    monkeypatch.chdir(tmp_path)  # what the examples write lands here
    os.symlink(os.path.join(source_dir(), "models"), tmp_path / "models")  # as from the repository
    namespace = {}
    for block in blocks:
        exec(compile(block, doc, "exec"), namespace)


def _public_functions():
    """(name, function) of qkv's own public functions and methods (Python-level ones)."""
    import inspect
    import qkv
    import qkv.torch
    for mod in (qkv, qkv.torch):
        for name in dir(mod):
            obj = getattr(mod, name)
            if name.startswith("_") or not getattr(obj, "__module__", "").startswith("qkv"):
                continue
            if inspect.isfunction(obj):
                yield f"{mod.__name__}.{name}", obj
            elif inspect.isclass(obj):
                for m, f in inspect.getmembers(obj, inspect.isfunction):
                    if (not m.startswith("_") and f.__module__.startswith("qkv") and
                            not any(b.__module__.startswith("torch") for b in obj.__mro__[1:])):
                        yield f"{mod.__name__}.{name}.{m}", f


def test_docstrings_name_every_parameter():
    """Each public function's docstring names each of its parameters (a/b names both a and b),
    unless it hands them on: "as generate()", "as the forward", "as in attention"."""
    import inspect
    problems = []
    for name, f in _public_functions():
        doc = inspect.getdoc(f) or ""
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", doc))
        for stem, first, second in re.findall(r"\b([a-z_]*?)([a-z]+)/([a-z]+)\b", doc):
            words |= {stem + first, stem + second}
        # The drop-ins take another library's signature (torch.…, flash_attn.…, qkv.attention's).
        hands_on = re.search(r"^(torch\.|flash_attn\.|qkv\.attention on)|\bas (the )?forward",
                             doc)
        for p in inspect.signature(f).parameters.values():
            if p.name in ("self", "ctx") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if p.name not in words and not hands_on:
                problems.append(f"{name}: its docstring does not name {p.name!r}")
    assert not problems, "\n".join(problems)
