"""Integer division and remainder never trap (docs/semantics.md): ``INT_MIN / -1`` and a zero
divisor give defined values on every target, and torch's integer division by zero raises
``IntegerDivisionByZero`` (a ``ZeroDivisionError``) at run time, as torch does. Before, these
killed the process with SIGFPE."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import tilework as tw
from tilework import op
from tilework.errors import IntegerDivisionByZero
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Expr, Tuple, Var
from tilework.ir.info import TensorInfo
from tilework.op.math import fmod


def _trunc(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def _wrap(v: int, dtype: str) -> int:
    info = np.iinfo(dtype)
    span = int(info.max) - int(info.min) + 1
    return (v - int(info.min)) % span + int(info.min)


# name -> (graph op, the value for a nonzero divisor); a zero divisor gives 0 for all of them
OPS: dict[str, tuple[Callable[[Expr, Expr], Expr], Callable[[int, int], int]]] = {
    "divide": (op.divide, _trunc),
    "floor_divide": (op.floor_divide, lambda a, b: a // b),
    "mod": (op.mod, lambda a, b: a % b),
    "fmod": (fmod, lambda a, b: a - _trunc(a, b) * b),
}


def _all_ops_vm(dtype: str, target: str) -> Callable[..., tuple[np.ndarray, ...]]:
    """``main(x, y)`` returning every op of ``OPS`` (sorted by name), each its own kernel."""
    n = tw.dim("n")
    x, y = Var("x", TensorInfo((n,), dtype)), Var("y", TensorInfo((n,), dtype))
    bb = BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            outs = [bb.emit(OPS[name][0](x, y)) for name in sorted(OPS)]
            r = bb.emit_output(Tuple(tuple(outs)))
        bb.emit_func_output(r)
    return tw.VM(tw.build(bb.get(), target=target))["main"]


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_no_trap_and_defined_values(dtype: str, target: str) -> None:
    lo, hi = int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)
    pairs = [(lo, -1), (lo, 0), (7, 0), (0, 0), (-7, 2), (7, -2), (lo, 1), (hi, -1), (lo, lo), (-9, -3), (lo + 1, -1)]
    a = np.array([p for p, _ in pairs], dtype)
    b = np.array([q for _, q in pairs], dtype)
    outs = _all_ops_vm(dtype, target)(a, b)
    for name, got in zip(sorted(OPS), outs):
        want = [0 if q == 0 else _wrap(OPS[name][1](p, q), dtype) for p, q in pairs]
        assert got.dtype == np.dtype(dtype)
        assert got.tolist() == want, f"{name} {dtype} on {target}: {list(zip(pairs, got.tolist(), want))}"


def test_torch_integer_division_by_zero_raises() -> None:
    torch = pytest.importorskip("torch")

    class Div(torch.nn.Module):
        def forward(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", ...]:
            return x // y, x % y, torch.div(x, y, rounding_mode="trunc"), x // 3

    x = torch.tensor([7, -7, 9, 2**62], dtype=torch.int64)
    y = torch.tensor([2, 3, -4, -1], dtype=torch.int64)
    n = torch.export.Dim("n", max=1024)
    cm = tw.compile(Div(), example_args=(x, y), dynamic_shapes=({0: n}, {0: n}))
    for got, want in zip(cm(x, y), Div()(x, y)):
        assert got.tolist() == want.tolist()
    zero = torch.tensor([1, 0, 2, 5], dtype=torch.int64)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        Div()(x, zero)  # what torch does
    with pytest.raises(IntegerDivisionByZero, match="division by zero") as info:
        cm(x, zero)
    assert isinstance(info.value, ZeroDivisionError)
    # the model keeps working after the error, at another shape
    x5, y5 = torch.arange(1, 6), torch.tensor([2, -2, 3, -3, 1])
    for got, want in zip(cm(x5, y5), Div()(x5, y5)):
        assert got.tolist() == want.tolist()


def test_onnx_integer_division_gives_defined_values() -> None:
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from tests.frontend.onnx_util import compile_onnx, model, tensor

    m = model(
        [helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Mod", ["a", "b"], ["r"]), helper.make_node("Mod", ["a", "b"], ["f"], fmod=1)],
        [tensor("a", TensorProto.INT64, ["n"]), tensor("b", TensorProto.INT64, ["n"])],
        [tensor(o, TensorProto.INT64, ["n"]) for o in "qrf"],
    )
    lo = -(2**63)
    a = np.array([lo, 7, -7, lo, 9], np.int64)
    b = np.array([-1, 0, 2, 0, -4], np.int64)
    q, r, f = compile_onnx(m)(a, b)
    assert q.tolist() == [lo, 0, -3, 0, -2]
    assert r.tolist() == [0, 0, 1, 0, -3]
    assert f.tolist() == [0, 0, -1, 0, 1]
