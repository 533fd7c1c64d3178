"""inline_scalar_constants: one-element constants passed to a kernel become literals in it (the
calls lose those arguments, the kernel those params), the clamp against a literal bound is
emitted as the one-select form; a kernel whose callers pass different values keeps that param,
one whose callers all pass the same value loses it; numerics are unchanged, NaN and signed zeros
included."""

from __future__ import annotations

import numpy as np
import pytest

from tests.transform.util import ir
from tilework.codegen.c.emit import emit_module
from tilework.ir.graph import Call, Constant, Tuple
from tilework.ir.loop import Buffer, TensorFunc
from tilework.transform.inline_scalar_constants import InlineScalarConstants
from tilework.transform.legalize import Legalize
from tilework.transform.pipeline import Pipeline, kernel_passes
import tilework as tw

HARDSWISH = """
@graph
def main(x: Tensor((n, 40), "float32")):
    n = sym(lo=1)
    with dataflow():
        a = divide(x, const(6.0, "float32"))
        b = add(a, const(0.5, "float32"))
        c = maximum(b, const(0.0, "float32"))
        d = minimum(c, const(1.0, "float32"))
        gv = multiply(x, d)
        output(gv)
    return gv
"""


def _kernels(mod: object) -> dict[str, TensorFunc]:
    return {name: f for name, f in mod.tensor_funcs()}  # type: ignore[attr-defined]


def _calls(mod: object) -> list[Call]:
    main = mod["main"]  # type: ignore[index]
    return [b.value for block in main.body.blocks for b in block.bindings if isinstance(b.value, Call) and getattr(b.value.callee, "name", "") == "call_tensor"]


def test_constants_become_literals_of_the_fused_kernel() -> None:
    fused = Pipeline([Legalize(), *kernel_passes()[:-1]])(ir(HARDSWISH))
    out = InlineScalarConstants()(fused)
    (before,), (after,) = _calls(fused), _calls(out)
    assert sum(isinstance(a, Constant) for a in before.args[1].fields) == 4  # type: ignore[union-attr]
    assert isinstance(after.args[1], Tuple) and not any(isinstance(a, Constant) for a in after.args[1].fields)
    (kernel,) = _kernels(out).values()
    assert len([p for p in kernel.params if isinstance(p, Buffer)]) == 2  # x and the result
    c = emit_module({"k": kernel}).text
    assert "tw_maxc_f(" in c and "tw_minc_f(" in c and "6.0f" in c


def test_numerics_unchanged_nan_and_signed_zeros_included() -> None:
    x = np.array([[np.nan, -0.0, 0.0, -3.0, 3.0, -1e-30, 1e30, -np.inf, np.inf, 2.5] * 4], np.float32)
    want = np.asarray(tw.VM(tw.build(ir(HARDSWISH), post_legalize_passes=[]))["main"](x))
    got = np.asarray(tw.VM(tw.build(ir(HARDSWISH)))["main"](x))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)) or np.array_equal(got, want, equal_nan=True)
    assert np.signbit(got).tolist() == np.signbit(want).tolist()


@pytest.mark.parametrize(("second", "inlined"), [(3.0, False), (2.0, True)])
def test_a_kernel_with_two_callers(second: float, inlined: bool) -> None:
    """Different values at one param: it stays; the same value at every call: a literal."""
    text = f"""
    @graph
    def main(x: Tensor((4,), "float32"), y: Tensor((4,), "float32")):
        with dataflow():
            a = multiply(x, const(2.0, "float32"))
            b = multiply(y, const({second}, "float32"))
            gv = (a, b)
            output(gv)
        return gv
    """
    legal = Legalize()(ir(text))
    calls = _calls(legal)
    assert len(calls) == 2 and calls[0].args[0].name == calls[1].args[0].name  # type: ignore[union-attr]
    out = InlineScalarConstants()(legal)
    assert [len(c.args[1].fields) for c in _calls(out)] == ([1, 1] if inlined else [2, 2])  # type: ignore[union-attr]
    (kernel,) = _kernels(out).values()
    assert len([p for p in kernel.params if isinstance(p, Buffer)]) == (2 if inlined else 3)
    got = tw.VM(tw.build(ir(text)))["main"](np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32) + 1)
    np.testing.assert_array_equal(np.asarray(got[0]), np.arange(4) * 2.0)
    np.testing.assert_array_equal(np.asarray(got[1]), (np.arange(4) + 1) * second)
