"""Every row of the table in ``docs/errors.md`` is a test: the bad input it names gives the
message it shows, never a traceback.

A row's "Try" cell is run as written, in a directory holding the files the table names:
``tilework ...`` through ``tilework.cli.main`` (exit status and stderr), ``python -m
tilework ...`` through ``runpy`` as ``python -m`` does, anything else as a Python expression over the names below (the
exception's class and message). A message cell matches the start of the message; ``…`` stands
for any text within a line, ``\\n`` for a line break.
"""

from __future__ import annotations

import os
import re
import runpy
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
from tilework.cli import main

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "errors.md"

TEXT_MODULE = '''@graph
def main(x: Tensor((n, m), "float32"), y: Tensor((m, n), "float32")) -> Tensor((n, m), "float32"):
    n = sym(lo=1, hi=64)
    m = sym(lo=1)
    with dataflow():
        lv0: Tensor((n, m), "float32") = permute_dims(y, axes=None)
        gv0: Tensor((n, m), "float32") = add(x, lv0)
        output(gv0)
    return gv0
'''


def _deep_text(depth: int) -> str:
    body = "add(" * depth + "x" + ", x)" * depth
    return f'@graph\ndef main(x: Tensor((4,), "float32")) -> Tensor((4,), "float32"):\n    y: Tensor((4,), "float32") = {body}\n    return y\n'


def _unary_chain(depth: int) -> str:
    return f'@graph\ndef main(x: Tensor(({"-" * depth}4,), "float32")) -> Tensor((4,), "float32"):\n    return x\n'


def _relu_onnx(opset: int = 17) -> bytes:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"])
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 4]) for n in ("x", "y")]
    model = helper.make_model(helper.make_graph([node], "g", io[:1], io[1:]), opset_imports=[helper.make_opsetid("", opset)])
    if opset <= onnx.defs.onnx_opset_version():
        onnx.checker.check_model(model)
    return model.SerializeToString()


