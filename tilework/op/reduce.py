"""Reductions: ``sum``, ``mean``, ``max``, ``min``, ``prod`` and ``logsumexp`` over a set of
axes, ``argmax`` / ``argmin`` over one axis, and ``hardmax`` (1 at the first maximum along one
axis, 0 elsewhere: the one-hot of ``argmax``, shaped like its input).

``axis=None`` reduces every axis; ``keepdims`` keeps reduced axes as size 1. Reduced dims stay
symbolic in the sense that the kept ones are exact and the reduced ones vanish (or become 1).
``max``, ``min``, ``argmax`` and ``argmin`` have no value for an empty axis, so a reduced dim
that may be 0 becomes a run-time check ``dim >= 1``.

The constructors are named like the ops (``sum``, ``max``, ...) and shadow the builtins in this
module, so nothing below them uses those builtins.

Legalization accumulates float16/bfloat16 in float32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, shape_str
from tilework.ir.loop import Scalar
from tilework.ir.sym import Dim
from tilework.op.base import (
    InferCtx,
    Op,
    OpPattern,
    axes_attr,
    bool_attr,
    int_attr,
    make_call,
    normalize_axes,
    normalize_axis,
    register,
    require_float,
    tensor_arg,
)
from tilework.op.kernel import arg, compute_dtype, op_name, out_tensor, upcast

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

REDUCE = ("sum", "mean", "max", "min", "prod")
ARG_REDUCE = ("argmax", "argmin")
_NEEDS_NONEMPTY = {"max", "min", "argmax", "argmin"}


def _require_nonempty(shape: tuple[Dim, ...], axes: Sequence[int], ctx: InferCtx) -> None:
    for a in axes:
        d = shape[a]
        if sym.prove_ge(d, 1):
            continue
        if isinstance(d, int):
            raise ctx.shape_error(f"cannot reduce the empty axis {a} of shape {shape_str(shape)}")
        ctx.require("ge", (d, 1), f"reduced axis {a} of shape {shape_str(shape)} must not be empty")


def reduced_info(x: TensorInfo, axes: tuple[int, ...] | None, keepdims: bool, dtype: str | None, ctx: InferCtx) -> TensorInfo:
    """The info of reducing ``x`` over ``axes`` (None: all of them)."""
    if x.ndim == -1:
        if axes is None and not keepdims:
            return TensorInfo((), dtype)
        return TensorInfo(None, dtype, -1)
    ax = tuple(range(x.ndim)) if axes is None else normalize_axes(axes, x.ndim, ctx)
    if x.ndim == 0:
        ax = ()  # axis 0 of a scalar names the scalar itself: nothing to reduce
    out_ndim = x.ndim if keepdims else x.ndim - len(ax)
    if x.shape is None:
        return TensorInfo(None, dtype, out_ndim)
    if ctx.op_name in _NEEDS_NONEMPTY:
        _require_nonempty(x.shape, ax, ctx)
    if keepdims:
        return TensorInfo(tuple(1 if i in ax else d for i, d in enumerate(x.shape)), dtype)
    return TensorInfo(tuple(d for i, d in enumerate(x.shape) if i not in ax), dtype)


def _infer_reduce(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    axes = axes_attr(call, "axis", ctx)
    keepdims = bool_attr(call, "keepdims", ctx)
    dtype = x.dtype
    if ctx.op_name == "mean":
        require_float(x, ctx)
    elif ctx.op_name in ("sum", "prod") and dtype == "bool":
        dtype = "int64"  # counting: a bool sum is an integer
    return reduced_info(x, axes, keepdims, dtype, ctx)


def _infer_arg_reduce(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    axis = call.attrs["axis"]
    if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int)):
        raise ctx.error(f"attribute axis must be None or an int, got {axis!r}")
    keepdims = bool_attr(call, "keepdims", ctx)
    return reduced_info(x, None if axis is None else (axis,), keepdims, "int64", ctx)


def _infer_logsumexp(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    require_float(x, ctx)
    return reduced_info(x, axes_attr(call, "axis", ctx), bool_attr(call, "keepdims", ctx), x.dtype, ctx)


def _infer_hardmax(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if x.ndim != -1:
        normalize_axis(int_attr(call, "axis", ctx), x.ndim, ctx)
    return x


# -- legalization ---------------------------------------------------------------------------


def _reduced_axes(call: Call, ndim: int) -> tuple[int, ...]:
    """The normalized axes a reduction call reduces (all of them for ``axis=None``)."""
    axis = call.attrs["axis"]
    if axis is None or ndim == 0:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted(a + ndim if a < 0 else a for a in axes))


def _source_index(out_idx: Sequence[Scalar], rvars: Sequence[Scalar], ndim: int, axes: Sequence[int], keepdims: bool) -> tuple[Scalar, ...]:
    """The input index for output index ``out_idx`` and reduction vars ``rvars`` (one per
    reduced axis, in axis order)."""
    kept = iter(i for k, i in enumerate(out_idx) if not keepdims or k not in axes)
    red = iter(rvars)
    return tuple(next(red) if k in axes else next(kept) for k in range(ndim))


def _legalize_reduce(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = op_name(call)
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    axes = _reduced_axes(call, x.ndim)
    keepdims = bool(call.attrs["keepdims"])
    acc = compute_dtype(dtype)

    def f(*i: Scalar) -> Scalar:
        if not axes:  # a 0-d input: the reduction of one element
            return te.cast(x[()], acc)
        ks = [te.reduce_axis(x.shape[a], f"k{a}") for a in axes]
        v = te.cast(x[_source_index(i, ks, x.ndim, axes, keepdims)], acc)
        if name in ("sum", "mean"):
            total = te.sum(v, axis=ks)
            if name == "sum":
                return total
            return total / te.cast(sym.product(x.shape[a] for a in axes), acc)
        reducer = {"prod": te.prod, "max": te.max, "min": te.min}[name]
        return reducer(v, axis=ks)

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [x], [out], call.info)


def _legalize_arg_reduce(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = op_name(call)
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    axes = _reduced_axes(call, x.ndim)
    keepdims = bool(call.attrs["keepdims"])
    reducer = te.argmax if name == "argmax" else te.argmin

    def f(*i: Scalar) -> Scalar:
        if not axes:
            return 0
        ks = [te.reduce_axis(x.shape[a], f"k{a}") for a in axes]
        return reducer(upcast(x[_source_index(i, ks, x.ndim, axes, keepdims)], x.dtype), axis=ks)

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [x], [out], call.info)


def _legalize_logsumexp(call: Call, ctx: "LegalizeCtx") -> Expr:
    """``m + log(sum(exp(x - m)))`` with ``m`` the maximum (``-inf`` for an empty set, where
    the result is ``-inf`` too)."""
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    axis = axes_attr(call, "axis", InferCtx("logsumexp"))
    axes = tuple(range(x.ndim)) if axis is None else tuple(sorted(normalize_axes(axis, x.ndim, InferCtx("logsumexp"))))
    keep = bool(call.attrs["keepdims"])
    acc = compute_dtype(dtype)
    rows = tuple(d for k, d in enumerate(x.shape) if k not in axes)

    def src(r: Sequence[Scalar], ks: Sequence[Scalar]) -> Scalar:
        it_r, it_k = iter(r), iter(ks)
        return te.cast(x[tuple(next(it_k) if d in axes else next(it_r) for d in range(x.ndim))], acc)

    def row_max(*r: Scalar) -> Scalar:
        ks = [te.reduce_axis(x.shape[a], f"k{a}") for a in axes]
        return te.max(src(r, ks), axis=ks) if ks else src(r, ())

    mx = te.compute(rows, row_max, "row_max")

    def row_sum(*r: Scalar) -> Scalar:
        ks = [te.reduce_axis(x.shape[a], f"k{a}") for a in axes]
        m = mx[r]
        safe = te.if_then_else(te.isinf(m), 0.0, m)
        if not ks:
            return te.exp(src(r, ()) - safe)
        return te.sum(te.exp(src(r, ks) - safe), axis=ks)

    total = te.compute(rows, row_sum, "row_sum")

    def f(*i: Scalar) -> Scalar:
        r = tuple(v for k, v in enumerate(i) if k not in axes) if keep else i
        m = mx[r]
        safe = te.if_then_else(te.isinf(m), 0.0, m)
        return safe + te.log(total[r])

    out = te.compute(shape, f, "logsumexp", dtype)
    return ctx.call_te("logsumexp", call.args, [x], [out], call.info)


def _legalize_hardmax(call: Call, ctx: "LegalizeCtx") -> Expr:
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    a = normalize_axis(int(call.attrs["axis"]), len(shape), InferCtx("hardmax"))
    rows = shape[:a] + shape[a + 1 :]

    def first_max(*r: Scalar) -> Scalar:
        k = te.reduce_axis(shape[a], "k")
        return te.argmax(upcast(x[r[:a] + (k,) + r[a:]], x.dtype), axis=k)

    am = te.compute(rows, first_max, "argmax")
    out = te.compute(shape, lambda *i: te.if_then_else(te.eq(am[i[:a] + i[a + 1 :]], i[a]), 1, 0), "hardmax", dtype)
    return ctx.call_te("hardmax", call.args, [x], [out], call.info)


for _name in REDUCE:
    register(Op(_name, _infer_reduce, OpPattern.REDUCTION, attrs={"axis": None, "keepdims": False}, num_args=1, legalize=_legalize_reduce))
for _name in ARG_REDUCE:
    register(Op(_name, _infer_arg_reduce, OpPattern.REDUCTION, attrs={"axis": None, "keepdims": False}, num_args=1, legalize=_legalize_arg_reduce))
register(Op("logsumexp", _infer_logsumexp, OpPattern.REDUCTION, attrs={"axis": None, "keepdims": False}, num_args=1, legalize=_legalize_logsumexp))
register(Op("hardmax", _infer_hardmax, OpPattern.REDUCTION, attrs={"axis": -1}, num_args=1, legalize=_legalize_hardmax))


def _axes(axis: int | Sequence[int] | None) -> tuple[int, ...] | None:
    if axis is None:
        return None
    if isinstance(axis, int):
        return (axis,)
    return tuple(axis)


def sum(x: Expr, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Call:
    """Sum over ``axis`` (None: all axes); a bool tensor sums to int64."""
    return make_call("sum", [x], axis=_axes(axis), keepdims=keepdims)


def mean(x: Expr, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Call:
    """Mean over ``axis`` (None: all axes) of a floating-point tensor."""
    return make_call("mean", [x], axis=_axes(axis), keepdims=keepdims)


def max(x: Expr, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Call:
    """Maximum over ``axis`` (None: all axes); reduced axes must not be empty."""
    return make_call("max", [x], axis=_axes(axis), keepdims=keepdims)


def min(x: Expr, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Call:
    """Minimum over ``axis`` (None: all axes); reduced axes must not be empty."""
    return make_call("min", [x], axis=_axes(axis), keepdims=keepdims)


def prod(x: Expr, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Call:
    """Product over ``axis`` (None: all axes); a bool tensor multiplies to int64."""
    return make_call("prod", [x], axis=_axes(axis), keepdims=keepdims)


def argmax(x: Expr, axis: int | None = None, keepdims: bool = False) -> Call:
    """Index (int64) of the first maximum along ``axis``; None: into the flattened tensor."""
    return make_call("argmax", [x], axis=axis, keepdims=keepdims)


def argmin(x: Expr, axis: int | None = None, keepdims: bool = False) -> Call:
    """Index (int64) of the first minimum along ``axis``; None: into the flattened tensor."""
    return make_call("argmin", [x], axis=axis, keepdims=keepdims)


def logsumexp(x: Expr, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Call:
    """``log(sum(exp(x)))`` over ``axis`` (None: all axes), computed without overflow."""
    return make_call("logsumexp", [x], axis=_axes(axis), keepdims=keepdims)


def hardmax(x: Expr, axis: int = -1) -> Call:
    """1 at the first maximum of ``x`` along ``axis``, 0 elsewhere."""
    return make_call("hardmax", [x], axis=axis)
