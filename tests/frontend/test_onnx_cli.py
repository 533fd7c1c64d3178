"""``tilework build model.onnx -o m.tw --dim seq<=512`` and running the result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tilework
from tests.frontend.onnx_util import model, ort_run, tensor
from tilework.cli import main
from tilework.errors import RuntimeCheckError, TileworkError
from tilework.frontend.onnx.compile import parse_dim_spec


def _save_model(path: Path) -> onnx.ModelProto:
    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["y"], axis=-1)]
    m = model(nodes, [tensor("x", TensorProto.FLOAT, ["batch", "seq", 8])], [tensor("y", TensorProto.FLOAT, ["batch", "seq", 8])], [("w", w)])
    onnx.save(m, str(path))
    return m


def test_build_onnx_with_dim_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "model.onnx", tmp_path / "m.tw"
    m = _save_model(src)
    assert main(["build", str(src), "-o", str(out), "--dim", "seq<=512"]) == 0
    printed = capsys.readouterr().out
    assert "seq in [1, 512]" in printed and "batch in [1, inf]" in printed
    fn = tilework.VM(tilework.load(str(out)))["main"]
    for shape in ((1, 3, 8), (2, 512, 8)):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(fn(x), ort_run(m, x)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeCheckError, match="seq <= 512"):
        fn(np.zeros((1, 513, 8), np.float32))


def test_explain_an_onnx_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``tilework build m.onnx`` goes through ``tilework.compile`` like a .pt2 program, so
    ``tilework explain`` shows the ONNX source, inputs, dims and the compile report (it showed
    only the executable's counts)."""
    src, out = tmp_path / "model.onnx", tmp_path / "m.tw"
    _save_model(src)
    assert main(["build", str(src), "-o", str(out), "--dim", "seq<=64"]) == 0
    assert "seq in [1, 64] (x.1)" in capsys.readouterr().out
    assert main(["explain", str(out)]) == 0
    text = capsys.readouterr().out
    assert "source: ONNX model (2 nodes" in text and 'x                    Tensor((batch, seq, 8), "float32")' in text
    assert "1 <= seq <= 64" in text and "compile time:" in text


def test_run_command_on_the_built_model(tmp_path: Path) -> None:
    src, exe = tmp_path / "model.onnx", tmp_path / "m.tw"
    m = _save_model(src)
    assert main(["build", str(src), "-o", str(exe)]) == 0
    x = np.random.default_rng(2).standard_normal((2, 5, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(exe), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "out")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "out" / "output0.npy"), ort_run(m, x)[0], rtol=1e-5, atol=1e-6)


def test_build_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "model.onnx"
    _save_model(src)
    assert main(["build", str(src), "-o", str(tmp_path / "m.tw"), "--dim", "len<=4"]) == 2
    assert "error: --dim names dims the model does not have: len (its dynamic input dims: batch (x.0), seq (x.1))" in capsys.readouterr().err
    with pytest.raises(TileworkError, match=r"^dim_bounds names dims the model does not have: len"):
        tilework.compile(str(src), dim_bounds={"len": (None, 4)})
    assert main(["build", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "m.tw")]) == 2


def _save_unnamed(path: Path) -> onnx.ModelProto:
    io = [tensor(n, TensorProto.FLOAT, [None, 4]) for n in ("x", "z", "o")]
    m = model([helper.make_node("Add", ["x", "z"], ["o"])], io[:2], io[2:])
    onnx.save(m, str(path))
    return m


@pytest.mark.parametrize("spec", ["x_dim0<=4", "x.0<=4", "1<=x.0<=4"])
def test_unnamed_dims_take_bounds(spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unnamed dim (no dim_param) is bounded by its generated name or by INPUT.AXIS, as a
    .pt2 program's dims are (both were "names dims the model does not have")."""
    src, out = tmp_path / "unnamed.onnx", tmp_path / "m.tw"
    m = _save_unnamed(src)
    assert main(["build", str(src), "-o", str(out), "--dim", spec]) == 0
    assert "x_dim0 in [1, 4] (x.0), z_dim0 in [1, inf] (z.0)" in capsys.readouterr().out
    fn = tilework.VM(tilework.load(str(out)))["main"]
    rng = np.random.default_rng(3)
    for n in (1, 3, 4):
        x, z = (rng.standard_normal((n, 4)).astype(np.float32) for _ in range(2))
        np.testing.assert_allclose(fn(x, z), ort_run(m, x, z)[0], rtol=1e-6)
    with pytest.raises(RuntimeCheckError, match="x_dim0 <= 4"):
        fn(np.zeros((5, 4), np.float32), np.zeros((5, 4), np.float32))


def test_dim_bounds_keys_of_one_dim_narrow_it_together(tmp_path: Path) -> None:
    """``dim_bounds`` by dim_param, INPUT.AXIS and generated name; keys of one dim narrow it
    together; a static axis and a name no input dim has are refused by name."""
    _save_model(tmp_path / "named.onnx")
    cm = tilework.compile(str(tmp_path / "named.onnx"), dim_bounds={"x.1": (2, 64), "seq": (None, 32)})
    assert cm.report["dims"]["seq"][:2] == [2, 32] and cm.report["dims"]["batch"][:2] == [1, None]
    _save_unnamed(tmp_path / "unnamed.onnx")
    cm = tilework.compile(str(tmp_path / "unnamed.onnx"), dim_bounds={"z.0": 8, "z_dim0": (2, None)})
    assert cm.report["dims"]["z_dim0"][:2] == [2, 8] and cm.report["dims"]["x_dim0"][:2] == [1, None]
    with pytest.raises(TileworkError, match=r"x.1 is a static dim of input x \(size 4\)"):
        tilework.compile(str(tmp_path / "unnamed.onnx"), dim_bounds={"x.1": 8})
    with pytest.raises(TileworkError, match=r"names dims the model does not have: o.0, o_dim0, x.2 \(its dynamic input dims: x_dim0 \(x.0\), z_dim0 \(z.0\)\)"):
        tilework.compile(str(tmp_path / "unnamed.onnx"), dim_bounds={"o_dim0": 8, "o.0": 8, "x.2": 8})


def test_dim_spec_forms() -> None:
    assert parse_dim_spec("seq<=512") == ("seq", (None, 512))
    assert parse_dim_spec("batch>=2") == ("batch", (2, None))
    assert parse_dim_spec("1<=seq<=64") == ("seq", (1, 64))
    with pytest.raises(TileworkError, match="expected NAME<=HI"):
        parse_dim_spec("seq<512")
    assert parse_dim_spec(" 1 <= seq <= 64 ") == ("seq", (1, 64))
    with pytest.raises(TileworkError, match="'s q' has a space in it"):  # it became a dim named sq
        parse_dim_spec("s q<=4")


def test_compile_takes_a_path_object_and_names_a_directory(tmp_path: Path) -> None:
    """``tilework.compile(pathlib.Path("m.onnx"))`` as ``tilework.load`` takes one (it was
    "cannot compile a pathlib.PosixPath"); a directory is said to be one, not a ``str``."""
    proto = _save_model(tmp_path / "m.onnx")
    cm = tilework.compile(tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(cm(x), ort_run(proto, x)[0], rtol=1e-5, atol=1e-6)
    for d in (tmp_path, str(tmp_path)):
        with pytest.raises(TileworkError, match=r"cannot compile '.*': it is a directory, not a model file"):
            tilework.compile(d)
