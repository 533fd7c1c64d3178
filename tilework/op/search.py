"""Searching and ordering: ``topk`` (which also sorts: ``k`` equal to the dim), ``nonzero`` and
``unique``; the last two have data-dependent result shapes.

- ``topk(x, k, axis, largest)``: a tuple ``(values, indices)`` with the ``k`` largest (or
  smallest) elements along ``axis`` in order, ties broken by the lower index (a stable sort).
  ``k`` may be symbolic.
- ``nonzero(x)``: the int64 coordinates ``(x.ndim, n)`` of the ``n`` nonzero elements, in
  row-major order. ``n`` is known only at run time.
- ``unique(x, sorted, axis)``: over the flattened ``x``, a tuple ``(values, first_indices,
  inverse_indices, counts)``: the distinct values (ascending when ``sorted``, else in order of
  first occurrence), where each first occurs, the position in ``values`` of every element, and
  how often each occurs (ONNX's Unique). With an ``axis``, the items are the slices along it,
  compared whole and ordered lexicographically (each read in row-major order of the other
  dims); ``values`` is ``x`` with the ``n`` distinct slices along ``axis``. NaNs are equal to
  each other and sort after every number (NumPy's ``unique``, ``equal_nan=True``): all NaNs are
  one item, first where the first NaN is. onnxruntime's result for NaN is not defined (it
  differs with the order of the input), so NumPy's is the reference.

Inference leaves a data-dependent length unknown (``nonzero`` is ``Tensor(ndim=2)``); callers
bind it with a ``match_cast`` to a fresh sym var. Legalization does the same inside: a first
kernel counts, the VM reads the count into a fresh sym var (``vm_tensor_to_shape`` +
``match_cast``), and a second kernel fills a result of that length. The kernels compare every
pair of elements along the searched axis (quadratic in its length): simple and branch-free,
meant for the modest sizes these ops see in models (masks, token ids).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from tilework import te
from tilework.ir import sym
from tilework.ir.dtype import is_float_dtype
from tilework.ir.graph import Call, Expr
from tilework.ir.info import ShapeInfo, StructInfo, TensorInfo, TupleInfo
from tilework.ir.loop import Scalar
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.op.base import InferCtx, Op, OpPattern, bool_attr, int_attr, make_call, normalize_axis, register, require_nonneg, tensor_arg
from tilework.op.kernel import arg, known_tensor, reshape_index, upcast
from tilework.op.shape import read_shape

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

_serial = itertools.count()


def _infer_topk(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    k = call.attrs["k"]
    if isinstance(k, bool) or not isinstance(k, (int, SymExpr)):
        raise ctx.error(f"attribute k must be an int or a symbolic dim, got {k!r}")
    bool_attr(call, "largest", ctx)
    require_nonneg((k,), ctx, "k")
    if x.ndim == -1 or x.shape is None:
        return TupleInfo((TensorInfo(None, x.dtype, x.ndim), TensorInfo(None, "int64", x.ndim)))
    a = normalize_axis(int_attr(call, "axis", ctx), x.ndim, ctx)
    d = x.shape[a]
    if not sym.prove_le(k, d):
        if isinstance(k, int) and isinstance(d, int):
            raise ctx.shape_error(f"k = {k} exceeds dim {a} ({d}) of the input")
        ctx.require("ge", (d, k), f"k = {sym.to_str(k)} must not exceed dim {a} ({sym.to_str(d)})")
    shape = x.shape[:a] + (k,) + x.shape[a + 1 :]
    return TupleInfo((TensorInfo(shape, x.dtype), TensorInfo(shape, "int64")))


def _legalize_topk(call: Call, ctx: "LegalizeCtx") -> Expr:
    """Each element's rank is the number of elements that beat it; output ``j`` holds the
    element of rank ``j``."""
    x = arg(call, 0, "x")
    info = call.info
    assert isinstance(info, TupleInfo)
    shape, dtype = known_tensor(info.fields[0], call, "the values")
    a = normalize_axis(int(call.attrs["axis"]), x.ndim, InferCtx("topk"))
    largest = bool(call.attrs["largest"])
    d = x.shape[a]

    def at(i: tuple[Scalar, ...], pos: Scalar) -> Scalar:
        return upcast(x[i[:a] + (pos,) + i[a + 1 :]], x.dtype)

    def rank_of(*i: Scalar) -> Scalar:
        q = te.reduce_axis(d, "q")
        vq, ve = at(i, q), at(i, i[a])
        beats = te.gt(vq, ve) if largest else te.lt(vq, ve)
        tie = te.logical_and(te.eq(vq, ve), te.lt(q, i[a]))
        return te.sum(te.if_then_else(te.logical_or(beats, tie), 1, 0), axis=q)

    rank = te.compute(x.shape, rank_of, "rank")

    def index_of(*o: Scalar) -> Scalar:
        e = te.reduce_axis(d, "e")
        return te.sum(te.if_then_else(te.eq(rank[o[:a] + (e,) + o[a + 1 :]], o[a]), e, 0), axis=e)

    idx = te.compute(shape, index_of, "indices", "int64")
    vals = te.compute(shape, lambda *o: x[o[:a] + (idx[o],) + o[a + 1 :]], "values", dtype)
    return ctx.call_te("topk", call.args, [x], [vals, idx], call.info)


register(Op("topk", _infer_topk, OpPattern.OPAQUE, attrs={"k": 1, "axis": -1, "largest": True}, num_args=1, legalize=_legalize_topk))


def topk(x: Expr, k: Dim, axis: int = -1, largest: bool = True) -> Call:
    """``(values, indices)`` of the ``k`` largest (or smallest) elements along ``axis``, in
    order; ties keep the lower index first."""
    return make_call("topk", [x], k=k, axis=axis, largest=largest)


# -- data-dependent lengths ---------------------------------------------------------------------


def _lift_count(ctx: "LegalizeCtx", call: Call, x: te.Tensor, count: te.Tensor, hint: str) -> SymVar:
    """Run the kernel computing ``count`` (a ``(1,)`` int64 tensor) from the call's input ``x``
    and bind its value to a fresh sym var."""
    c = ctx.bb.emit(ctx.call_te(f"{hint}_count", call.args, [x], [count], TensorInfo((1,), "int64")))
    shape = ctx.bb.emit(read_shape(c))
    n = SymVar(f"{hint}{next(_serial)}", 0)
    ctx.bb.match_cast(shape, ShapeInfo((n,)))
    return n


def _flat(x: te.Tensor) -> tuple[Dim, te.Tensor]:
    """The number of elements of ``x`` and a stage holding ``x != 0`` flattened (as int64)."""
    total = sym.product(x.shape)
    nz = te.compute((total,), lambda p: te.if_then_else(te.ne(x[reshape_index((p,), (total,), x.shape)], 0), 1, 0), "nz", "int64")
    return total, nz


def _infer_nonzero(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if x.ndim == 0:
        raise ctx.shape_error("nonzero of a 0-d tensor is not defined; reshape it to (1,) first")
    return TensorInfo(None, "int64", 2)


def _legalize_nonzero(call: Call, ctx: "LegalizeCtx") -> Expr:
    x = arg(call, 0, "x")
    total, nz = _flat(x)
    count = te.compute((1,), lambda c: te.sum(nz[(q := te.reduce_axis(total, "q"))], axis=q), "count")
    n = _lift_count(ctx, call, x, count, "nnz")
    total2, nz2 = _flat(x)

    def before(p: Scalar) -> Scalar:
        q = te.reduce_axis(total2, "q")
        return te.sum(nz2[q], axis=q, where=te.lt(q, p))

    prefix = te.compute((total2,), before, "prefix")

    def position(j: Scalar) -> Scalar:
        p = te.reduce_axis(total2, "p")
        hit = te.logical_and(te.eq(nz2[p], 1), te.eq(prefix[p], j))
        return te.sum(te.if_then_else(hit, p, 0), axis=p)

    pos = te.compute((n,), position, "position", "int64")

    def coord(dim: Scalar, j: Scalar) -> Scalar:
        coords = reshape_index((pos[j],), (total2,), x.shape)
        value: Scalar = coords[-1]
        for k in range(len(coords) - 2, -1, -1):
            value = te.if_then_else(te.eq(dim, k), coords[k], value)
        return value

    out = te.compute((x.ndim, n), coord, "nonzero", "int64")
    return ctx.call_te("nonzero", call.args, [x], [out], TensorInfo((x.ndim, n), "int64"))


register(Op("nonzero", _infer_nonzero, OpPattern.OPAQUE, num_args=1, legalize=_legalize_nonzero))


def nonzero(x: Expr) -> Call:
    """The coordinates ``(x.ndim, n)`` (int64) of the nonzero elements of ``x``."""
    return make_call("nonzero", [x])


def _infer_unique(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    bool_attr(call, "sorted", ctx)
    if call.attrs["axis"] is None:
        total: Dim | None = None if x.shape is None else sym.product(x.shape)
        inverse = TensorInfo(None if total is None else (total,), "int64", 1)
        return TupleInfo((TensorInfo(None, x.dtype, 1), TensorInfo(None, "int64", 1), inverse, TensorInfo(None, "int64", 1)))
    if x.ndim < 0:
        raise ctx.error("unique along an axis needs an input of known rank")
    axis = normalize_axis(int_attr(call, "axis", ctx), x.ndim, ctx)
    length = None if x.shape is None else (x.shape[axis],)
    return TupleInfo((TensorInfo(None, x.dtype, x.ndim), TensorInfo(None, "int64", 1), TensorInfo(length, "int64", 1), TensorInfo(None, "int64", 1)))


class _Slices:
    """The input as ``count`` items compared as wholes: its elements (no axis), or its slices
    along ``axis``, each read in row-major order of the other dims. ``same``/``before`` are
    the item comparisons (``before``: lexicographically smaller). Elements compare in a total
    order, NaN equal to NaN and after every number: the keys of the firsts are then exactly
    ``0 .. n-1``, so every index the fill kernel computes lies inside the input."""

    def __init__(self, x: te.Tensor, axis: int | None) -> None:
        self.x, self.axis = x, axis
        self.floats = is_float_dtype(x.dtype)
        self.rest: tuple[Dim, ...]
        self.width: Dim
        if axis is None:
            self.count, self.rest, self.width = sym.product(x.shape), (), 1
            return
        self.count = x.shape[axis]
        self.rest = tuple(d for k, d in enumerate(x.shape) if k != axis)
        self.width = sym.product(self.rest)
        # each pair of slices: the first position where they differ (0 where they are equal)
        self.diff = te.compute((self.count, self.count), lambda p, q: te.argmax(te.if_then_else(self.eq(self.at(p, (r := te.reduce_axis(self.width, "r"))), self.at(q, r)), 0, 1), axis=r), "first_diff", "int64")

    def at(self, p: Scalar, r: Scalar) -> Scalar:
        """Element ``r`` of item ``p``."""
        if self.axis is None:
            return upcast(self.x[reshape_index((p,), (self.count,), self.x.shape)], self.x.dtype)
        inner = tuple(reshape_index((r,), (self.width,), self.rest)) if self.rest else ()
        return upcast(self.x[(*inner[: self.axis], p, *inner[self.axis :])], self.x.dtype)

    def eq(self, a: Scalar, b: Scalar) -> Scalar:
        """Elements equal, NaN equal to NaN."""
        if not self.floats:
            return te.eq(a, b)
        return te.logical_or(te.eq(a, b), te.logical_and(te.isnan(a), te.isnan(b)))

    def lt(self, a: Scalar, b: Scalar) -> Scalar:
        """``a`` before ``b``, NaN after every number."""
        if not self.floats:
            return te.lt(a, b)
        return te.logical_or(te.lt(a, b), te.logical_and(te.isnan(b), te.logical_not(te.isnan(a))))

    def same(self, p: Scalar, q: Scalar) -> Scalar:
        d = 0 if self.axis is None else self.diff[p, q]
        return self.eq(self.at(p, d), self.at(q, d))

    def before(self, p: Scalar, q: Scalar) -> Scalar:
        d = 0 if self.axis is None else self.diff[p, q]
        return self.lt(self.at(p, d), self.at(q, d))


def _legalize_unique(call: Call, ctx: "LegalizeCtx") -> Expr:
    """An item (an element, or a slice along the axis) is a *first* when no earlier item equals
    it; each first gets a key (its rank among the firsts when sorted, else the number of firsts
    before it), and the key is the output position."""
    x = arg(call, 0, "x")
    is_sorted = bool(call.attrs["sorted"])
    axis = None if call.attrs["axis"] is None else normalize_axis(int(call.attrs["axis"]), x.ndim, InferCtx("unique"))
    items = _Slices(x, axis)
    total = items.count

    def first_of(p: Scalar) -> Scalar:
        q = te.reduce_axis(total, "q")
        dup = te.sum(te.if_then_else(items.same(q, p), 1, 0), axis=q, where=te.lt(q, p))
        return te.if_then_else(te.eq(dup, 0), 1, 0)

    def stages() -> tuple[te.Tensor, te.Tensor]:
        first = te.compute((total,), first_of, "first", "int64")

        def key_of(p: Scalar) -> Scalar:
            q = te.reduce_axis(total, "q")
            earlier = items.before(q, p) if is_sorted else te.lt(q, p)
            return te.sum(te.if_then_else(te.logical_and(te.eq(first[q], 1), earlier), 1, 0), axis=q)

        return first, te.compute((total,), key_of, "key", "int64")

    first0, _ = stages()
    count = te.compute((1,), lambda c: te.sum(first0[(q := te.reduce_axis(total, "q"))], axis=q), "count")
    n = _lift_count(ctx, call, x, count, "nuniq")
    items = _Slices(x, axis)  # the stages again, in the kernel that fills the results
    first, key = stages()

    def first_index(j: Scalar) -> Scalar:
        p = te.reduce_axis(total, "p")
        return te.sum(te.if_then_else(te.logical_and(te.eq(first[p], 1), te.eq(key[p], j)), p, 0), axis=p)

    idx = te.compute((n,), first_index, "indices", "int64")
    if axis is None:
        vshape: tuple[Dim, ...] = (n,)
        values = te.compute(vshape, lambda j: x[reshape_index((idx[j],), (total,), x.shape)], "values", x.dtype)
    else:
        vshape = tuple(n if k == axis else d for k, d in enumerate(x.shape))
        values = te.compute(vshape, lambda *i: x[(*i[:axis], idx[i[axis]], *i[axis + 1 :])], "values", x.dtype)

    def inverse_of(p: Scalar) -> Scalar:
        q = te.reduce_axis(total, "q")
        same_first = te.logical_and(te.eq(first[q], 1), items.same(q, p))
        return te.sum(te.if_then_else(same_first, key[q], 0), axis=q)

    inverse = te.compute((total,), inverse_of, "inverse", "int64")

    def count_of(j: Scalar) -> Scalar:
        q = te.reduce_axis(total, "q")
        return te.sum(te.if_then_else(items.same(q, idx[j]), 1, 0), axis=q)

    counts = te.compute((n,), count_of, "counts", "int64")
    info = TupleInfo((TensorInfo(vshape, x.dtype), TensorInfo((n,), "int64"), TensorInfo((total,), "int64"), TensorInfo((n,), "int64")))
    return ctx.call_te("unique", call.args, [x], [values, idx, inverse, counts], info)


register(Op("unique", _infer_unique, OpPattern.OPAQUE, attrs={"sorted": True, "axis": None}, num_args=1, legalize=_legalize_unique))


def unique(x: Expr, sorted: bool = True, axis: int | None = None) -> Call:
    """``(values, first_indices, inverse_indices, counts)`` of the flattened ``x``, or of its
    slices along ``axis`` (``values`` then has ``x``'s shape with ``n`` slices)."""
    return make_call("unique", [x], sorted=sorted, axis=axis)


__all__ = ["topk", "nonzero", "unique"]
