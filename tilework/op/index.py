"""Indexing by tensors and running sums and products: ``gather``, ``scatter``,
``index_tensor``, ``one_hot``, ``cumsum``, ``cumprod``, ``tril`` and ``triu``. (``take`` lives in
``tilework.op.manipulate``.)

- ``gather(x, index, axis)``: torch.gather. ``index`` has ``x``'s rank and its dims are at
  most ``x``'s off ``axis``; ``out[i] = x[i with i[axis] replaced by index[i]]``.
- ``scatter(x, index, src, axis, reduction)``: torch.scatter / ONNX ScatterElements. A copy of
  ``x`` where, for every position ``i`` of ``index``, the element at ``i`` with ``i[axis]``
  replaced by ``index[i]`` becomes ``src[i]`` (``reduction`` ``"none"``; when several
  positions hit one element the last one along ``axis`` wins) or is combined with it (``"add"``,
  ``"mul"``, ``"max"``, ``"min"``).
- ``index_tensor(x, i0, ..., ik, axis)``: NumPy/torch advanced indexing of ``k`` consecutive
  dims starting at ``axis``: the index tensors broadcast together to ``B`` and the result is
  ``x.shape[:axis] + B + x.shape[axis + k:]``.
- ``one_hot(indices, values, depth, axis)``: ONNX OneHot. A new axis of length ``depth`` at
  ``axis`` holding ``values[1]`` where it equals the index and ``values[0]`` elsewhere; an index
  outside ``[-depth, depth)`` gives a row of ``values[0]``.
- ``cumsum(x, axis, exclusive, reverse)``: running sums along ``axis`` (ONNX's ``exclusive``
  leaves the element itself out, ``reverse`` sums from the end); a bool or integer input sums
  in int64 unless ``dtype`` says otherwise.
- ``cumprod(x, axis, exclusive, reverse)``: running products, the same way (ONNX CumProd),
  in the input's dtype.
- ``tril(x, k)`` / ``triu(x, k)``: the last two dims keep the elements on and below (above)
  diagonal ``k``; the others become 0. ``k`` may be symbolic.

Indices may be negative (counted from the end); an out-of-range index is clamped into range
rather than read or written out of bounds. ``check_index(indices, size, negative)`` gives the
indices unchanged and raises ``IndexOutOfRange`` at run time for one outside its dim: the
torch frontend puts it before the ops where torch raises IndexError. Legalization of ``scatter``, ``cumsum`` and
``cumprod`` searches, sums or multiplies along ``axis`` for every output element (quadratic in
that dim's length).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, check_dtype, shape_str
from tilework.ir.loop import Scalar
from tilework.ir.sym import Dim, SymExpr
from tilework.ir.dtype import INT_DTYPES, is_float_dtype
from tilework.op.base import (
    InferCtx,
    Op,
    OpPattern,
    bool_attr,
    broadcast_shapes,
    int_attr,
    make_call,
    normalize_axis,
    register,
    tensor_arg,
    unify_dtype,
)
from tilework.op.kernel import Index, arg, bcast_index, compute_dtype, op_name, out_tensor, upcast

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _index_arg(call: Call, i: int, ctx: InferCtx) -> TensorInfo:
    t = tensor_arg(call, i, ctx)
    if t.dtype is not None and t.dtype not in INT_DTYPES:
        raise ctx.error(f"indices must be an integer tensor, got {t.dtype}")
    return t


def _require_within(idx: TensorInfo, x: TensorInfo, axis: int, ctx: InferCtx, what: str) -> None:
    """Off ``axis``, every dim of ``idx`` is at most the same dim of ``x``."""
    assert idx.shape is not None and x.shape is not None
    for d, (a, b) in enumerate(zip(idx.shape, x.shape)):
        if d == axis or sym.prove_le(a, b):
            continue
        if isinstance(a, int) and isinstance(b, int):
            raise ctx.shape_error(f"{what} {shape_str(idx.shape)} is larger than input {shape_str(x.shape)} in dim {d}")
        ctx.require("ge", (b, a), f"dim {d} of {what} {shape_str(idx.shape)} must not exceed that of input {shape_str(x.shape)}")


def _infer_gather(call: Call, ctx: InferCtx) -> StructInfo:
    x, idx = tensor_arg(call, 0, ctx), _index_arg(call, 1, ctx)
    axis = int_attr(call, "axis", ctx)
    if x.ndim != -1 and idx.ndim != -1 and x.ndim != idx.ndim:
        raise ctx.shape_error(f"index {shape_str(idx.shape)} must have the rank of input {shape_str(x.shape)}")
    ndim = x.ndim if x.ndim != -1 else idx.ndim
    if ndim != -1:
        axis = normalize_axis(axis, ndim, ctx)
    if x.shape is not None and idx.shape is not None:
        _require_within(idx, x, axis, ctx, "index")
    return TensorInfo(idx.shape, x.dtype, idx.ndim if idx.ndim != -1 else x.ndim)


def _infer_scatter(call: Call, ctx: InferCtx) -> StructInfo:
    x, idx, src = tensor_arg(call, 0, ctx), _index_arg(call, 1, ctx), tensor_arg(call, 2, ctx)
    axis = int_attr(call, "axis", ctx)
    red = call.attrs["reduction"]
    if red not in REDUCTIONS:
        raise ctx.error(f"reduction must be one of {', '.join(REDUCTIONS)}, got {red!r}")
    dtype = unify_dtype([x.dtype, src.dtype], ctx)
    ranks = {t.ndim for t in (x, idx, src) if t.ndim != -1}
    if len(ranks) > 1:
        raise ctx.shape_error(f"input {shape_str(x.shape)}, index {shape_str(idx.shape)} and src {shape_str(src.shape)} must have one rank")
    if x.ndim != -1:
        axis = normalize_axis(axis, x.ndim, ctx)
    if x.shape is not None and idx.shape is not None:
        _require_within(idx, x, axis, ctx, "index")
    if idx.shape is not None and src.shape is not None:
        for d, (a, b) in enumerate(zip(idx.shape, src.shape)):
            if not sym.prove_le(a, b):
                ctx.require("ge", (b, a), f"dim {d} of index {shape_str(idx.shape)} must not exceed that of src {shape_str(src.shape)}")
    return TensorInfo(x.shape, dtype, x.ndim)


def _infer_index_tensor(call: Call, ctx: InferCtx) -> StructInfo:
    if len(call.args) < 2:
        raise ctx.error("takes a tensor and at least one index tensor")
    x = tensor_arg(call, 0, ctx)
    idxs = [_index_arg(call, i, ctx) for i in range(1, len(call.args))]
    k = len(idxs)
    axis = int_attr(call, "axis", ctx)
    if axis < 0 or (x.ndim != -1 and axis + k > x.ndim):
        raise ctx.error(f"axis {axis} with {k} index tensor(s) does not fit a tensor of rank {x.ndim}")
    if x.ndim == -1 or any(t.shape is None for t in idxs):
        return TensorInfo(None, x.dtype, -1)
    bshape: tuple[Dim, ...] = ()
    for t in idxs:
        assert t.shape is not None
        bshape = broadcast_shapes(bshape, t.shape, ctx)
    if x.shape is None:
        return TensorInfo(None, x.dtype, x.ndim - k + len(bshape))
    return TensorInfo(x.shape[:axis] + bshape + x.shape[axis + k :], x.dtype)


def _infer_one_hot(call: Call, ctx: InferCtx) -> StructInfo:
    idx, values = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    depth = call.attrs["depth"]
    if isinstance(depth, bool) or not isinstance(depth, (int, sym.SymExpr)):
        raise ctx.error(f"attribute depth must be an int or a symbolic dim, got {depth!r}")
    if values.shape is not None and values.shape != (2,):
        raise ctx.shape_error(f"values must have shape (2,) (off, on), got {values.shape}")
    if idx.shape is None:
        return TensorInfo(None, values.dtype, -1 if idx.ndim == -1 else idx.ndim + 1)
    a = normalize_axis(int_attr(call, "axis", ctx), len(idx.shape) + 1, ctx)
    return TensorInfo(idx.shape[:a] + (depth,) + idx.shape[a:], values.dtype)


def _infer_check_index(call: Call, ctx: InferCtx) -> StructInfo:
    idx = _index_arg(call, 0, ctx)
    size = call.attrs["size"]
    if isinstance(size, bool) or not isinstance(size, (int, sym.SymExpr)):
        raise ctx.error(f"attribute size must be an int or a symbolic dim, got {size!r}")
    bool_attr(call, "negative", ctx)
    return idx


def _infer_cumsum(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    axis = int_attr(call, "axis", ctx)
    bool_attr(call, "exclusive", ctx)
    bool_attr(call, "reverse", ctx)
    if x.ndim == 0:
        raise ctx.shape_error("cannot take a running sum of a 0-d tensor")
    if x.ndim != -1:
        normalize_axis(axis, x.ndim, ctx)
    given = call.attrs["dtype"]
    if given is not None:
        dtype: str | None = check_dtype(given)
    elif x.dtype is None or is_float_dtype(x.dtype):
        dtype = x.dtype
    else:
        dtype = "int64"
    return TensorInfo(x.shape, dtype, x.ndim)


def _infer_cumprod(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if x.dtype == "bool":
        raise ctx.error("expects a numeric tensor, got bool")
    if x.ndim != -1:
        normalize_axis(int_attr(call, "axis", ctx), x.ndim, ctx)
    bool_attr(call, "exclusive", ctx)
    bool_attr(call, "reverse", ctx)
    return x


def _infer_tri(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    k = call.attrs["k"]
    if isinstance(k, bool) or not isinstance(k, (int, SymExpr)):
        raise ctx.error(f"attribute k must be an int or a symbolic dim, got {k!r}")
    if x.ndim not in (-1,) and x.ndim < 2:
        raise ctx.shape_error(f"input must have at least 2 dims, got shape {shape_str(x.shape)}")
    return x


# -- legalization ---------------------------------------------------------------------------


def _wrap(v: Scalar, d: Dim) -> Scalar:
    """An index value in ``[-d, d)`` made non-negative and clamped into ``[0, d)``."""
    v = te.cast(v, "int64")
    v = te.if_then_else(te.lt(v, 0), v + d, v)
    return te.minimum(te.maximum(v, 0), sym.sub(d, 1))


def _with(i: Index, axis: int, v: Scalar) -> Index:
    return i[:axis] + (v,) + i[axis + 1 :]


def _legalize_gather(call: Call, ctx: "LegalizeCtx") -> Expr:
    x, idx = arg(call, 0, "x"), arg(call, 1, "index")
    shape, dtype = out_tensor(call)
    axis = normalize_axis(int(call.attrs["axis"]), x.ndim, InferCtx("gather"))

    def f(*i: Scalar) -> Scalar:
        return x[_with(i, axis, _wrap(idx[i], x.shape[axis]))]

    out = te.compute(shape, f, "gather", dtype)
    return ctx.call_te("gather", call.args, [x, idx], [out], call.info)


def _legalize_scatter(call: Call, ctx: "LegalizeCtx") -> Expr:
    """For each output element, the positions ``j`` along ``axis`` of ``index`` that hit it are
    found by a reduction: the last one for ``none``, all of them for the others."""
    x, idx, src = arg(call, 0, "x"), arg(call, 1, "index"), arg(call, 2, "src")
    shape, dtype = out_tensor(call)
    axis = normalize_axis(int(call.attrs["axis"]), x.ndim, InferCtx("scatter"))
    red = str(call.attrs["reduction"])
    acc = compute_dtype(dtype)
    d = x.shape[axis]

    partial = [k for k in range(x.ndim) if k != axis and not sym.prove_ge(idx.shape[k], x.shape[k])]

    def hits(i: Index, j: Scalar) -> Scalar:
        # off axis, index may be smaller than x: outside it nothing hits (the load is clamped)
        at = tuple(te.minimum(i[k], sym.sub(idx.shape[k], 1)) if k in partial else i[k] for k in range(x.ndim))
        inside = [te.lt(i[k], idx.shape[k]) for k in partial]
        return te.all(*inside, te.eq(_wrap(idx[_with(at, axis, j)], d), i[axis]))

    if red == "none":

        def last(*i: Scalar) -> Scalar:
            j = te.reduce_axis(idx.shape[axis], "j")
            return te.max(te.cast(j, "int64"), axis=j, where=hits(i, j))

        pos = te.compute(shape, last, "scatter_pos", "int64")

        def f(*i: Scalar) -> Scalar:
            p = pos[i]
            return te.if_then_else(te.ge(p, 0), src[_with(i, axis, p)], x[i])

    else:
        reducer = {"add": te.sum, "mul": te.prod, "max": te.max, "min": te.min}[red]

        def combined(*i: Scalar) -> Scalar:
            j = te.reduce_axis(idx.shape[axis], "j")
            return reducer(te.cast(src[_with(i, axis, j)], acc), axis=j, where=hits(i, j))

        part = te.compute(shape, combined, "scatter_part", acc)

        def f(*i: Scalar) -> Scalar:
            v = te.cast(x[i], acc)
            if red == "add":
                return v + part[i]
            if red == "mul":
                return v * part[i]
            return te.maximum(v, part[i]) if red == "max" else te.minimum(v, part[i])

    out = te.compute(shape, f, "scatter", dtype)
    return ctx.call_te("scatter", call.args, [x, idx, src], [out], call.info)


def _legalize_index_tensor(call: Call, ctx: "LegalizeCtx") -> Expr:
    x = arg(call, 0, "x")
    idxs = [arg(call, k, f"i{k - 1}") for k in range(1, len(call.args))]
    shape, dtype = out_tensor(call)
    axis, k = int(call.attrs["axis"]), len(idxs)
    nb = len(shape) - (x.ndim - k)
    bshape = shape[axis : axis + nb]

    def f(*i: Scalar) -> Scalar:
        b = i[axis : axis + nb]
        picked = tuple(_wrap(t[bcast_index(b, t.shape, bshape)], x.shape[axis + n]) for n, t in enumerate(idxs))
        return x[i[:axis] + picked + i[axis + nb :]]

    out = te.compute(shape, f, "index_tensor", dtype)
    return ctx.call_te("index_tensor", call.args, [x, *idxs], [out], call.info)


def _legalize_check_index(call: Call, ctx: "LegalizeCtx") -> Expr:
    idx = arg(call, 0, "indices")
    shape, dtype = out_tensor(call)
    size: Dim = call.attrs["size"]
    lo = sym.sub(0, size) if call.attrs["negative"] else 0
    out = te.compute(shape, lambda *i: te.check_range(idx[i], lo, size), "check_index", dtype)
    return ctx.call_te("check_index", call.args, [idx], [out], call.info)


def _legalize_one_hot(call: Call, ctx: "LegalizeCtx") -> Expr:
    """Indices count from the end when negative; one outside ``[-depth, depth)`` gives a row
    of ``off`` values."""
    idx, values = arg(call, 0, "indices"), arg(call, 1, "values")
    shape, dtype = out_tensor(call)
    a = normalize_axis(int(call.attrs["axis"]), len(shape), InferCtx("one_hot"))
    depth = call.attrs["depth"]

    def f(*i: Scalar) -> Scalar:
        raw = idx[i[:a] + i[a + 1 :]]
        v = te.cast(te.floor(raw) if is_float_dtype(idx.dtype) else raw, "int64")
        v = te.if_then_else(te.lt(v, 0), v + depth, v)
        return te.if_then_else(te.eq(v, i[a]), values[1], values[0])

    out = te.compute(shape, f, "one_hot", dtype)
    return ctx.call_te("one_hot", call.args, [idx, values], [out], call.info)


def _legalize_cumsum(call: Call, ctx: "LegalizeCtx") -> Expr:
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    axis = normalize_axis(int(call.attrs["axis"]), x.ndim, InferCtx("cumsum"))
    exclusive, reverse = bool(call.attrs["exclusive"]), bool(call.attrs["reverse"])
    acc = compute_dtype(dtype)

    def f(*i: Scalar) -> Scalar:
        j = te.reduce_axis(x.shape[axis], "j")
        if reverse:
            cond = te.gt(j, i[axis]) if exclusive else te.ge(j, i[axis])
        else:
            cond = te.lt(j, i[axis]) if exclusive else te.le(j, i[axis])
        return te.sum(te.cast(x[_with(i, axis, j)], acc), axis=j, where=cond)

    out = te.compute(shape, f, "cumsum", dtype)
    return ctx.call_te("cumsum", call.args, [x], [out], call.info)


def _legalize_cumprod(call: Call, ctx: "LegalizeCtx") -> Expr:
    """``out[i] = prod(x[q] for q up to i along axis)`` (``exclusive`` stops before ``i``,
    ``reverse`` runs from the end): a product over the axis per element (quadratic in its
    length)."""
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    a = normalize_axis(int(call.attrs["axis"]), len(shape), InferCtx("cumprod"))
    excl, rev = bool(call.attrs["exclusive"]), bool(call.attrs["reverse"])

    def f(*i: Scalar) -> Scalar:
        q = te.reduce_axis(shape[a], "q")
        if rev:
            cond = te.gt(q, i[a]) if excl else te.ge(q, i[a])
        else:
            cond = te.lt(q, i[a]) if excl else te.le(q, i[a])
        return te.prod(upcast(x[i[:a] + (q,) + i[a + 1 :]], x.dtype), axis=q, where=cond)

    out = te.compute(shape, f, "cumprod", dtype)
    return ctx.call_te("cumprod", call.args, [x], [out], call.info)


def _legalize_tri(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = op_name(call)
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    k = call.attrs["k"]

    def f(*i: Scalar) -> Scalar:
        r, c = i[-2], i[-1]
        keep = te.le(c, r + k) if name == "tril" else te.ge(c, r + k)
        return te.if_then_else(keep, x[i], te.constant(False if dtype == "bool" else 0, dtype))

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [x], [out], call.info)


register(Op("gather", _infer_gather, OpPattern.INJECTIVE, attrs={"axis": 0}, num_args=2, legalize=_legalize_gather))
register(Op("scatter", _infer_scatter, OpPattern.OPAQUE, attrs={"axis": 0, "reduction": "none"}, num_args=3, legalize=_legalize_scatter))
register(Op("index_tensor", _infer_index_tensor, OpPattern.INJECTIVE, attrs={"axis": 0}, legalize=_legalize_index_tensor))
register(Op("check_index", _infer_check_index, OpPattern.ELEMWISE, attrs={"size": 1, "negative": False}, num_args=1, legalize=_legalize_check_index))
register(Op("one_hot", _infer_one_hot, OpPattern.INJECTIVE, attrs={"depth": 1, "axis": -1}, num_args=2, legalize=_legalize_one_hot))
register(Op("cumsum", _infer_cumsum, OpPattern.OPAQUE, attrs={"axis": -1, "exclusive": False, "reverse": False, "dtype": None}, num_args=1, legalize=_legalize_cumsum))
register(Op("cumprod", _infer_cumprod, OpPattern.OPAQUE, attrs={"axis": -1, "exclusive": False, "reverse": False}, num_args=1, legalize=_legalize_cumprod))
register(Op("tril", _infer_tri, OpPattern.INJECTIVE, attrs={"k": 0}, num_args=1, legalize=_legalize_tri))
register(Op("triu", _infer_tri, OpPattern.INJECTIVE, attrs={"k": 0}, num_args=1, legalize=_legalize_tri))

# -- constructors ---------------------------------------------------------------------------


def gather(x: Expr, index: Expr, axis: int = 0) -> Call:
    """torch.gather: ``out[i] = x[i with i[axis] = index[i]]``; the result has ``index``'s shape."""
    return make_call("gather", [x, index], axis=axis)


