"""An executable read from a file is run with checked kernel and library calls: bytecode changed
behind a recomputed digest (the digest is not a signature) that hands a kernel or a BLAS call
buffers smaller than it writes gives a ``RuntimeCheckError`` naming the callee and the
argument, and a builtin handed the wrong kind of value gives one naming the instruction; a
freshly built executable keeps its unchecked calls."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
from tests.backend.helpers import module
from tests.fuzz.test_fuzz_executable import executable_bytes, signed, split
from tilework import op
from tilework.errors import RuntimeCheckError
from tilework.ir.sym import SymVar


def _resigned(data: bytes, change: Callable[[list[Any]], None]) -> tw.Executable:
    """``data`` with the code of its first function changed by ``change``, signed again, loaded."""
    meta, sections = split(data)
    change(meta["functions"][0]["code"])
    fd, path = tempfile.mkstemp(suffix=".tw")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(signed(meta, sections, data))
        return tw.load(path)
    finally:
        os.unlink(path)


def _call(code: list[Any], callee: str) -> list[Any]:
    return next(ins for ins in code if ins[0] == "call" and ins[3] == callee)


@pytest.mark.parametrize("target", ["cpu", "interp"])
def test_a_kernel_output_too_small_is_refused(target: str) -> None:
    def one_by_one(code: list[Any]) -> None:  # the output's shape becomes (1, 1)
        shape = next(ins for ins in code if ins[0] == "call" and ins[3] == "vm_make_shape")
        shape[4][1][1] = {"t": [0, 1, 0, 1]}

    exe = _resigned(executable_bytes(target), one_by_one)
    x, y = np.ones((64, 1000), np.float32), np.ones((1000, 64), np.float32)
    with pytest.raises(RuntimeCheckError, match=r"kernel fused_permute_dims_add: argument 2 \(gv0\) shape\[0\] = 1 but n = 64"):
        tw.VM(exe)["main"](x, y)


def test_a_builtin_handed_the_wrong_value_names_the_instruction() -> None:
    def drop_an_argument(code: list[Any]) -> None:
        del _call(code, "vm_alloc_shape_heap")[4][-1]

    exe = _resigned(executable_bytes("interp"), drop_an_argument)
    with pytest.raises(RuntimeCheckError, match=r"main: instruction 0 \(call of builtin 'vm_alloc_shape_heap'\) of the loaded executable failed: TypeError"):
        tw.VM(exe)["main"](np.ones((2, 3), np.float32), np.ones((3, 2), np.float32))


def test_a_blas_call_with_dims_past_its_buffers_is_refused() -> None:
    n = SymVar("n", 1)
    mod = module([("x", (n, 8), "float32"), ("w", (4, 8), "float32")], lambda x, w: op.linear(x, w))
    built = tw.build(mod, backends=["blas"])
    assert not built.untrusted
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.tw")
        built.save(path)
        with open(path, "rb") as f:
            data = f.read()
    x, w = np.ones((3, 8), np.float32), np.ones((4, 8), np.float32)
    ok = _resigned(data, lambda code: None)
    assert ok.untrusted
    np.testing.assert_allclose(tw.VM(ok)["main"](x, w), x @ w.T)

    def wider(code: list[Any]) -> None:  # dims (n, 4, 8) become (n, 4000, 8): out is n x 4
        _call(code, "blas.f32.linear")  # the call is there
        dims = [ins for ins in code if ins[0] == "call" and ins[3] == "vm_make_shape"][-1]
        dims[4][1][1]["t"][3] = 4000

    exe = _resigned(data, wider)
    with pytest.raises(RuntimeCheckError, match=r"blas.f32.linear: argument 1 has 32 elements, but dims \(3, 4000, 8\) need 32000"):
        tw.VM(exe)["main"](x, w)


def test_a_quant_call_with_dims_past_its_buffers_is_refused() -> None:
    from tilework.backend import quant as Q

    n, k = 16, 64
    rows = SymVar("n", 1)
    mod = module([("x", (rows, k), "float32"), ("w", (n, Q.row_bytes("q8_0", k)), "uint8")], lambda x, w: op.quant_linear(x, w, "q8_0", k))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.tw")
        tw.build(mod, backends=["quant"]).save(path)
        with open(path, "rb") as f:
            data = f.read()
    x, w = np.ones((3, k), np.float32), np.zeros((n, Q.row_bytes("q8_0", k)), np.uint8)
    np.testing.assert_array_equal(tw.VM(_resigned(data, lambda code: None))["main"](x, w), Q.qlinear(x, w, "q8_0"))

    def deeper(code: list[Any]) -> None:  # dims (n, 16, 64) become (n, 16, 6400)
        _call(code, "quant.linear.q8_0")
        dims = [ins for ins in code if ins[0] == "call" and ins[3] == "vm_make_shape"][-1]
        dims[4][1][1]["t"][5] = 6400

    with pytest.raises(RuntimeCheckError, match=r"quant.linear.q8_0: x must be a C-contiguous float32 array of 19200 elements"):
        tw.VM(_resigned(data, deeper))["main"](x, w)
