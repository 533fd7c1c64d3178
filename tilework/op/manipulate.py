"""Shape manipulation: ``reshape``, ``permute_dims``, ``expand_dims``, ``squeeze``, ``flatten``,
``broadcast_to``, ``concat``, ``split``, ``strided_slice``, ``take`` and ``shape_of``.

Shapes stay symbolic through every op: ``reshape`` of ``(b, s, 768)`` to ``(b, s, 12, -1)``
infers ``64``; ``concat`` adds the dims along its axis; slicing follows Python's clamping rules
with ``min``/``max`` terms that simplify away whenever the bounds are provably in range.

Legalization gives copy kernels (``reshape``/``flatten`` become views in a later pass).
``take`` counts negative indices from the end and clamps out-of-range ones into range.
``shape_of`` needs no kernel: it becomes the shape value of its argument's dims.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from tilework import te
from tilework.errors import UnsupportedError
from tilework.ir import sym
from tilework.ir.graph import Call, Expr, ShapeExpr, Tuple
from tilework.ir.info import AnyInfo, ShapeInfo, StructInfo, TensorInfo, TupleInfo, shape_str
from tilework.ir.loop import Scalar
from tilework.ir.sym import Dim, SymExpr
from tilework.ir.dtype import INT_DTYPES
from tilework.op.base import (
    InferCtx,
    Op,
    OpPattern,
    axes_attr,
    int_attr,
    make_call,
    normalize_axes,
    normalize_axis,
    register,
    require_equal,
    require_expands,
    require_nonneg,
    shape_arg,
    tensor_arg,
    to_shape_expr,
    unify_dtype,
)
from tilework.op.kernel import Index, arg, bcast_index, known_tensor, op_name, out_tensor, reshape_index, tuple_fields

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

# -- reshape --------------------------------------------------------------------------------


def _cancel_common(src: Sequence[Dim], dst: Sequence[Dim]) -> tuple[Dim, Dim]:
    """The element counts of ``src`` and ``dst`` with dims they share cancelled, so that
    ``(b, s, 768) -> (b, s, 12, -1)`` divides ``768 // 12`` even when ``b`` may be 0 (where -1
    is ambiguous anyway)."""
    left = list(src)
    right: list[Dim] = []
    for d in dst:
        hit = next((i for i, x in enumerate(left) if x is d or sym.prove_eq(x, d)), None)
        if hit is None:
            right.append(d)
        else:
            del left[hit]
    return sym.product(left), sym.product(right)


def _infer_reshape(call: Call, ctx: InferCtx) -> StructInfo:
    x, s = tensor_arg(call, 0, ctx), shape_arg(call, 1, ctx)
    if s.values is None:
        return TensorInfo(None, x.dtype, s.ndim)
    target = s.values
    holes = [i for i, d in enumerate(target) if isinstance(d, int) and d == -1]
    if len(holes) > 1:
        raise ctx.shape_error(f"at most one -1 is allowed in the new shape {shape_str(target)}")
    rest = tuple(d for i, d in enumerate(target) if i not in holes)
    require_nonneg(rest, ctx, "new shape")
    if x.shape is None:
        return TensorInfo(None if holes else target, x.dtype, len(target))
    src, total, known = shape_str(x.shape), sym.product(x.shape), sym.product(rest)
    what = f"cannot reshape {src} to {shape_str(target)}"
    if not holes:
        require_equal(total, known, ctx, f"{what}: element counts differ")
        return TensorInfo(target, x.dtype)
    if known == 0:
        raise ctx.shape_error(f"{what}: -1 is ambiguous next to a zero-size dim")
    total, known = _cancel_common(x.shape, rest)
    inferred = sym.floordiv(total, known)
    rem = sym.floormod(total, known)
    if rem != 0 and not sym.prove_eq(sym.mul(inferred, known), total):
        if isinstance(rem, int):
            raise ctx.shape_error(f"{what}: {sym.to_str(total)} is not divisible by {sym.to_str(known)}")
        ctx.require("divides", (total, known), f"{what}: {sym.to_str(total)} must be divisible by {sym.to_str(known)}")
    return TensorInfo(tuple(inferred if i in holes else d for i, d in enumerate(target)), x.dtype)


# -- permute, expand, squeeze, flatten, broadcast ----------------------------------------------


def _infer_permute_dims(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    axes = axes_attr(call, "axes", ctx)
    ndim = x.ndim if axes is None else len(axes)
    if ndim == -1:
        return x
    if x.ndim not in (-1, ndim):
        raise ctx.shape_error(f"axes {axes} do not permute the {x.ndim} dims of shape {shape_str(x.shape)}")
    perm = tuple(range(ndim - 1, -1, -1)) if axes is None else normalize_axes(axes, ndim, ctx)
    if x.shape is None:
        return TensorInfo(None, x.dtype, ndim)
    return TensorInfo(tuple(x.shape[a] for a in perm), x.dtype)


def _infer_expand_dims(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    axes = axes_attr(call, "axis", ctx)
    if axes is None:
        raise ctx.error("attribute axis is required")
    if x.ndim == -1:
        return x
    new = set(normalize_axes(axes, x.ndim + len(axes), ctx))
    if x.shape is None:
        return TensorInfo(None, x.dtype, x.ndim + len(axes))
    dims = iter(x.shape)
    return TensorInfo(tuple(1 if i in new else next(dims) for i in range(x.ndim + len(axes))), x.dtype)


def _infer_squeeze(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    axes = axes_attr(call, "axis", ctx)
    if axes is None:
        if x.shape is None:  # which dims are 1 is not known: neither is the rank
            return TensorInfo(None, x.dtype, -1)
        return TensorInfo(tuple(d for d in x.shape if not (isinstance(d, int) and d == 1)), x.dtype)
    if x.ndim == -1:
        return x
    drop = normalize_axes(axes, x.ndim, ctx)
    if x.shape is None:
        return TensorInfo(None, x.dtype, x.ndim - len(drop))
    for a in drop:
        require_equal(x.shape[a], 1, ctx, f"cannot squeeze axis {a} of shape {shape_str(x.shape)}")
    return TensorInfo(tuple(d for i, d in enumerate(x.shape) if i not in drop), x.dtype)


def _infer_flatten(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    start, end = int_attr(call, "start_dim", ctx), int_attr(call, "end_dim", ctx)
    if x.ndim == 0:
        return TensorInfo((1,), x.dtype)
    if x.ndim == -1:
        return TensorInfo(None, x.dtype, 1 if start == 0 and end == -1 else -1)
    s, e = normalize_axis(start, x.ndim, ctx), normalize_axis(end, x.ndim, ctx)
    if s > e:
        raise ctx.error(f"start_dim {start} comes after end_dim {end} for shape {shape_str(x.shape)}")
    if x.shape is None:
        return TensorInfo(None, x.dtype, x.ndim - (e - s))
    return TensorInfo(x.shape[:s] + (sym.product(x.shape[s : e + 1]),) + x.shape[e + 1 :], x.dtype)


def _infer_broadcast_to(call: Call, ctx: InferCtx) -> StructInfo:
    x, s = tensor_arg(call, 0, ctx), shape_arg(call, 1, ctx)
    if s.values is None:
        if x.ndim != -1 and s.ndim != -1 and x.ndim > s.ndim:
            raise ctx.shape_error(f"cannot broadcast input {shape_str(x.shape)} to a shape of rank {s.ndim}")
        return TensorInfo(None, x.dtype, s.ndim)
    require_nonneg(s.values, ctx, "target shape")
    if x.ndim > len(s.values):
        raise ctx.shape_error(f"cannot broadcast input {shape_str(x.shape)} to {shape_str(s.values)}: too many dims")
    if x.shape is not None:
        require_expands(x.shape, s.values, ctx, "input")
    return TensorInfo(s.values, x.dtype)


# -- concat and split ---------------------------------------------------------------------------


def _tuple_fields(call: Call, ctx: InferCtx) -> list[TensorInfo] | None:
    if len(call.args) != 1:
        raise ctx.error(f"takes one tuple of tensors, got {len(call.args)} argument(s)")
    info = call.args[0].info
    if isinstance(info, AnyInfo):
        return None
    if not isinstance(info, TupleInfo):
        raise ctx.error(f"expects a tuple of tensors, got {type(info).__name__}")
    out = []
    for i, f in enumerate(info.fields):
        if isinstance(f, AnyInfo):
            f = TensorInfo(None, None, -1)
        if not isinstance(f, TensorInfo):
            raise ctx.error(f"field {i} of the tuple must be a tensor, got {type(f).__name__}")
        out.append(f)
    return out


def _infer_concat(call: Call, ctx: InferCtx) -> StructInfo:
    fields = _tuple_fields(call, ctx)
    axis = int_attr(call, "axis", ctx)
    if fields is None:
        return TensorInfo(None, None, -1)
    if not fields:
        raise ctx.error("needs at least one tensor")
    dtype = unify_dtype([f.dtype for f in fields], ctx)
    ndims = {f.ndim for f in fields if f.ndim != -1}
    if len(ndims) > 1:
        raise ctx.shape_error(f"tensors of different ranks: {', '.join(shape_str(f.shape) if f.shape is not None else f'rank {f.ndim}' for f in fields)}")
    ndim = ndims.pop() if ndims else -1
    if ndim == -1:
        return TensorInfo(None, dtype, -1)
    if ndim == 0:
        raise ctx.shape_error("cannot concatenate 0-d tensors")
    ax = normalize_axis(axis, ndim, ctx)
    shapes = [f.shape for f in fields]
    if any(s is None for s in shapes):
        return TensorInfo(None, dtype, ndim)
    first = shapes[0]
    assert first is not None
    out: list[Dim] = list(first)
    total: Dim = 0
    for s in shapes:
        assert s is not None
        total = sym.add(total, s[ax])
        for i in range(ndim):
            if i != ax:
                out[i] = require_equal(out[i], s[i], ctx, f"dim {i} of {shape_str(first)} and {shape_str(s)} differ")
    out[ax] = total
    return TensorInfo(tuple(out), dtype)


def _bound_attr(v: object, name: str, ctx: InferCtx) -> Dim | None:
    if v is None or (isinstance(v, (int, SymExpr)) and not isinstance(v, bool)):
        return v
    raise ctx.error(f"{name} entries must be ints, symbolic dims or None, got {v!r}")


def _split_points(spec: object, ctx: InferCtx) -> int | list[Dim | None]:
    """The section count, or the split points with the open ends (None) around them."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec <= 0:
            raise ctx.error(f"number of sections must be positive, got {spec}")
        return spec
    if not isinstance(spec, tuple):
        raise ctx.error(f"indices_or_sections must be an int or a tuple of indices, got {spec!r}")
    return [None, *(_bound_attr(i, "indices", ctx) for i in spec), None]


