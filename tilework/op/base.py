"""What the op families share: the registry (``tilework.ir.opdef``, re-exported here) and the
helpers of inference rules.

An operator is defined in exactly one place (a file per family under ``tilework/op``): its name,
its attributes with defaults, its struct-info inference rule, its op pattern, its legalization
and backend lowerings. ``register`` adds it to the one registry; the constructor function that
builds a ``Call`` lives beside it.
"""

from __future__ import annotations

from typing import Sequence

from tilework.errors import InferenceError
from tilework.ir import sym
from tilework.ir.dtype import DTYPES, is_float_dtype
from tilework.ir.graph import Call, Expr, ShapeExpr
from tilework.ir.info import AnyInfo, ShapeInfo, TensorInfo, shape_str
from tilework.ir.opdef import (
    DimCheck,
    InferCtx,
    Op,
    OpPattern,
    all_ops,
    get,
    infer_with_checks,
    lookup,
    make_call,
    register,
)
from tilework.ir.sym import Dim

# -- helpers shared by inference rules ----------------------------------------------------


def tensor_arg(call: Call, i: int, ctx: InferCtx) -> TensorInfo:
    """Argument ``i`` as a tensor; an unknown-typed argument is a tensor of unknown rank."""
    if i >= len(call.args):
        raise ctx.error(f"expects at least {i + 1} argument(s), got {len(call.args)}")
    info = call.args[i].info
    if isinstance(info, TensorInfo):
        return info
    if isinstance(info, AnyInfo):
        return TensorInfo(None, None, -1)
    raise ctx.error(f"argument {i} must be a tensor, got {type(info).__name__}")


def normalize_axis(axis: int, ndim: int, ctx: InferCtx) -> int:
    if not -ndim <= axis < max(ndim, 1) or (ndim == 0 and axis not in (0, -1)):
        raise ctx.error(f"axis {axis} is out of range for a tensor of rank {ndim}")
    return axis + ndim if axis < 0 else axis


def broadcast_dims(a: Dim, b: Dim, ctx: InferCtx, sa: Sequence[Dim], sb: Sequence[Dim]) -> Dim:
    """The broadcast of two dims; records a run-time check when it cannot be proved."""
    if a is b or sym.prove_eq(a, b):
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ctx.shape_error(f"shapes {shape_str(tuple(sa))} and {shape_str(tuple(sb))} do not broadcast ({a} vs {b})")
    ctx.require("broadcast", (a, b), f"dims {sym.to_str(a)} and {sym.to_str(b)} of shapes {shape_str(tuple(sa))} and {shape_str(tuple(sb))} must be equal or 1")
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    return sym.max_(a, b)


def broadcast_shapes(sa: Sequence[Dim], sb: Sequence[Dim], ctx: InferCtx) -> tuple[Dim, ...]:
    n = max(len(sa), len(sb))
    pa = (1,) * (n - len(sa)) + tuple(sa)
    pb = (1,) * (n - len(sb)) + tuple(sb)
    return tuple(broadcast_dims(x, y, ctx, sa, sb) for x, y in zip(pa, pb))


def require_equal(a: Dim, b: Dim, ctx: InferCtx, what: str) -> Dim:
    """Two dims that must be equal: an error when provably different, a check when unknown."""
    if a is b or sym.prove_eq(a, b):
        return a
    if sym.prove_ne(a, b):
        raise ctx.shape_error(f"{what}: {sym.to_str(a)} != {sym.to_str(b)}")
    ctx.require("eq", (a, b), f"{what}: {sym.to_str(a)} must equal {sym.to_str(b)}")
    return a if isinstance(a, int) or not isinstance(b, int) else b


def unify_dtype(dtypes: Sequence[str | None], ctx: InferCtx) -> str | None:
    """The common dtype of arguments that must agree; an unknown one takes the known one's."""
    known = {d for d in dtypes if d is not None}
    if len(known) > 1:
        raise ctx.error(f"dtypes disagree: {', '.join(sorted(known))}")
    return known.pop() if known else None


def normalize_axes(axes: Sequence[int], ndim: int, ctx: InferCtx) -> tuple[int, ...]:
    """``axes`` mapped into ``[0, ndim)`` in the given order; a repeated axis is an error."""
    out = tuple(normalize_axis(a, ndim, ctx) for a in axes)
    if len(set(out)) != len(out):
        raise ctx.error(f"repeated axis in {tuple(axes)} for a tensor of rank {ndim}")
    return out


def may_be_float(dtype: str | None) -> bool:
    """True for floating-point dtypes and for an unknown dtype (which may be one)."""
    return dtype is None or is_float_dtype(dtype)