def scatter(x: Expr, index: Expr, src: Expr, axis: int = 0, reduction: str = "none") -> Call:
    """A copy of ``x`` with ``src``'s elements written (or combined, see ``reduction``) at the
    positions ``index`` names along ``axis`` (torch.scatter / ONNX ScatterElements)."""
    return make_call("scatter", [x, index, src], axis=axis, reduction=reduction)


def index_tensor(x: Expr, indices: Sequence[Expr], axis: int = 0) -> Call:
    """``x[..., i0, i1, ...]``: advanced indexing of ``len(indices)`` consecutive dims starting
    at ``axis`` by integer tensors that broadcast together."""
    return make_call("index_tensor", [x, *indices], axis=axis)


def check_index(indices: Expr, size: sym.Dim, negative: bool = False) -> Call:
    """``indices`` unchanged; an element outside ``[0, size)`` (``[-size, size)`` when
    ``negative``) raises ``IndexOutOfRange`` at run time: what torch does where the ops after
    it (``take``, ``gather``, ...) would clamp (docs/semantics.md)."""
    return make_call("check_index", [indices], size=size, negative=negative)


def one_hot(indices: Expr, values: Expr, depth: sym.Dim, axis: int = -1) -> Call:
    """A new axis of length ``depth`` at ``axis``: ``values[1]`` where it equals the index,
    ``values[0]`` elsewhere (``values`` is ``[off, on]``)."""
    return make_call("one_hot", [indices, values], depth=depth, axis=axis)


def cumsum(x: Expr, axis: int = -1, exclusive: bool = False, reverse: bool = False, dtype: str | None = None) -> Call:
    """Running sums along ``axis``; ``dtype`` None keeps a float dtype and sums others in int64."""
    return make_call("cumsum", [x], axis=axis, exclusive=exclusive, reverse=reverse, dtype=dtype)


def cumprod(x: Expr, axis: int = -1, exclusive: bool = False, reverse: bool = False) -> Call:
    """Running products along ``axis`` (ONNX CumProd: ``exclusive`` leaves the element itself
    out, ``reverse`` multiplies from the end)."""
    return make_call("cumprod", [x], axis=axis, exclusive=exclusive, reverse=reverse)


def tril(x: Expr, k: Dim = 0) -> Call:
    """``x`` with the elements above diagonal ``k`` of its last two dims set to 0."""
    return make_call("tril", [x], k=k)


def triu(x: Expr, k: Dim = 0) -> Call:
    """``x`` with the elements below diagonal ``k`` of its last two dims set to 0."""
    return make_call("triu", [x], k=k)


__all__ = ["gather", "scatter", "index_tensor", "one_hot", "cumsum", "cumprod", "tril", "triu"]