def _split_sizes(d: Dim, spec: int | list[Dim | None], ctx: InferCtx, src: str) -> list[Dim]:
    if isinstance(spec, list):
        return [slice_length(d, spec[j], spec[j + 1], 1, ctx) for j in range(len(spec) - 1)]
    rem = sym.floormod(d, spec)
    if isinstance(rem, int) and rem != 0:
        raise ctx.shape_error(f"dim {sym.to_str(d)} of shape {src} does not split into {spec} equal sections")
    if rem != 0:
        ctx.require("divides", (d, spec), f"dim {sym.to_str(d)} of shape {src} must split into {spec} equal sections")
    return [sym.floordiv(d, spec)] * spec


def _infer_split(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    spec = _split_points(call.attrs["indices_or_sections"], ctx)
    axis = int_attr(call, "axis", ctx)
    if x.ndim == 0:
        raise ctx.shape_error("cannot split a 0-d tensor")
    if x.shape is None:
        if x.ndim != -1:
            normalize_axis(axis, x.ndim, ctx)
        count = spec if isinstance(spec, int) else len(spec) - 1
        return TupleInfo((TensorInfo(None, x.dtype, x.ndim),) * count)
    ax = normalize_axis(axis, x.ndim, ctx)
    sizes = _split_sizes(x.shape[ax], spec, ctx, shape_str(x.shape))
    return TupleInfo(tuple(TensorInfo(x.shape[:ax] + (n,) + x.shape[ax + 1 :], x.dtype) for n in sizes))


# -- strided_slice and take ----------------------------------------------------------------------


def _clamp_bound(i: Dim | None, d: Dim, step: int, is_begin: bool, ctx: InferCtx) -> Dim:
    """One slice bound normalized like Python's ``slice.indices``: negative counts from the end,
    then clamped to ``[0, d]`` (step > 0) or ``[-1, d - 1]`` (step < 0). A symbolic bound of
    unknown sign is taken as non-negative, which run time checks."""
    lo, hi = (0, d) if step > 0 else (-1, sym.sub(d, 1))
    if i is None:
        return (lo if step > 0 else hi) if is_begin else (hi if step > 0 else lo)
    if sym.prove_le(i, -1):
        return sym.max_(sym.add(i, d), lo)
    if not sym.prove_ge(i, 0):
        ctx.require("ge", (i, 0), f"slice bound {sym.to_str(i)} must be >= 0 (negative symbolic bounds are not supported)")
    return sym.min_(i, hi)


def slice_length(d: Dim, begin: Dim | None, end: Dim | None, step: int, ctx: InferCtx) -> Dim:
    """The length of ``range(d)[begin:end:step]``."""
    b = _clamp_bound(begin, d, step, True, ctx)
    e = _clamp_bound(end, d, step, False, ctx)
    if step > 0:
        return sym.max_(0, sym.ceildiv(sym.sub(e, b), step))
    return sym.max_(0, sym.ceildiv(sym.sub(b, e), -step))


def _slice_spec(call: Call, ctx: InferCtx) -> tuple[tuple[int, ...], list[Dim | None], list[Dim | None], list[int]]:
    axes = axes_attr(call, "axes", ctx)
    if axes is None:
        raise ctx.error("attribute axes is required")
    begin, end, strides = call.attrs["begin"], call.attrs["end"], call.attrs["strides"]
    if strides is None:
        strides = (1,) * len(axes)
    for name, v in (("begin", begin), ("end", end), ("strides", strides)):
        if not isinstance(v, tuple) or len(v) != len(axes):
            raise ctx.error(f"{name} must be a tuple with one entry per axis ({len(axes)}), got {v!r}")
    for s in strides:
        if isinstance(s, bool) or not isinstance(s, int) or s == 0:
            raise ctx.error(f"strides must be non-zero static ints, got {strides!r}")
    bs = [_bound_attr(v, "begin", ctx) for v in begin]
    es = [_bound_attr(v, "end", ctx) for v in end]
    return axes, bs, es, list(strides)


def _infer_strided_slice(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    axes, begin, end, strides = _slice_spec(call, ctx)
    if x.ndim == -1:
        return x
    ax = normalize_axes(axes, x.ndim, ctx)
    if x.shape is None:
        return x
    out = list(x.shape)
    for a, b, e, s in zip(ax, begin, end, strides):
        out[a] = slice_length(x.shape[a], b, e, s, ctx)
    return TensorInfo(tuple(out), x.dtype)




def _infer_take(call: Call, ctx: InferCtx) -> StructInfo:
    x, idx = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    if idx.dtype is not None and idx.dtype not in INT_DTYPES:
        raise ctx.error(f"indices must be an integer tensor, got {idx.dtype}")
    axis = call.attrs["axis"]
    if axis is None:  # NumPy: index the flattened tensor
        return TensorInfo(idx.shape, x.dtype, idx.ndim)
    axis = int_attr(call, "axis", ctx)
    if x.ndim == 0:
        raise ctx.shape_error("cannot take from a 0-d tensor along an axis")
    if x.ndim == -1 or idx.ndim == -1:
        return TensorInfo(None, x.dtype, -1)
    a = normalize_axis(axis, x.ndim, ctx)
    if x.shape is None or idx.shape is None:
        return TensorInfo(None, x.dtype, x.ndim - 1 + idx.ndim)
    return TensorInfo(x.shape[:a] + idx.shape + x.shape[a + 1 :], x.dtype)


def _infer_shape_of(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    return ShapeInfo(x.shape, x.ndim)


# -- legalization ------------------------------------------------------------------------------


def _copy(call: Call, ctx: "LegalizeCtx", index: Callable[[Index], Index]) -> Expr:
    """``out[i] = x[index(i)]`` for the call's single tensor argument."""
    name = op_name(call)
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    out = te.compute(shape, lambda *i: x[index(i)], name, dtype)
    return ctx.call_te(name, call.args[:1], [x], [out], call.info)


def _legalize_reshape(call: Call, ctx: "LegalizeCtx") -> Expr:
    """reshape and flatten: the row-major element order is kept."""
    shape, _ = out_tensor(call)
    src, _ = known_tensor(call.args[0].info, call, "argument 0")
    return _copy(call, ctx, lambda i: reshape_index(i, shape, src))


def _legalize_permute_dims(call: Call, ctx: "LegalizeCtx") -> Expr:
    ndim = len(out_tensor(call)[0])
    axes = call.attrs["axes"]
    perm = tuple(range(ndim - 1, -1, -1)) if axes is None else tuple(a + ndim if a < 0 else a for a in axes)
    inverse = {p: k for k, p in enumerate(perm)}
    return _copy(call, ctx, lambda i: tuple(i[inverse[d]] for d in range(ndim)))


def _legalize_expand_dims(call: Call, ctx: "LegalizeCtx") -> Expr:
    ndim = len(out_tensor(call)[0])
    new = {a + ndim if a < 0 else a for a in axes_attr(call, "axis", InferCtx("expand_dims")) or ()}
    return _copy(call, ctx, lambda i: tuple(v for k, v in enumerate(i) if k not in new))


def _legalize_squeeze(call: Call, ctx: "LegalizeCtx") -> Expr:
    src, _ = known_tensor(call.args[0].info, call, "argument 0")
    axes = axes_attr(call, "axis", InferCtx("squeeze"))
    if axes is None:
        drop = {k for k, d in enumerate(src) if isinstance(d, int) and d == 1}
    else:
        drop = {a + len(src) if a < 0 else a for a in axes}

    def index(i: Index) -> Index:
        kept = iter(i)
        return tuple(0 if k in drop else next(kept) for k in range(len(src)))

    return _copy(call, ctx, index)


def _legalize_broadcast_to(call: Call, ctx: "LegalizeCtx") -> Expr:
    shape, _ = out_tensor(call)
    src, _ = known_tensor(call.args[0].info, call, "argument 0")
    return _copy(call, ctx, lambda i: bcast_index(i, src, shape))


def _legalize_concat(call: Call, ctx: "LegalizeCtx") -> Expr:
    """Each output element selects its input by comparing the index along ``axis`` with the
    running offsets; only the chosen input is loaded."""
    fields = tuple_fields(call, 0, ctx)
    xs = [te.placeholder(*known_tensor(f.info, call, f"tensor {k} of the tuple"), f"x{k}") for k, f in enumerate(fields)]
    shape, dtype = out_tensor(call)
    axis = normalize_axis(int(call.attrs["axis"]), len(shape), InferCtx("concat"))

    def f(*i: Scalar) -> Scalar:
        offsets: list[Dim] = [0]
        for x in xs[:-1]:
            offsets.append(sym.add(offsets[-1], x.shape[axis]))
        value: Scalar = _at(xs[-1], i, axis, i[axis] - offsets[-1])
        for x, off, nxt in reversed(list(zip(xs[:-1], offsets[:-1], offsets[1:]))):
            value = te.if_then_else(te.lt(i[axis], nxt), _at(x, i, axis, i[axis] - off), value)
        return value

    out = te.compute(shape, f, "concat", dtype)
    return ctx.call_te("concat", fields, xs, [out], call.info)


def _at(x: te.Tensor, i: Index, axis: int, pos: Scalar) -> Scalar:
    """``x`` at ``i`` with the index along ``axis`` replaced by ``pos``."""
    return x[i[:axis] + (pos,) + i[axis + 1 :]]


def _legalize_split(call: Call, ctx: "LegalizeCtx") -> Expr:
    """One kernel with one output per part; part ``k`` copies from its start along ``axis``."""
    x = arg(call, 0, "x")
    info = call.info
    if not isinstance(info, TupleInfo):
        raise UnsupportedError(f"split: cannot legalize: the result is not a tuple ({info})")
    axis = normalize_axis(int(call.attrs["axis"]), x.ndim, InferCtx("split"))
    spec = call.attrs["indices_or_sections"]
    d = x.shape[axis]
    if isinstance(spec, tuple):
        points = [None, *spec]
        starts = [_clamp_bound(p, d, 1, True, InferCtx("split")) for p in points]
    else:
        part = sym.floordiv(d, spec)
        starts = [sym.mul(part, k) for k in range(spec)]
    outs = []
    for k, (field_info, start) in enumerate(zip(info.fields, starts)):
        shape, dtype = known_tensor(field_info, call, f"part {k} of the result")
        outs.append(te.compute(shape, lambda *i, s=start: _at(x, i, axis, i[axis] + s), f"part{k}", dtype))
    return ctx.call_te("split", call.args, [x], outs, call.info)


def _legalize_strided_slice(call: Call, ctx: "LegalizeCtx") -> Expr:
    """``out[.., i, ..] = x[.., begin + i * stride, ..]`` with ``begin`` clamped like Python's
    slicing (the same expressions inference used for the result's length)."""
    src, _ = known_tensor(call.args[0].info, call, "argument 0")
    ictx = InferCtx("strided_slice")
    axes, begin, end, strides = _slice_spec(call, ictx)
    ax = normalize_axes(axes, len(src), ictx)
    start = {a: (_clamp_bound(b, src[a], s, True, ictx), s) for a, b, s in zip(ax, begin, strides)}

    def index(i: Index) -> Index:
        out: list[Scalar] = list(i)
        for a, (b, s) in start.items():
            out[a] = b + i[a] * s
        return tuple(out)

    return _copy(call, ctx, index)


def _legalize_take(call: Call, ctx: "LegalizeCtx") -> Expr:
    """Indices may be negative (counted from the end); an index outside ``[-d, d)`` is clamped
    into range rather than read out of bounds."""
    x, idx = arg(call, 0, "x"), arg(call, 1, "indices")
    shape, dtype = out_tensor(call)
    axis = call.attrs["axis"]
    a = None if axis is None else normalize_axis(int(axis), x.ndim, InferCtx("take"))
    d = sym.product(x.shape) if a is None else x.shape[a]

    def f(*i: Scalar) -> Scalar:
        pos = i if a is None else i[a : a + idx.ndim]
        v = te.cast(idx[pos], "int64")
        v = te.if_then_else(te.lt(v, 0), v + d, v)
        v = te.minimum(te.maximum(v, 0), sym.sub(d, 1))
        if a is None:
            return x[reshape_index((v,), (d,), x.shape)]
        return x[i[:a] + (v,) + i[a + idx.ndim :]]

    out = te.compute(shape, f, "take", dtype)
    return ctx.call_te("take", call.args, [x, idx], [out], call.info)


def _legalize_shape_of(call: Call, ctx: "LegalizeCtx") -> Expr:
    """A tensor's shape is already in its struct info: the dims themselves, no kernel. A tensor
    of unknown shape keeps the call, which the VM runs (``vm.shape_of``)."""
    info = call.args[0].info
    if isinstance(info, TensorInfo) and info.shape is not None:
        return ShapeExpr.of(info.shape)
    return call


register(Op("reshape", _infer_reshape, OpPattern.INJECTIVE, num_args=2, legalize=_legalize_reshape))
register(Op("permute_dims", _infer_permute_dims, OpPattern.INJECTIVE, attrs={"axes": None}, num_args=1, legalize=_legalize_permute_dims))
register(Op("expand_dims", _infer_expand_dims, OpPattern.INJECTIVE, attrs={"axis": (0,)}, num_args=1, legalize=_legalize_expand_dims))
register(Op("squeeze", _infer_squeeze, OpPattern.INJECTIVE, attrs={"axis": None}, num_args=1, legalize=_legalize_squeeze))
register(Op("flatten", _infer_flatten, OpPattern.INJECTIVE, attrs={"start_dim": 0, "end_dim": -1}, num_args=1, legalize=_legalize_reshape))
register(Op("broadcast_to", _infer_broadcast_to, OpPattern.BROADCAST, num_args=2, legalize=_legalize_broadcast_to))
register(Op("concat", _infer_concat, OpPattern.INJECTIVE, attrs={"axis": 0}, num_args=1, legalize=_legalize_concat))
register(Op("split", _infer_split, OpPattern.INJECTIVE, attrs={"indices_or_sections": 2, "axis": 0}, num_args=1, legalize=_legalize_split))
register(Op("strided_slice", _infer_strided_slice, OpPattern.INJECTIVE, attrs={"axes": (), "begin": (), "end": (), "strides": None}, num_args=1, legalize=_legalize_strided_slice))
register(Op("take", _infer_take, OpPattern.INJECTIVE, attrs={"axis": 0}, num_args=2, legalize=_legalize_take))
register(Op("shape_of", _infer_shape_of, OpPattern.OPAQUE, num_args=1, legalize=_legalize_shape_of))

# -- constructors ---------------------------------------------------------------------------------


def _ints(v: int | Sequence[int]) -> tuple[int, ...]:
    return (v,) if isinstance(v, int) else tuple(v)


def reshape(x: Expr, shape: Expr | Sequence[Dim]) -> Call:
    """``x`` with a new shape of the same element count; one entry may be -1 (inferred)."""
    return make_call("reshape", [x, to_shape_expr(shape, "reshape")])


def permute_dims(x: Expr, axes: Sequence[int] | None = None) -> Call:
    """Dims reordered so that output dim ``i`` is input dim ``axes[i]``; None reverses them."""
    return make_call("permute_dims", [x], axes=None if axes is None else tuple(axes))


def expand_dims(x: Expr, axis: int | Sequence[int]) -> Call:
    """New size-1 dims at ``axis`` (positions in the output)."""
    return make_call("expand_dims", [x], axis=_ints(axis))


def squeeze(x: Expr, axis: int | Sequence[int] | None = None) -> Call:
    """Size-1 dims removed: those at ``axis`` (checked to be 1), or with None every dim known to
    be 1 at compile time (a symbolic dim is kept even when it is 1 at run time, so the rank
    never depends on run-time values)."""
    return make_call("squeeze", [x], axis=None if axis is None else _ints(axis))


def flatten(x: Expr, start_dim: int = 0, end_dim: int = -1) -> Call:
    """Dims ``start_dim..end_dim`` (inclusive) merged into one; a 0-d tensor becomes ``(1,)``."""
    return make_call("flatten", [x], start_dim=start_dim, end_dim=end_dim)


def broadcast_to(x: Expr, shape: Expr | Sequence[Dim]) -> Call:
    """``x`` broadcast (NumPy rules, one way) to ``shape``."""
    return make_call("broadcast_to", [x, to_shape_expr(shape, "broadcast_to")])


def concat(tensors: Expr | Sequence[Expr], axis: int = 0) -> Call:
    """The tensors joined along ``axis``; the other dims must agree."""
    arg = tensors if isinstance(tensors, Expr) else Tuple(tuple(tensors))
    return make_call("concat", [arg], axis=axis)


def split(x: Expr, indices_or_sections: int | Sequence[Dim], axis: int = 0) -> Call:
    """A tuple of parts of ``x`` along ``axis``: an int ``n`` gives ``n`` equal parts (the dim
    must divide), a sequence gives the split points like ``numpy.split``."""
    spec = indices_or_sections if isinstance(indices_or_sections, int) else tuple(indices_or_sections)
    return make_call("split", [x], indices_or_sections=spec, axis=axis)


def strided_slice(
    x: Expr,
    axes: Sequence[int],
    begin: Sequence[Dim | None],
    end: Sequence[Dim | None],
    strides: Sequence[int] | None = None,
) -> Call:
    """``x[..., begin:end:stride, ...]`` on each of ``axes`` with Python's slicing semantics
    (None is the open end; symbolic bounds are taken as non-negative, checked at run time)."""
    return make_call(
        "strided_slice",
        [x],
        axes=tuple(axes),
        begin=tuple(begin),
        end=tuple(end),
        strides=None if strides is None else tuple(strides),
    )


def take(x: Expr, indices: Expr, axis: int | None = 0) -> Call:
    """Entries of ``x`` along ``axis`` picked by an integer ``indices`` tensor (the axis is
    replaced by the indices' shape); None indexes the flattened tensor."""
    return make_call("take", [x, indices], axis=axis)


def shape_of(x: Expr) -> Call:
    """The shape of ``x`` as a shape value."""
    return make_call("shape_of", [x])
