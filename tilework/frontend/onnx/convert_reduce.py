"""Converters of ONNX reductions and their relatives: ``Reduce*``, ``ArgMax``/``ArgMin``,
``Softmax``/``LogSoftmax``/``Hardmax``, ``CumSum``, ``TopK``, ``NonZero`` and ``Unique``.

The reduction axes moved from an attribute to an input (ReduceSum at schema version 13, the
others at 18); both forms are converted, as is ``noop_with_empty_axes``. Before opset 13 the
softmax family flattens the input to 2-D around ``axis``.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_shape import norm_axis
from tilework.frontend.onnx.registry import Result, converter
from tilework.frontend.onnx.values import Elem, Value
from tilework.ir import sym
from tilework.ir.graph import Expr, TupleGetItem
from tilework.ir.dtype import is_float_dtype
from tilework.ir.info import TensorInfo
from tilework.op import elementwise as ew
from tilework.op import create, index, manipulate, nn, reduce, search

# op: (kind, schema version where axes became an input, last schema version converted)
_REDUCE: dict[str, tuple[str, int, int]] = {
    "ReduceSum": ("sum", 13, 13), "ReduceMean": ("mean", 18, 18), "ReduceMax": ("max", 18, 20),
    "ReduceMin": ("min", 18, 20), "ReduceProd": ("prod", 18, 18), "ReduceL1": ("l1", 18, 18),
    "ReduceL2": ("l2", 18, 18), "ReduceSumSquare": ("sumsquare", 18, 18),
    "ReduceLogSum": ("logsum", 18, 28), "ReduceLogSumExp": ("logsumexp", 18, 28),
}  # fmt: skip
_PLAIN = {"sum": reduce.sum, "mean": reduce.mean, "max": reduce.max, "min": reduce.min, "prod": reduce.prod}


def _fold_reduce(kind: str, v: Value, keepdims: bool) -> Value | None:
    """Reductions of a tracked rank-1 value (``ReduceProd(Shape(x))``)."""
    if v.elems is None or v.ndim != 1 or kind not in ("sum", "prod", "max", "min") or any(isinstance(e, bool) for e in v.elems):
        return None
    if not v.elems and kind in ("max", "min"):
        return None
    acc: Elem = v.elems[0] if v.elems else (1 if kind == "prod" else 0)
    step = {"sum": sym.add, "prod": sym.mul, "max": sym.max_, "min": sym.min_}[kind]
    for e in v.elems[1:]:
        acc = step(acc, e)
    return Value.of_elems((acc,), v.dtype or "int64", scalar=not keepdims)


def _identity(kind: str, dtype: str) -> float | int | bool:
    """The value ONNX gives a reduction over an empty set."""
    if kind in ("sum", "sumsquare", "l1", "l2"):
        return 0
    if kind == "prod":
        return 1
    if kind == "mean":
        return math.nan
    if kind in ("logsum", "logsumexp"):
        return -math.inf
    highest = kind == "min"
    if dtype == "bool":
        return highest
    if is_float_dtype(dtype):
        return math.inf if highest else -math.inf
    info = np.iinfo(np.dtype(dtype))
    return int(info.max if highest else info.min)


def _empty_reduction(ctx: NodeCtx, kind: str, axes: tuple[int, ...] | None, keepdims: bool) -> Expr | None:
    """A reduction over a statically empty axis: the identity of the reduction, filled."""
    shape = ctx.known_shape(0)
    reduced = range(len(shape)) if axes is None else axes
    if not any(isinstance(shape[a], int) and shape[a] == 0 for a in reduced):
        return None
    out = tuple(1 if a in reduced else d for a, d in enumerate(shape) if keepdims or a not in reduced)
    dtype = ctx.dtype(0)
    return ctx.emit(create.full(out, _identity(kind, dtype), dtype))


def _reduce(kind: str, axes_input_since: int) -> Callable[[NodeCtx], Result]:
    def conv(ctx: NodeCtx) -> Result:
        rank = ctx.rank(0)
        keepdims = bool(ctx.attr("keepdims", 1))
        if ctx.version >= axes_input_since:
            axes = ctx.opt_ints(1, "axes")
        else:
            given = ctx.attr("axes", None)
            axes = None if given is None else tuple(int(a) for a in given)
        if not axes:
            if int(ctx.attr("noop_with_empty_axes", 0)):
                return ctx.value(0)
            axes = None
        norm = None if axes is None else tuple(norm_axis(ctx, a, rank) for a in axes)
        empty = _empty_reduction(ctx, kind, norm, keepdims)
        if empty is not None:
            return empty
        folded = _fold_reduce(kind, ctx.value(0), keepdims) if norm in (None, (0,)) else None
        if folded is not None:
            return folded
        x = ctx.expr(0)
        if kind in _PLAIN:
            return ctx.emit(_PLAIN[kind](x, norm, keepdims))
        if kind == "logsumexp":
            return ctx.emit(reduce.logsumexp(x, norm, keepdims))
        if kind == "l1":
            return ctx.emit(reduce.sum(ctx.emit(ew.abs(x)), norm, keepdims))
        total = ctx.emit(reduce.sum(ctx.emit(ew.multiply(x, x)) if kind != "logsum" else x, norm, keepdims))
        if kind == "l2":
            return ctx.emit(ew.sqrt(total))
        if kind == "logsum":
            return ctx.emit(ew.log(total))
        return total

    return conv


for _onnx, (_kind, _since, _hi) in _REDUCE.items():
    converter(_onnx, 1, _since - 1)(_reduce(_kind, _since))
    converter(_onnx, _since, _hi, static_inputs=(1,))(_reduce(_kind, _since))


def _arg(name: str) -> Callable[[NodeCtx], Result]:
    def conv(ctx: NodeCtx) -> Result:
        shape = ctx.known_shape(0)
        axis = norm_axis(ctx, int(ctx.attr("axis", 0)), len(shape))
        keepdims = bool(ctx.attr("keepdims", 1))
        fn = reduce.argmax if name == "argmax" else reduce.argmin
        if not int(ctx.attr("select_last_index", 0)):
            return ctx.emit(fn(ctx.expr(0), axis, keepdims))
        flipped = ctx.emit(manipulate.strided_slice(ctx.expr(0), [axis], [None], [None], [-1]))
        idx = ctx.emit(fn(flipped, axis, keepdims))
        last = Value.of_elems((sym.sub(shape[axis], 1),), "int64", scalar=True)
        return ctx.emit(ew.subtract(ctx.imp.materialize(last), idx))

    return conv


converter("ArgMax", 1, 13)(_arg("argmax"))
converter("ArgMin", 1, 13)(_arg("argmin"))


def _softmax(name: str) -> Callable[[NodeCtx], Result]:
    def apply(x: Expr, axis: int) -> Expr:
        if name == "hardmax":
            return reduce.hardmax(x, axis)
        return nn.softmax(x, axis) if name == "softmax" else nn.log_softmax(x, axis)

    def conv(ctx: NodeCtx) -> Result:
        shape = ctx.known_shape(0)
        rank = len(shape)
        if ctx.version >= 13:
            return ctx.emit(apply(ctx.expr(0), norm_axis(ctx, int(ctx.attr("axis", -1)), rank)))
        axis = norm_axis(ctx, int(ctx.attr("axis", 1)), rank)
        if axis == rank - 1:
            return ctx.emit(apply(ctx.expr(0), -1))
        flat = ctx.emit(manipulate.reshape(ctx.expr(0), (sym.product(shape[:axis]), sym.product(shape[axis:]))))
        return ctx.emit(manipulate.reshape(ctx.emit(apply(flat, -1)), shape))

    return conv


converter("Softmax", 1, 13)(_softmax("softmax"))
converter("LogSoftmax", 1, 13)(_softmax("log_softmax"))
converter("Hardmax", 1, 13)(_softmax("hardmax"))


@converter("CumSum", 11, 14, static_inputs=(1,))
def _cumsum(ctx: NodeCtx) -> Result:
    axis = norm_axis(ctx, ctx.ints(1, "axis")[0], ctx.rank(0))
    excl, rev = bool(ctx.attr("exclusive", 0)), bool(ctx.attr("reverse", 0))
    return ctx.emit(index.cumsum(ctx.expr(0), axis, excl, rev, ctx.dtype(0)))


@converter("CumProd", 26, 26, static_inputs=(1,))
def _cumprod(ctx: NodeCtx) -> Result:
    axis = norm_axis(ctx, ctx.ints(1, "axis")[0], ctx.rank(0))
    return ctx.emit(index.cumprod(ctx.expr(0), axis, bool(ctx.attr("exclusive", 0)), bool(ctx.attr("reverse", 0))))


@converter("TopK", 10, 24, static_inputs=(1,))
def _topk(ctx: NodeCtx) -> Result:
    rank = ctx.rank(0)
    axis = norm_axis(ctx, int(ctx.attr("axis", -1)), rank)
    k = ctx.scalar(1, "K")
    largest = bool(ctx.attr("largest", 1))  # "sorted" = 0 allows any order: sorted is one
    out = ctx.emit(search.topk(ctx.expr(0), k, axis, largest))
    return [ctx.emit(TupleGetItem(out, 0)), ctx.emit(TupleGetItem(out, 1))]


def _nonzero_of(ctx: NodeCtx, x: Expr, rank: int) -> Expr:
    """``nonzero(x)`` bound to ``(rank, n)`` with ``n`` a fresh sym var."""
    out = ctx.emit(search.nonzero(x))
    return ctx.imp.bb.match_cast(out, TensorInfo((rank, ctx.fresh_dim("nonzero")), "int64"))


@converter("NonZero", 9, 13)
def _nonzero(ctx: NodeCtx) -> Result:
    return _nonzero_of(ctx, ctx.expr(0), ctx.rank(0))


@converter("Unique", 11, 28)
def _unique(ctx: NodeCtx) -> Result:
    """The distinct elements, or with ``axis`` the distinct slices along it (their number is
    a fresh sym var)."""
    axis = norm_axis(ctx, int(ctx.attr("axis")), ctx.rank(0)) if ctx.has_attr("axis") else None
    out = ctx.emit(search.unique(ctx.expr(0), bool(ctx.attr("sorted", 1)), axis))
    first: Expr = ctx.emit(TupleGetItem(out, 0))
    if axis is None:
        first = ctx.refine(first)
        n = ctx.shape_of(first)[0]
    else:
        n = ctx.fresh_dim("unique")
        shape = tuple(n if k == axis else d for k, d in enumerate(ctx.known_shape(0)))
        first = ctx.imp.bb.match_cast(first, TensorInfo(shape, ctx.dtype(0)))
    fields: list[Expr] = [first]
    for i in (1, 2, 3):
        f = ctx.emit(TupleGetItem(out, i))
        if i != 2:
            f = ctx.imp.bb.match_cast(f, f.info.replace(shape=(n,), ndim=1))
        fields.append(f)
    return fields


@converter("Compress", 9, 28)
def _compress(ctx: NodeCtx) -> Result:
    """The slices of ``x`` along ``axis`` (of the flattened ``x`` without one) where the 1-D
    condition holds: a take of the condition's nonzero positions (a data-dependent length)."""
    x = ctx.expr(0)
    axis = ctx.attr("axis", None)
    if axis is None:
        x = ctx.emit(manipulate.reshape(x, (-1,)))
        axis = 0
    else:
        axis = norm_axis(ctx, int(axis), ctx.rank(0))
    length = ctx.shape_of(x)[axis]
    cond = ctx.expr(1)
    cshape = ctx.known_shape(1)
    if len(cshape) != 1:
        raise ctx.unsupported("the condition must be 1-D")
    if not sym.prove_eq(cshape[0], length):
        cond = ctx.emit(manipulate.strided_slice(cond, [0], [0], [length]))
    picked = _nonzero_of(ctx, cond, 1)
    positions = ctx.emit(manipulate.reshape(picked, (-1,)))
    return ctx.emit(manipulate.take(x, positions, axis))
