"""Rewrite rules that drop the data movement exporters write between ops.

Shared by the passes that leave such movement behind them (``fuse_attention``: the transposes
around the heads of an attention it fused; ``conv_gemm``: the transposes of channel-last data
it sinks through the graph):

- ``PERMUTE_OF_PERMUTE``: ``permute_dims(permute_dims(x, p), r)`` -> ``permute_dims(x, p[r])``,
  or ``x`` when the composition is the identity.
- ``RESHAPE_OF_RESHAPE``: ``reshape(reshape(x, s), t)`` -> ``reshape(x, t)``, or ``x`` when it
  has shape ``t``.
- ``RESHAPE_TO_OWN_SHAPE``: ``reshape(x, s)`` -> ``x`` where ``s`` is provably ``x``'s shape
  (ONNX's TorchScript export of ``scaled_dot_product_attention`` reshapes its output to the shape
  it has, between two transposes that then cancel).

Shapes are compared dim by dim with ``sym.prove_dims_eq``. Each rule gives the same values.
"""

from __future__ import annotations

from typing import Sequence

from tilework.ir.graph import Call, Expr, OpRef
from tilework.ir.info import TensorInfo
from tilework.ir.sym import Dim, prove_dims_eq
from tilework.op.manipulate import permute_dims, reshape
from tilework.pattern.core import Match, op_call
from tilework.transform.rewrite_driver import Rule


def call_of(e: Expr, m: Match, name: str) -> Call | None:
    """The call of op ``name`` that ``e`` is (or is bound to), else None."""
    v = m.ctx.resolve(e)
    return v if isinstance(v, Call) and isinstance(v.callee, OpRef) and v.callee.name == name else None


def shape_of(e: Expr) -> tuple[Dim, ...] | None:
    info = e.info
    return info.shape if isinstance(info, TensorInfo) else None


def same_shape(a: Sequence[Dim] | None, b: Sequence[Dim] | None) -> bool:
    """Both known, of one rank, and equal dim by dim for every value of their vars."""
    return a is not None and b is not None and prove_dims_eq(a, b)


def _compose_permutes(value: Expr, m: Match) -> Expr | None:
    assert isinstance(value, Call)
    inner = call_of(value.args[0], m, "permute_dims")
    if inner is None:
        return None
    p, r = inner.attrs.get("axes"), value.attrs.get("axes")
    if p is None or r is None or len(p) != len(r):
        return None
    axes = tuple(int(p[i]) for i in r)
    return inner.args[0] if axes == tuple(range(len(axes))) else permute_dims(inner.args[0], axes)


def _reshape_of_reshape(value: Expr, m: Match) -> Expr | None:
    assert isinstance(value, Call)
    inner = call_of(value.args[0], m, "reshape")
    dst = shape_of(value)
    if inner is None or dst is None:
        return None
    return inner.args[0] if same_shape(shape_of(inner.args[0]), dst) else reshape(inner.args[0], dst)


def _reshape_to_own_shape(value: Expr, m: Match) -> Expr | None:
    assert isinstance(value, Call)
    x = value.args[0]
    return x if same_shape(shape_of(x), shape_of(value)) else None


PERMUTE_OF_PERMUTE = Rule("permute_of_permute", op_call("permute_dims"), _compose_permutes)
RESHAPE_OF_RESHAPE = Rule("reshape_of_reshape", op_call("reshape"), _reshape_of_reshape)
RESHAPE_TO_OWN_SHAPE = Rule("reshape_to_own_shape", op_call("reshape"), _reshape_to_own_shape)

__all__ = ["PERMUTE_OF_PERMUTE", "RESHAPE_OF_RESHAPE", "RESHAPE_TO_OWN_SHAPE", "call_of", "same_shape", "shape_of"]