def _make_files(d: Path) -> None:
    rng = np.random.default_rng(0)
    (d / "m.txt").write_text(TEXT_MODULE)
    (d / "notes.xyz").write_text("these are my notes\n")
    (d / "model.xyz").write_bytes(bytes([0x08, 0xFF, 0xFE, 0x00]) + rng.bytes(60))
    (d / "empty.txt").write_text("# nothing here\n")
    tw.build(tw.parse(TEXT_MODULE), target="interp").save(str(d / "m.tw"))
    data = (d / "m.tw").read_bytes()
    (d / "trunc.tw").write_bytes(data[: len(data) // 2])
    (d / "loop.txt").write_text(tw.load(str(d / "m.tw")).loop_ir())
    (d / "project").mkdir()  # a project of the user's: its own model.c and Makefile
    (d / "project" / "model.c").write_text("int main(void) { return 0; }\n")
    (d / "project" / "Makefile").write_text("all: ; echo my project\n")
    (d / "empty.tw").write_bytes(b"")
    np.save(d / "x.npy", rng.standard_normal((2, 3)).astype(np.float32))
    np.save(d / "y.npy", rng.standard_normal((3, 2)).astype(np.float32))
    np.save(d / "x3.npy", np.zeros((2, 3, 4), np.float32))
    np.save(d / "xi.npy", np.zeros((2, 3), np.int64))
    np.save(d / "x65.npy", np.zeros((65, 3), np.float32))
    np.save(d / "y65.npy", np.zeros((3, 65), np.float32))
    np.save(d / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (d / "junk.npy").write_text("not an array\n")
    (d / "junk.pt2").write_text("not a zip archive\n")
    with open(d / "npz.pt2", "wb") as f:
        np.savez(f, a=np.ones(3))
    (d / "junk.gguf").write_text("hello\n")
    (d / "zero.onnx").write_bytes(b"")
    (d / "text.onnx").write_text(TEXT_MODULE)
    try:
        relu = _relu_onnx()
    except pytest.skip.Exception:
        return
    (d / "relu.onnx").write_bytes(relu)
    (d / "opset99.onnx").write_bytes(_relu_onnx(opset=99))
    (d / "trunc.onnx").write_bytes(relu[: len(relu) // 2])
    _external_data_onnx(d / "noext.onnx")
    (d / "noext.data").unlink()  # the model without its external-data file


def _external_data_onnx(path: Path) -> None:
    """``x + w`` with the initializer ``w`` in ``noext.data`` beside the model."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 4]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", io[:1], io[1:], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, str(path), save_as_external_data=True, location="noext.data", size_threshold=0)


class _Names(dict):  # type: ignore[type-arg]
    """The names a Python row may use; the costly ones are made on first use."""

    def __missing__(self, key: str) -> Any:
        makers: dict[str, Callable[[], Any]] = {"ADD2": _compiled_add, "from_onnx": _from_onnx, "torch": lambda: pytest.importorskip("torch"), "NUMPY_MODEL": _numpy_model, "EMBED": _compiled_embedding}
        if key not in makers:
            raise KeyError(key)
        self[key] = value = makers[key]()
        return value


def _compiled_embedding() -> Any:
    torch = pytest.importorskip("torch")
    n = torch.export.Dim("n", max=64)
    return tw.compile(torch.nn.Embedding(10, 4), (torch.tensor([1, 2]),), ({0: n},))


def _compiled_add() -> Any:
    torch = pytest.importorskip("torch")

    class Add(torch.nn.Module):
        def forward(self, x: Any, y: Any) -> Any:
            return x + y

    return tw.compile(Add(), (torch.ones(2, 3), torch.ones(2, 3)), target="interp")  # no C compiler run


def _numpy_model() -> Any:
    torch = pytest.importorskip("torch")

    class NumpyModel(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return x.numpy()

    return NumpyModel()


def _from_onnx() -> Any:
    pytest.importorskip("onnx")
    from tilework.frontend.onnx import from_onnx

    return from_onnx


def _namespace() -> _Names:
    names = _Names(tw=tw, np=np, DEEP_TEXT=_deep_text(100), UNARY_CHAIN=_unary_chain(5000))
    names["VM"] = tw.VM(tw.load("m.tw"))
    names["X"], names["Y"], names["X3"] = np.load("x.npy"), np.load("y.npy"), np.load("x3.npy")
    return names


def _cells(line: str) -> list[str]:
    cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
    return [c[1:-1] if len(c) >= 2 and c[0] == c[-1] == "`" else c for c in cells]


def table_rows() -> list[tuple[str, str, str, str]]:
    """``(input, try, result, message)`` of each row of the table."""
    rows = []
    in_table = False
    for line in TABLE.read_text().splitlines():
        if line.startswith("| Bad input |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not set(line) <= set("|- "):
            cells = _cells(line)
            assert len(cells) == 4, f"docs/errors.md: a row needs 4 cells: {line}"
            rows.append((cells[0], cells[1], cells[2], cells[3]))
    return rows


def _pattern(cell: str) -> re.Pattern[str]:
    parts = [re.escape(p) for p in cell.replace("\\n", "\n").split("…")]
    return re.compile("[^\n]*".join(parts))


def _needs(code: str) -> None:
    if ".pt2" in code or "ADD2" in code or "torch" in code or "NUMPY_MODEL" in code:
        pytest.importorskip("torch")
    if ".onnx" in code:
        pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("errors")
    _make_files(d)
    return d


@pytest.fixture(scope="module")
def names(workdir: Path) -> _Names:
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        return _namespace()
    finally:
        os.chdir(cwd)


ROWS = table_rows()


def test_the_table_covers_the_cases_of_the_issue() -> None:
    tried = " ".join(r[1] for r in ROWS)
    for case in ("DEEP_TEXT", "zero.onnx", "trunc.onnx", "ADD2(", "junk.npy", "model.xyz", "python -m tilework", "--debug"):
        assert case in tried, f"docs/errors.md has no row for {case}"
    assert any(r[1] == "tilework" for r in ROWS), "docs/errors.md has no row for a bare `tilework`"


@pytest.mark.parametrize("row", ROWS, ids=[r[1] for r in ROWS])
def test_error_table_row(row: tuple[str, str, str, str], workdir: Path, names: _Names, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    what, code, result, message = row
    _needs(code)
    monkeypatch.chdir(workdir)
    if code.startswith(("tilework", "python -m tilework")):
        status, err = _run_cli(code, capsys)
        assert result == f"exit {status}", f"{code}: exit status {status}, the table says {result}\n{err}"
        assert ("Traceback" in err) == ("--debug" in code), f"{code}: a traceback only with --debug\n{err}"
        start = min((m.start() for m in re.finditer(r"^(error|usage|internal error):", err, re.M)), default=0)
        err = err[start:]
    else:
        with pytest.raises(Exception) as info:
            eval(code, {}, names)
        name = type(info.value).__name__
        assert name == result, f"{code}: raised {name}: {info.value}"
        assert isinstance(info.value, tw.TileworkError), f"{code}: {name} is not a tilework error"
        err = str(info.value)
    assert _pattern(message).match(err), f"{code} ({what}): the message does not start as the table says\n  table: {message}\n  got:   {err}"


def _run_cli(code: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    argv = shlex.split(code)
    try:
        if argv[:3] == ["python", "-m", "tilework"]:  # what `python -m` runs, in this process
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(sys, "argv", ["tilework", *argv[3:]])
                runpy.run_module("tilework", run_name="__main__", alter_sys=True)
            status = 0
        else:
            status = main(argv[1:])
    except SystemExit as e:  # __main__'s exit, or argparse's own usage errors
        status = int(e.code or 0)
    return status, capsys.readouterr().err
