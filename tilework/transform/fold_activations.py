"""fold_activations: an activation written out as arithmetic becomes its op.

ONNX exporters before opset 20 have no GELU; torch's writes ``F.gelu`` (the erf form) as

    h = divide(x, 1.4142135)       # or multiply(x, 0.70710677), either operand order
    e = erf(h)
    s = add(e, 1.0)                # either order
    y = multiply(multiply(x, s), 0.5)   # or multiply(multiply(x, 0.5), s); either order each

which the pass rewrites to ``gelu(x)``, the op torch.export gives for the same layer, so both
routes reach the same kernel (the fused epilogue of a linear computes
``0.5 * x * (1 + erf(x * 0.70710678))`` either way: a rounding of ``x / sqrt(2)`` apart).

Only a closed match is rewritten (``h``, ``e``, ``s`` and the inner product read by nothing
else), on float32/float64 tensors whose result has ``x``'s shape, with the constants
one-element and ``sqrt(2)``, ``1 / sqrt(2)``, 1 and 0.5 to float32's precision.

Requires a well-formed module; guarantees a well-formed module computing the same values up to
the rounding of ``x / sqrt(2)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tilework.ir.graph import Call, Constant, Expr, OpRef, bindings_of
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.op.elementwise import gelu
from tilework.pattern.core import Pattern, is_const, is_op, wildcard
from tilework.pattern.graph import PatternMatch
from tilework.pattern.rewrite import rewrite_subgraphs
from tilework.transform.base import Pass
from tilework.transform.layout_rules import same_shape

_DTYPES = ("float32", "float64")


def _either(op: str, a: Pattern, b: Pattern) -> Pattern:
    return is_op(op, a, b) | is_op(op, b, a)


def _erf_gelu() -> Pattern:
    x = wildcard("x")
    scaled = is_op("divide", x, is_const("sqrt2")) | _either("multiply", x, is_const("rsqrt2"))
    s = _either("add", is_op("erf", scaled), is_const("one"))
    return _either("multiply", _either("multiply", x, s), is_const("half")) | _either("multiply", _either("multiply", x, is_const("half")), s)


def _near(c: Expr | None, want: float) -> bool:
    """A one-element constant within float32's rounding of ``want``."""
    if not isinstance(c, Constant):
        return c is None
    data = np.asarray(c.data)
    return data.size == 1 and abs(float(data.reshape(())) - want) <= 1e-6 * abs(want)


def _fold(m: PatternMatch) -> Expr | None:
    if not m.is_closed():
        return None
    info, out = m["x"].info, m.root_binding.var.info
    if not (isinstance(info, TensorInfo) and info.dtype in _DTYPES and isinstance(out, TensorInfo) and out.dtype == info.dtype):
        return None
    if not same_shape(info.shape, out.shape):  # a constant of more dims broadcasts x to another shape
        return None
    checks = (("sqrt2", math.sqrt(2.0)), ("rsqrt2", math.sqrt(0.5)), ("one", 1.0), ("half", 0.5))
    if not all(_near(m.get(name), want) for name, want in checks):
        return None
    return gelu(m["x"])


@dataclass(frozen=True)
class FoldActivations(Pass):
    """See the module docstring."""

    name: str = "fold_activations"

    def run(self, mod: IRModule) -> IRModule:
        if not any(isinstance(b.value, Call) and isinstance(b.value.callee, OpRef) and b.value.callee.name == "erf" for _, f in mod.graph_funcs() for b in bindings_of(f)):
            return mod  # no erf, nothing to match (the block graphs are not built)
        return rewrite_subgraphs(mod, [(_erf_gelu(), _fold)])


__all__ = ["FoldActivations"]
