"""The ways to choose backends: ``tilework.build(backends=...)``, the CLI's ``--backends``,
``tilework.compile(backends=...)``; and an executable with offloaded calls saved here and run
in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tilework
from tests.backend.helpers import close, module, rand
from tilework import op
from tilework.cli import main as cli
from tilework.errors import UnsupportedError
from tilework.ir.sym import SymVar

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _mlp() -> tilework.IRModule:
    n = SymVar("n", 1, 64)
    return module(
        [("x", (n, 8), "float32"), ("w1", (16, 8), "float32"), ("b1", (16,), "float32"), ("w2", (4, 16), "float32")],
        lambda x, w1, b1, w2: op.linear(op.silu(op.linear(x, w1, b1)), w2),
    )


def _args(rows: int) -> list[np.ndarray]:
    rng = np.random.default_rng(rows)
    return [rand(rng, (rows, 8)), rand(rng, (16, 8)), rand(rng, (16,)), rand(rng, (4, 16))]


def _want(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    h = x @ w1.T + b1
    return (h / (1 + np.exp(-h))) @ w2.T


def test_cli_build_with_backends(tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]) -> None:
    src = os.path.join(tmp_path, "m.tw.txt")
    out = os.path.join(tmp_path, "m.tw")
    with open(src, "w") as fh:
        fh.write(str(_mlp()))
    assert cli(["build", src, "-o", out, "--backends", "blas,codegen"]) == 0
    assert "with backends blas,codegen" in capsys.readouterr().out
    exe = tilework.load(out)
    assert exe.meta["backends"] == ["blas", "codegen"]
    args = _args(3)
    close(tilework.VM(exe)["main"](*args), _want(*args))
    assert cli(["build", src, "-o", out, "--backends", "blas,nope"]) == 2
    assert "unknown backend 'nope'" in capsys.readouterr().err


def test_saved_offloaded_executable_runs_in_a_fresh_process(tmp_path: os.PathLike[str]) -> None:
    pytest.importorskip("onnxruntime", reason="the region part of this test needs onnxruntime")
    pytest.importorskip("onnx", reason="the region part of this test needs onnx")
    path = os.path.join(tmp_path, "m.tw")
    exe = tilework.build(_mlp(), backends=["blas", "onnxruntime", "codegen"])
    exe.save(path)
    args = _args(5)
    np.savez(os.path.join(tmp_path, "args.npz"), *args)
    code = (
        "import sys, numpy as np, tilework\n"
        "d = sys.argv[1]; a = np.load(d + '/args.npz')\n"
        "out = tilework.VM(tilework.load(d + '/m.tw'))['main'](*[a[f'arr_{i}'] for i in range(4)])\n"
        "np.save(d + '/out.npy', out)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.abspath(ROOT))
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env, timeout=120)
    close(np.load(os.path.join(tmp_path, "out.npy")), _want(*args))


def test_compile_takes_backends_and_explains_them() -> None:
    cm = tilework.compile(_mlp(), backends=["blas", "codegen"])
    args = _args(2)
    close(cm(*args), _want(*args))
    assert "backends: blas, codegen" in cm.explain()
    with pytest.raises(UnsupportedError, match="placement='bogus': not 'auto' and no such placement file"):
        tilework.compile(_mlp(), placement="bogus")  # placement="auto": tests/collage
