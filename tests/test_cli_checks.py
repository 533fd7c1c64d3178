"""Command-line input that used to pass unnoticed: ``--dim`` bounds past int64, a text module
with no @graph function, ``--backends`` naming nothing or a backend twice (the Python API too),
``tilework run`` of an ONNX model, and the summary of a zero-size output."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import tilework as tw
from tests.runtime.test_atomic import TEXT_MODULE
from tilework.cli import main
from tilework.errors import UnsupportedError

HUGE = "99999999999999999999999"


@pytest.mark.parametrize("command", ["build", "export"])
@pytest.mark.parametrize("model, spec", [("relu.onnx", f"n<={HUGE}"), ("relu.onnx", f"{HUGE}<=n"), ("junk.pt2", f"s0<={HUGE}"), ("junk.pt2", f"b=x.0>={HUGE}")])
def test_dim_bounds_past_int64_are_refused_naming_dim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str, model: str, spec: str) -> None:
    monkeypatch.chdir(tmp_path)
    Path(model).write_bytes(b"junk")  # refused at parse time: the model is never read
    assert main([command, model, "-o", "out", "--dim", spec]) == 2
    assert capsys.readouterr().err.strip() == f"error: --dim {spec!r}: the bound {HUGE} does not fit in int64 (at most 9223372036854775807)"


def test_the_largest_int64_bound_is_taken() -> None:
    from tilework.cli.inputs import onnx_dim_bounds

    assert onnx_dim_bounds(["n<=9223372036854775807"]) == {"n": (None, 9223372036854775807)}


@pytest.mark.parametrize("command", ["build", "export"])
def test_a_module_of_tensor_functions_only_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str) -> None:
    monkeypatch.chdir(tmp_path)
    Path("loop.txt").write_text(tw.build(tw.parse(TEXT_MODULE)).loop_ir())
    assert main([command, "loop.txt", "-o", "out"]) == 2
    assert capsys.readouterr().err.strip() == "error: loop.txt defines no @graph function to compile (it has 1 @tensor function(s))"
    assert not Path("out").exists()


@pytest.mark.parametrize("spec", ["", ",,", " , ", "codegen,codegen", ["codegen", "codegen"], []])
def test_backends_naming_none_or_one_twice_are_refused(spec: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    mod = tw.parse(TEXT_MODULE)
    with pytest.raises(UnsupportedError, match="names no backend|more than once"):
        tw.build(mod, backends=spec)  # type: ignore[arg-type]
    if isinstance(spec, str):
        monkeypatch.chdir(tmp_path)
        Path("m.txt").write_text(TEXT_MODULE)
        assert main(["build", "m.txt", "-o", "m.tw", "--backends", spec]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --backends {spec!r} names") and not Path("m.tw").exists()


def test_run_of_an_onnx_model_says_to_build_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07\x12\x04test" * 20)
    assert main(["run", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {str(path)!r} is an ONNX model, not a tilework executable: compile it first (tilework build {path} -o model.tw, or tilework.compile)"


def test_run_summary_of_a_zero_size_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "m.txt"
    src.write_text(TEXT_MODULE.replace("n = sym(lo=1, hi=64)", "n = sym(lo=0, hi=64)"))
    assert main(["build", str(src), "-o", str(tmp_path / "m.tw")]) == 0
    for n in (0, 1, 3):
        np.save(tmp_path / "x.npy", np.ones((n, 5), np.float32))
        np.save(tmp_path / "y.npy", np.full((5, n), 2, np.float32))
        capsys.readouterr()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert main(["run", str(tmp_path / "m.tw"), "--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'y.npy'}"]) == 0
        assert capsys.readouterr().out.strip() == f"output0: shape ({n}, 5) dtype float32 {'empty' if n == 0 else 'mean 3'}"


def test_run_output_on_a_full_disk_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.runtime.test_atomic import full_disk

    monkeypatch.chdir(tmp_path)
    Path("m.txt").write_text(TEXT_MODULE)
    assert main(["build", "m.txt", "-o", "m.tw"]) == 0
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save("x.npy", x)
    np.save("y.npy", x.T.copy())
    assert main(["run", "m.tw", "--input", "x=x.npy", "--input", "y=y.npy", "--output", "out"]) == 0
    np.testing.assert_array_equal(np.load("out/output0.npy"), 2 * x)
    Path("small").mkdir()
    full_disk(monkeypatch, tmp_path / "small", room=64)
    capsys.readouterr()
    assert main(["run", "m.tw", "--input", "x=x.npy", "--input", "y=y.npy", "--output", "small"]) == 2
    assert capsys.readouterr().err.strip() == "error: cannot write 'small/output0.npy': No space left on device"
    assert list(Path("small").iterdir()) == []
