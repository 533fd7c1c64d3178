"""Operators: one registry (``tilework.op.base``), one file per family.

Importing this package registers every op. The functions here build (unnormalized) calls;
``BlockBuilder.emit`` normalizes them and infers their struct info.
"""

from __future__ import annotations

from tilework.ir.graph import Call, Expr
from tilework.op import calls, elementwise
from tilework.op.base import DimCheck, Op, OpPattern, all_ops, get, infer_with_checks, make_call, register
from tilework.op.calls import call_lib, call_packed, call_tensor
from tilework.op.elementwise import astype, where


def _unary(name: str):  # type: ignore[no-untyped-def]
    def f(x: Expr) -> Call:
        return make_call(name, [x])

    f.__name__ = name
    f.__doc__ = f"Elementwise ``{name}``."
    return f


def _binary(name: str):  # type: ignore[no-untyped-def]
    def f(a: Expr, b: Expr) -> Call:
        return make_call(name, [a, b])

    f.__name__ = name
    f.__doc__ = f"Elementwise ``{name}`` with NumPy broadcasting."
    return f


for _n in elementwise.UNARY:
    globals()[_n] = _unary(_n)
for _n in elementwise.ARITH + elementwise.COMPARE + elementwise.LOGICAL:
    globals()[_n] = _binary(_n)

__all__ = [
    "DimCheck",
    "Op",
    "OpPattern",
    "all_ops",
    "get",
    "infer_with_checks",
    "make_call",
    "register",
    "call_lib",
    "call_packed",
    "call_tensor",
    "astype",
    "where",
    *elementwise.UNARY,
    *elementwise.ARITH,
    *elementwise.COMPARE,
    *elementwise.LOGICAL,
]
