"""fold_activations: GELU written out as erf arithmetic (ONNX exporters before opset 20) becomes
``gelu``, in the forms exporters write; a match read inside, other constants or a broadcast to
another shape stay as they are. Numerics against the unoptimized module at rows 0, 1 and odd
counts."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tests.transform.util import ir
from tilework.ir.graph import Binding, Call, GraphFunc, OpRef, bindings_of
from tilework.transform.dead_code_elimination import DeadCodeElimination
from tilework.transform.fold_activations import FoldActivations
from tilework.transform.pipeline import Pipeline

HEAD = """
@graph
def main(x: Tensor((n, 12), "float32")):
    n = sym(lo=0)
    with dataflow():
"""
TAIL = """        output(y)
    return y
"""
ONNX = """        h = divide(x, const(1.4142135381698608, "float32"))
        e = erf(h)
        s = add(e, const(1.0, "float32"))
        p = multiply(x, s)
        y = multiply(p, const(0.5, "float32"))
"""
HALF_FIRST = """        h = multiply(const(0.7071067690849304, "float32"), x)
        e = erf(h)
        s = add(const([1.0], "float32"), e)
        p = multiply(const(0.5, "float32"), x)
        y = multiply(s, p)
"""
READ_INSIDE = ONNX.replace("        y = multiply(p, const(0.5, \"float32\"))\n", "        q = multiply(p, const(0.5, \"float32\"))\n        y = add(q, e)\n")
OTHER_CONSTANT = ONNX.replace("1.4142135381698608", "2.0")
BROADCAST = ONNX.replace('const(1.0, "float32")', 'const([[[1.0]]], "float32")')


def _ops(mod: tw.IRModule) -> list[str]:
    f = mod["main"]
    assert isinstance(f, GraphFunc)
    return [b.value.callee.name for b in bindings_of(f) if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)]


@pytest.mark.parametrize("body, folded", [(ONNX, True), (HALF_FIRST, True), (READ_INSIDE, False), (OTHER_CONSTANT, False)], ids=["onnx", "half_first", "read_inside", "other_constant"])
def test_erf_gelu_becomes_gelu(body: str, folded: bool) -> None:
    mod = ir(HEAD + body + TAIL)
    after = Pipeline([FoldActivations(), DeadCodeElimination()])(mod)
    assert ("gelu" in _ops(after) and "erf" not in _ops(after)) == folded, _ops(after)
    if not folded:
        assert _ops(after) == _ops(mod)
    got, want = tw.VM(tw.build(after, opt_level=0))["main"], tw.VM(tw.build(mod, opt_level=0))["main"]
    rng = np.random.default_rng(3)
    for n in (0, 1, 7):
        x = (rng.standard_normal((n, 12)) * 4).astype(np.float32)
        np.testing.assert_allclose(got(x), want(x), rtol=1e-6, atol=1e-6)


def test_a_constant_that_broadcasts_x_to_another_shape_stays() -> None:
    """``add(e, const([[[1.0]]]))`` makes the result 3-D: ``gelu(x)`` would be 2-D."""
    mod = ir(HEAD + BROADCAST + TAIL)
    after = Pipeline([FoldActivations(), DeadCodeElimination()])(mod)
    assert _ops(after) == _ops(mod)
