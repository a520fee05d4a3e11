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