def require_float(t: TensorInfo, ctx: InferCtx, what: str = "input") -> None:
    if not may_be_float(t.dtype):
        raise ctx.error(f"{what} must be a floating-point tensor, got {t.dtype}")


def shape_arg(call: Call, i: int, ctx: InferCtx) -> ShapeInfo:
    """Argument ``i`` as a shape value; an unknown-typed argument is a shape of unknown rank."""
    if i >= len(call.args):
        raise ctx.error(f"expects at least {i + 1} argument(s), got {len(call.args)}")
    info = call.args[i].info
    if isinstance(info, ShapeInfo):
        return info
    if isinstance(info, AnyInfo):
        return ShapeInfo(None, -1)
    raise ctx.error(f"argument {i} must be a shape, got {type(info).__name__}")


def to_shape_expr(shape: Expr | Sequence[Dim], op_name: str) -> Expr:
    """A constructor's shape argument: an expression is used as is, dims become a ShapeExpr."""
    if isinstance(shape, Expr):
        return shape
    values = tuple(shape)
    for d in values:
        if isinstance(d, bool) or not isinstance(d, (int, sym.SymExpr)):
            raise InferenceError(f"{op_name}: shape entries must be ints or symbolic dims, got {d!r}")
    return ShapeExpr(values)


def require_nonneg(shape: Sequence[Dim], ctx: InferCtx, what: str) -> None:
    """Dims of a requested shape: a provably negative one is an error, an unprovable one a check."""
    for d in shape:
        if sym.prove_ge(d, 0):
            continue
        if isinstance(d, int) or sym.prove_le(d, -1):
            raise ctx.shape_error(f"{what} {shape_str(tuple(shape))} has a negative dim {sym.to_str(d)}")
        ctx.require("ge", (d, 0), f"dim {sym.to_str(d)} of {what} {shape_str(tuple(shape))} must be >= 0")


def require_expands(src: Sequence[Dim], dst: Sequence[Dim], ctx: InferCtx, what: str) -> None:
    """``src`` (the shape of ``what``) broadcasts one way to ``dst``: right-aligned, each dim
    equal or 1."""
    s, d = shape_str(tuple(src)), shape_str(tuple(dst))
    if len(src) > len(dst):
        raise ctx.shape_error(f"cannot broadcast {what} {s} to {d}: too many dims")
    for a, b in zip(reversed(tuple(src)), reversed(tuple(dst))):
        if a == 1 or a is b or sym.prove_eq(a, b):
            continue
        if sym.prove_ne(a, b) and sym.prove_ne(a, 1):
            raise ctx.shape_error(f"cannot broadcast {what} {s} to {d} ({sym.to_str(a)} vs {sym.to_str(b)})")
        ctx.require("expands", (a, b), f"dim {sym.to_str(a)} of {what} {s} must be 1 or {sym.to_str(b)} to broadcast to {d}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def int_attr(call: Call, name: str, ctx: InferCtx) -> int:
    v = call.attrs[name]
    if not _is_int(v):
        raise ctx.error(f"attribute {name} must be an int, got {v!r}")
    return int(v)


def axes_attr(call: Call, name: str, ctx: InferCtx) -> tuple[int, ...] | None:
    """An axes attribute: None, an int (one axis) or a tuple of ints."""
    v = call.attrs[name]
    if v is None:
        return None
    if _is_int(v):
        return (int(v),)
    if isinstance(v, tuple) and all(_is_int(a) for a in v):
        return tuple(int(a) for a in v)
    raise ctx.error(f"attribute {name} must be None, an int or a tuple of ints, got {v!r}")


def bool_attr(call: Call, name: str, ctx: InferCtx) -> bool:
    v = call.attrs[name]
    if not isinstance(v, bool):
        raise ctx.error(f"attribute {name} must be a bool, got {v!r}")
    return v


def dtype_attr(call: Call, name: str, ctx: InferCtx) -> str | None:
    """A dtype attribute; None means "not given" (the op's rule decides)."""
    v = call.attrs[name]
    if v is None:
        return None
    if v not in DTYPES:
        raise ctx.error(f"attribute {name}: unknown dtype {v!r}; expected one of {', '.join(DTYPES)}")
    return str(v)


__all__ = [
    "OpPattern",
    "DimCheck",
    "InferCtx",
    "Op",
    "register",
    "get",
    "lookup",
    "all_ops",
    "make_call",
    "infer_with_checks",
    "tensor_arg",
    "normalize_axis",
    "broadcast_shapes",
    "broadcast_dims",
    "require_equal",
    "unify_dtype",
    "normalize_axes",
    "may_be_float",
    "require_float",
    "shape_arg",
    "to_shape_expr",
    "require_nonneg",
    "require_expands",
    "int_attr",
    "axes_attr",
    "bool_attr",
    "dtype_attr",
]
