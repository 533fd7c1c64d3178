"""docs/backends.md: its Python code blocks run, in order, in one namespace (the worked
example registers an einsum backend, builds with it and checks its results)."""

from __future__ import annotations

import os
import re

import pytest

from tilework.backend import get_backend

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "backends.md")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_worked_example_runs(isolated_registries: None, capsys: pytest.CaptureFixture[str]) -> None:
    with open(DOC) as fh:
        blocks = python_blocks(fh.read())
    assert len(blocks) >= 3
    namespace: dict[str, object] = {}
    for code in blocks:
        exec(compile(code, DOC, "exec"), namespace)  # noqa: S102 - the documentation's own code
    assert get_backend("einsum").kind == "library"
    assert "einsum.matmul" in capsys.readouterr().out
    # the registration part is about twenty lines
    registration = blocks[1]
    assert len([line for line in registration.splitlines() if line.strip()]) <= 22
