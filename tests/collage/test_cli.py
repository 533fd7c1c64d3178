"""The command line: build --placement (auto and a saved plan), explain, cache stats|clear."""

from __future__ import annotations

from pathlib import Path

import pytest

from tilework.cli import main
from tilework.collage import MockCostModel, place
from tilework.ir.info import free_vars

from tests.collage.helpers import mlp


def test_build_with_a_saved_plan_then_explain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mod = mlp()
    src = tmp_path / "mlp.txt"
    src.write_text(str(mod))
    # the CLI runs the default graph passes before placing; they leave this module as it is
    plan = place(mod, ["blas", "codegen"], cost_model=MockCostModel(lambda c, ops, dims: len(ops) * (1.0 if c.backend == "codegen" else 0.5 if dims["n"] > 8 else 2.0)), buckets={"n": [1, 64]})
    plan.save(str(tmp_path / "plan.json"))
    out = tmp_path / "mlp.tw"
    assert main(["build", str(src), "-o", str(out), "--placement", str(tmp_path / "plan.json")]) == 0
    assert "automatic placement (2 bucket(s)" in capsys.readouterr().out
    assert main(["explain", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 distinct placement(s)" in text and "bucket n in [9, 256]" in text and "blas" in text
    assert main(["explain", str(tmp_path / "plan.json")]) == 0
    assert "placement of @main" in capsys.readouterr().out


def test_explain_shows_the_signature_of_a_module_built_from_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An executable built from the text format keeps its functions' params, result and dim
    bounds (it printed only its instruction and kernel counts)."""
    mod = mlp()
    src = tmp_path / "mlp.txt"
    src.write_text(str(mod))
    assert main(["build", str(src), "-o", str(tmp_path / "mlp.tw")]) == 0
    capsys.readouterr()
    assert main(["explain", str(tmp_path / "mlp.tw")]) == 0
    text = capsys.readouterr().out
    (n,) = {v for p in mod["main"].params for v in free_vars(p.info)}
    assert f"main(x: Tensor((n, {mod['main'].params[0].info.shape[1]}), \"float32\")" in text
    assert f"{n.lo} <= n <= {n.hi}" in text and "kernels: " in text


def test_build_placement_auto_measures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "mlp.txt"
    src.write_text(str(mlp()))
    out = tmp_path / "auto.tw"
    assert main(["build", str(src), "-o", str(out), "--placement", "auto", "--backends", "blas,codegen", "--bucket", "n=4", "--budget", "30"]) == 0
    assert main(["explain", str(out)]) == 0
    text = capsys.readouterr().out
    assert "measured at n=4" in text and "end to end, ms:" in text  # the rows ("cost ms") only when a cover that offloads wins


def test_cli_mistakes_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "mlp.txt"
    src.write_text(str(mlp()))
    cases = [
        (["--budget", "3"], "need --placement auto"),
        (["--placement", "auto", "--bucket", "n=zero"], "--bucket expects DIM=P1,P2"),
        (["--placement", "auto", "--bucket", "seq=4", "--backends", "codegen"], "buckets name dim(s) seq"),
        (["--placement", "auto", "--pin", "relu=blas", "--backends", "blas,codegen"], "pinned to blas, but blas cannot run it"),
        (["--placement", str(tmp_path / "nope.json")], "no such placement file"),
        (["--placement", "auto", "--pin", "relux=blas", "--backends", "blas,codegen"], "pin relux=blas matches no binding of @main (its ops: linear, relu; a binding is pinned by its name, %name); did you mean relu?"),
        (["--placement", "auto", "--pin", "%lv9=blas", "--backends", "blas,codegen"], "pin %lv9=blas matches no binding of @main (its bindings: %up, %act, %out)"),
    ]
    for extra, message in cases:
        assert main(["build", str(src), "-o", str(tmp_path / "x.tw"), *extra]) == 2
        assert message in capsys.readouterr().err


def test_cache_stats_and_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(tmp_path))
    from tilework.collage.cache import CostCache, Entry

    c = CostCache()
    c.put("k1", "blas", Entry(1e-3, 0.0, 5, ""))
    c.put("k2", "torch", Entry(float("inf"), 0.0, 0, "run: boom"))
    c.close()
    assert main(["cache", "stats"]) == 0
    text = capsys.readouterr().out
    assert "2 entries" in text and "torch" in text and "1 failed" in text
    assert main(["cache", "clear"]) == 0
    assert "cleared 2 entries" in capsys.readouterr().out
    assert main(["cache", "stats"]) == 0
    assert "0 entries" in capsys.readouterr().out


def test_cache_stats_of_no_cache_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``cache stats`` (and ``clear``) where no cache exists report an empty one and write
    nothing: they created the directory and an empty database."""
    where = tmp_path / "never"
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(where))
    assert main(["cache", "stats"]) == 0
    text = capsys.readouterr().out
    assert "0 entries" in text and "not created yet" in text and str(where) in text
    assert main(["cache", "clear"]) == 0
    assert "cleared 0 entries" in capsys.readouterr().out
    assert not where.exists()


def test_a_corrupt_cost_cache_is_one_warning_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A costs.sqlite that is not a database is moved aside with one ``warning: ...`` line (it
    printed Python's ``UserWarning`` and the source line ``cache = CostCache()``), as the
    kernel cache's warnings are shown."""
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(tmp_path))
    (tmp_path / "placement").mkdir(mode=0o700)
    (tmp_path / "placement" / "costs.sqlite").write_bytes(b"not a database" * 100)
    assert main(["cache", "stats"]) == 0
    captured = capsys.readouterr()
    assert "0 entries" in captured.out
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: the placement cost cache {tmp_path}/placement/costs.sqlite was unreadable"), captured.err
    assert "moved to" in lines[0] and "Warning" not in lines[0]
    assert any(p.name.startswith("costs.sqlite.corrupt-") for p in (tmp_path / "placement").iterdir())


def test_cache_stats_where_the_cache_dir_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """TILEWORK_CACHE_DIR naming a regular file: stats said "(not created yet)"."""
    where = tmp_path / "afile"
    where.write_text("x")
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(where))
    for action in ("stats", "clear"):
        assert main(["cache", action]) == 2
        err = capsys.readouterr().err
        assert f"error: the cache directory {where} (TILEWORK_CACHE_DIR) is not a directory" in err
