"""Converters of ONNX shape and data-movement ops: ``Shape``, ``Size``, ``Constant``,
``ConstantOfShape``, ``Range``, ``Reshape``, ``Flatten``, ``Squeeze``, ``Unsqueeze``,
``Transpose``, ``Concat``, ``Split``, ``Slice``, ``Gather``, ``Expand``, ``Tile``, ``Pad``,
``DepthToSpace`` and ``SpaceToDepth``.

Small integer tensors with tracked contents (``Value.elems``) flow through these without
bindings: ``Shape``, ``Gather``, ``Unsqueeze``, ``Concat``, ``Slice``, ``Squeeze`` and
``Reshape`` of them only rearrange symbolic dims.
"""

from __future__ import annotations

import numpy as np

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_math import scalar_const
from tilework.frontend.onnx.registry import Result, converter
from tilework.frontend.onnx.values import MAX_ELEMS, Elem, Value, static_ints
from tilework.ir import sym
from tilework.ir.graph import Constant, Expr, ShapeExpr, TupleGetItem
from tilework.ir.info import TensorInfo
from tilework.ir.sym import Dim
from tilework.op import create, manipulate, pad, reduce
from tilework.op import elementwise as ew
from tilework.op.shape import shape_to_tensor

INT64_MAX = 2**63 - 1


def norm_axis(ctx: NodeCtx, axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ctx.unsupported(f"axis {axis} is out of range for rank {ndim}")
    return axis + ndim if axis < 0 else axis


def _py_slice(n: int, start: int, end: int, step: int) -> range:
    return range(*slice(start, end, step).indices(n))


# -- shapes and constants ------------------------------------------------------------------------


@converter("Shape", 1, 25)
def _shape(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    start, end = int(ctx.attr("start", 0)), ctx.attr("end", None)
    picked = [shape[i] for i in _py_slice(len(shape), start, len(shape) if end is None else int(end), 1)]
    return Value.of_elems(picked, "int64")


@converter("Size", 1, 25)
def _size(ctx: NodeCtx) -> Result:
    return Value.of_elems((sym.product(ctx.known_shape(0)),), "int64", scalar=True)


@converter("Constant", 1, 25)
def _constant(ctx: NodeCtx) -> Result:
    for name in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if not ctx.has_attr(name):
            continue
        v = ctx.attr(name)
        if name == "value":
            return Value.of_const(v)
        dtype = "float32" if "float" in name else "int64"
        return Value.of_const(np.asarray(v, dtype=dtype))
    raise ctx.unsupported("only tensor, float(s) and int(s) constants are supported (not strings or sparse tensors)")


@converter("ConstantOfShape", 9, 25, static_inputs=(0,))
def _constant_of_shape(ctx: NodeCtx) -> Result:
    shape = ctx.dims(0, "shape")
    fill = ctx.attr("value", None)
    arr = np.zeros((1,), np.float32) if fill is None else np.asarray(fill).reshape(-1)
    static = static_ints(shape)
    if static is not None and int(np.prod(static, dtype=np.int64)) <= MAX_ELEMS:
        return Value.of_const(np.full(static, arr[0], dtype=arr.dtype))
    value = arr[0].item()
    return ctx.emit(create.full(shape, value, str(arr.dtype)))


@converter("Range", 11, 27, static_inputs=(0, 1, 2))
def _range(ctx: NodeCtx) -> Result:
    dtype = ctx.dtype(0)
    consts = [c for c in (ctx.const(i) for i in range(3)) if c is not None]
    if len(consts) == 3:
        start, limit, delta = (c.reshape(()).item() for c in consts)
        if delta == 0:
            raise ctx.unsupported("delta is 0")
        n = max(int(np.ceil((limit - start) / delta)), 0)
        if n > MAX_ELEMS:  # a run-time arange, not a constant of n elements made here
            return ctx.emit(create.arange(start, limit, delta, dtype))
        arr = (np.asarray(start, dtype=dtype) + np.arange(n, dtype=dtype) * np.asarray(delta, dtype=dtype)).astype(dtype)
        return Value.of_const(arr)
    if dtype not in ("int32", "int64"):
        return _runtime_range(ctx, dtype)
    delta_c = ctx.const(2)
    if delta_c is None:
        raise ctx.unsupported("delta must be a constant")
    start, limit = ctx.scalar(0, "start"), ctx.scalar(1, "limit")
    return ctx.emit(create.arange(start, limit, int(delta_c.reshape(())), dtype))


def _runtime_range(ctx: NodeCtx, dtype: str) -> Result:
    """A float range with bounds known only at run time: its length ``max(ceil((limit - start)
    / delta), 0)`` is computed in the graph and lifted into a fresh sym var; the elements are
    ``start + i * delta``."""
    start, limit, delta = (ctx.emit(manipulate.reshape(ctx.expr(i), ())) for i in range(3))
    span = ctx.emit(ew.ceil(ctx.emit(ew.divide(ctx.emit(ew.subtract(limit, start)), delta))))
    count = ctx.emit(ew.astype(ctx.emit(ew.maximum(span, scalar_const(0, dtype))), "int64"))
    (n,) = ctx.imp.lift_dims(Value.of_expr(ctx.emit(manipulate.reshape(count, (1,)))), "range length", ctx)
    steps = ctx.emit(ew.astype(ctx.emit(create.arange(0, n, 1, "int64")), dtype))
    return ctx.emit(ew.add(start, ctx.emit(ew.multiply(steps, delta))))


# -- reshaping -----------------------------------------------------------------------------------


def _reshape_value(ctx: NodeCtx, v: Value, target: tuple[Dim, ...]) -> Result:
    """``v`` reshaped to ``target`` (entries resolved: no 0, at most one -1)."""
    if v.elems is not None and len(target) <= 1 and v.ndim in (0, 1):
        n = len(v.elems)
        if not target or target[0] in (-1, n):
            return Value.of_elems(v.elems, v.dtype or "int64", scalar=not target)
    static = static_ints(target)
    if v.const is not None and static is not None:
        return Value.of_const(v.const.reshape(static))
    return ctx.emit(manipulate.reshape(ctx.imp.materialize(v), target))


def _runtime_target(ctx: NodeCtx, shape: tuple[Dim, ...], allowzero: bool) -> tuple[Dim, ...]:
    """A target shape known only at run time, its 0 (copy) and -1 (the rest) entries resolved
    by graph ops before its values become fresh sym vars (a sym var is a size: never -1)."""
    info = ctx.info(1)
    if info.shape is None or len(info.shape) != 1 or not isinstance(info.shape[0], int):
        return ctx.dims(1, "shape")  # refused there with a message
    n = info.shape[0]
    t = ctx.emit(ew.astype(ctx.expr(1), "int64"))

    def const(v: int) -> Expr:
        return Constant.of(np.asarray(v, np.int64))

    if not allowzero:
        own = tuple(shape[:n]) + (0,) * max(0, n - len(shape))
        t = ctx.emit(ew.where(ctx.emit(ew.equal(t, const(0))), ctx.emit(shape_to_tensor(ShapeExpr(own), "int64")), t))
    is_rest = ctx.emit(ew.equal(t, const(-1)))
    known = ctx.emit(reduce.prod(ctx.emit(ew.where(is_rest, const(1), t)), axis=0))
    numel = ctx.emit(manipulate.reshape(ctx.emit(shape_to_tensor(ShapeExpr((sym.product(shape),)), "int64")), ()))
    rest = ctx.emit(ew.floor_divide(numel, ctx.emit(ew.maximum(known, const(1)))))
    resolved = ctx.emit(ew.where(is_rest, rest, t))
    return ctx.imp.lift_dims(Value(TensorInfo((n,), "int64"), resolved), "shape", ctx)


@converter("Reshape", 5, 25, static_inputs=(1,))
def _reshape(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    elems = ctx.value(1).elems
    if elems is None or any(isinstance(e, bool) for e in elems):
        return _reshape_value(ctx, ctx.value(0), _runtime_target(ctx, shape, bool(int(ctx.attr("allowzero", 0)))))
    target = list(ctx.dims(1, "shape"))
    if not int(ctx.attr("allowzero", 0)):
        for i, d in enumerate(target):
            if isinstance(d, int) and d == 0:
                if i >= len(shape):
                    raise ctx.unsupported(f"shape entry {i} is 0 (copy) but the input has rank {len(shape)}")
                target[i] = shape[i]
    return _reshape_value(ctx, ctx.value(0), tuple(target))


@converter("Flatten", 1, 25)
def _flatten(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    axis = int(ctx.attr("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise ctx.unsupported(f"axis {axis} is out of range for rank {len(shape)}")
    return _reshape_value(ctx, ctx.value(0), (sym.product(shape[:axis]), sym.product(shape[axis:])))


def _axes_operand(ctx: NodeCtx, attr_until: int) -> tuple[int, ...] | None:
    """Axes given as an attribute (schema versions up to ``attr_until``) or as operand 1."""
    if ctx.version <= attr_until:
        axes = ctx.attr("axes", None)
        return None if axes is None else tuple(int(a) for a in axes)
    return ctx.opt_ints(1, "axes")


@converter("Squeeze", 1, 25, static_inputs=(1,))
def _squeeze(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    axes = _axes_operand(ctx, 11)
    if axes is None:
        if any(not isinstance(d, int) and not sym.prove_ge(d, 2) for d in shape):
            raise ctx.unsupported(f"Squeeze without axes of shape {shape}: which symbolic dims are 1 (and so the result's rank) is known only at run time")
        keep = tuple(d for d in shape if not (isinstance(d, int) and d == 1))
    else:
        drop = {norm_axis(ctx, a, len(shape)) for a in axes}
        keep = tuple(d for i, d in enumerate(shape) if i not in drop)
    v = ctx.value(0)
    if v.elems is not None and v.ndim == 1 and len(keep) == 0:
        return Value.of_elems(v.elems, v.dtype or "int64", scalar=True)
    kept = static_ints(keep)
    if v.const is not None and kept is not None:
        return Value.of_const(v.const.reshape(kept))
    return ctx.emit(manipulate.squeeze(ctx.expr(0), None if axes is None else tuple(norm_axis(ctx, a, len(shape)) for a in axes)))


@converter("Unsqueeze", 1, 25, static_inputs=(1,))
def _unsqueeze(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    axes = _axes_operand(ctx, 11)
    if axes is None:
        raise ctx.unsupported("axes are required")
    out_rank = len(shape) + len(axes)
    new = sorted(norm_axis(ctx, a, out_rank) for a in axes)
    v = ctx.value(0)
    if v.elems is not None and v.ndim == 0 and out_rank == 1:
        return Value.of_elems(v.elems, v.dtype or "int64")
    if v.const is not None:
        return Value.of_const(np.expand_dims(v.const, tuple(new)))
    return ctx.emit(manipulate.expand_dims(ctx.expr(0), new))


@converter("Transpose", 1, 25)
def _transpose(ctx: NodeCtx) -> Result:
    perm = ctx.attr("perm", None)
    axes = None if perm is None else tuple(int(p) for p in perm)
    v = ctx.value(0)
    if v.const is not None:  # e.g. the pads torch's exporter reorders: [n, 2] -> [2, n]
        if axes is not None and sorted(axes) != list(range(v.const.ndim)):
            raise ctx.unsupported(f"perm {list(axes)} is not a permutation of the {v.const.ndim} axes")
        return Value.of_const(np.ascontiguousarray(np.transpose(v.const, axes)))
    return ctx.emit(manipulate.permute_dims(ctx.expr(0), axes))


# -- joining and splitting -----------------------------------------------------------------------


@converter("Concat", 4, 13)
def _concat(ctx: NodeCtx) -> Result:
    values = [ctx.value(i) for i in range(ctx.num_inputs)]
    parts = [v.elems for v in values if v.elems is not None and v.ndim == 1]
    if len(parts) == len(values):
        joined: list[Elem] = [e for elems in parts for e in elems]
        return Value.of_elems(joined, values[0].dtype or "int64")
    rank = len(ctx.known_shape(0))
    axis = norm_axis(ctx, int(ctx.attr("axis")), rank)
    return ctx.emit(manipulate.concat([ctx.expr(i) for i in range(ctx.num_inputs)], axis))


@converter("Split", 2, 18, static_inputs=(1,))
def _split(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    axis = norm_axis(ctx, int(ctx.attr("axis", 0)), len(shape))
    d = shape[axis]
    count = len(ctx.node.output)
    sizes: tuple[Dim, ...] | None = None
    if ctx.version < 13:
        given = ctx.attr("split", None)
        sizes = None if not given else tuple(int(s) for s in given)
    elif ctx.has_input(1):
        sizes = ctx.dims(1, "split")
    if sizes is None and ctx.version >= 18 and ctx.has_attr("num_outputs"):
        count = int(ctx.attr("num_outputs"))
        part = sym.ceildiv(d, count)
        sizes = tuple([part] * (count - 1) + [sym.sub(d, sym.mul(part, count - 1))])
    if sizes is None:
        parts = ctx.emit(manipulate.split(ctx.expr(0), count, axis))
        return [ctx.emit(TupleGetItem(parts, i)) for i in range(count)]
    return split_at(ctx, ctx.expr(0), sizes, axis)


def split_at(ctx: NodeCtx, x: Expr, sizes: tuple[Dim, ...], axis: int) -> list[Expr]:
    """``x`` cut along ``axis`` into consecutive pieces of ``sizes`` (which add up to the dim)."""
    if len(sizes) == 1:
        return [x]
    points: list[Dim] = []
    acc: Dim = 0
    for s in sizes[:-1]:
        acc = sym.add(acc, s)
        points.append(acc)
    parts = ctx.emit(manipulate.split(x, points, axis))
    return [ctx.emit(TupleGetItem(parts, i)) for i in range(len(sizes))]


@converter("Slice", 1, 13, static_inputs=(1, 2, 3, 4))
def _slice(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    if ctx.version < 10:
        starts: tuple[Dim, ...] = tuple(int(s) for s in ctx.attr("starts"))
        ends: tuple[Dim, ...] = tuple(int(e) for e in ctx.attr("ends"))
        axes = tuple(int(a) for a in ctx.attr("axes", range(len(starts))))
        steps: tuple[int, ...] = (1,) * len(starts)
    else:
        starts, ends = ctx.dims(1, "starts"), ctx.dims(2, "ends")
        axes = ctx.opt_ints(3, "axes") or tuple(range(len(starts)))
        steps = ctx.opt_ints(4, "steps") or (1,) * len(starts)
    axes = tuple(norm_axis(ctx, a, len(shape)) for a in axes)
    if 0 in steps:
        raise ctx.unsupported("a step of 0")
    v = ctx.value(0)
    b_static, e_static = static_ints(starts), static_ints(ends)
    if v.elems is not None and v.ndim == 1 and b_static is not None and e_static is not None and axes == (0,):
        picked = [v.elems[i] for i in _py_slice(len(v.elems), b_static[0], e_static[0], steps[0])]
        return Value.of_elems(picked, v.dtype or "int64")
    if v.const is not None and b_static is not None and e_static is not None:
        index = [slice(None)] * len(shape)
        for a, b, e, s in zip(axes, b_static, e_static, steps):
            index[a] = slice(b, e, s)
        return Value.of_const(v.const[tuple(index)])
    begin = [_bound(b) for b in starts]
    end = [_bound(e) for e in ends]
    return ctx.emit(manipulate.strided_slice(ctx.expr(0), axes, begin, end, steps))


def _bound(d: Dim) -> Dim | None:
    """A slice bound; the int64 extremes ONNX uses for "to the end" become open ends."""
    if isinstance(d, int) and (d >= INT64_MAX or d <= -INT64_MAX - 1):
        return None
    return d


@converter("Gather", 1, 13)
def _gather(ctx: NodeCtx) -> Result:
    v = ctx.value(0)
    axis = norm_axis(ctx, int(ctx.attr("axis", 0)), max(v.ndim, 1))
    idx = ctx.const(1)
    if v.elems is not None and v.ndim == 1 and idx is not None and idx.ndim <= 1:
        n = len(v.elems)
        picked = [v.elems[int(i) + n if int(i) < 0 else int(i)] for i in idx.reshape(-1)]
        return Value.of_elems(picked, v.dtype or "int64", scalar=idx.ndim == 0)
    if v.const is not None and idx is not None and v.const.size <= MAX_ELEMS:
        return Value.of_const(np.take(v.const, idx.astype(np.int64), axis=axis))
    return ctx.emit(manipulate.take(ctx.expr(0), ctx.expr(1), axis))


@converter("Expand", 8, 13, static_inputs=(1,))
def _expand(ctx: NodeCtx) -> Result:
    """Bidirectional broadcast of the input with the requested shape."""
    shape = ctx.known_shape(0)
    target = ctx.dims(1, "shape")
    n = max(len(shape), len(target))
    src = (1,) * (n - len(shape)) + tuple(shape)
    req = (1,) * (n - len(target)) + tuple(target)
    out: list[Dim] = []
    for s, r in zip(src, req):
        if isinstance(r, int) and r == 1:
            out.append(s)
        elif isinstance(s, int) and s == 1:
            out.append(r)
        else:
            out.append(s if s is r or sym.prove_eq(s, r) else r)
    v = ctx.value(0)
    if v.elems is not None and v.ndim in (0, 1) and len(out) == 1 and isinstance(out[0], int) and len(v.elems) == 1:
        return Value.of_elems(v.elems * out[0], v.dtype or "int64")
    if tuple(out) == tuple(shape):
        return v
    return ctx.emit(manipulate.broadcast_to(ctx.expr(0), tuple(out)))


@converter("Tile", 6, 13, static_inputs=(1,))
def _tile(ctx: NodeCtx) -> Result:
    return ctx.emit(pad.tile(ctx.expr(0), ctx.dims(1, "repeats")))


@converter("Pad", 2, 25, static_inputs=(1, 3))
def _pad(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    rank = len(shape)
    mode = ctx.attr("mode", "constant")
    dtype = ctx.dtype(0)
    if ctx.version < 11:
        pads: tuple[Dim, ...] = tuple(int(p) for p in ctx.attr("pads"))
        value: Expr = scalar_const(float(ctx.attr("value", 0.0)), dtype)
    else:
        pads = ctx.dims(1, "pads")
        value = ctx.expr(2) if ctx.has_input(2) else scalar_const(0, dtype)
        if ctx.has_input(2) and ctx.rank(2) != 0:
            value = ctx.emit(manipulate.reshape(value, ()))
        if ctx.has_input(3):
            axes = [norm_axis(ctx, a, rank) for a in ctx.ints(3, "axes")]
            full: list[Dim] = [0] * (2 * rank)
            for k, a in enumerate(axes):
                full[a], full[rank + a] = pads[k], pads[len(axes) + k]
            pads = tuple(full)
    if len(pads) != 2 * rank:
        raise ctx.unsupported(f"pads has {len(pads)} entries for an input of rank {rank}")
    return ctx.emit(pad.pad(ctx.expr(0), value, pads, mode))


@converter("DepthToSpace", 1, 28)
def _depth_to_space(ctx: NodeCtx) -> Result:
    b, c, h, w = ctx.known_shape(0)
    bs = int(ctx.attr("blocksize"))
    depth = sym.floordiv(c, bs * bs)
    if ctx.attr("mode", "DCR") == "DCR":
        x = ctx.emit(manipulate.reshape(ctx.expr(0), (b, bs, bs, depth, h, w)))
        x = ctx.emit(manipulate.permute_dims(x, (0, 3, 4, 1, 5, 2)))
    else:
        x = ctx.emit(manipulate.reshape(ctx.expr(0), (b, depth, bs, bs, h, w)))
        x = ctx.emit(manipulate.permute_dims(x, (0, 1, 4, 2, 5, 3)))
    return ctx.emit(manipulate.reshape(x, (b, depth, sym.mul(h, bs), sym.mul(w, bs))))


@converter("SpaceToDepth", 1, 28)
def _space_to_depth(ctx: NodeCtx) -> Result:
    b, c, h, w = ctx.known_shape(0)
    bs = int(ctx.attr("blocksize"))
    x = ctx.emit(manipulate.reshape(ctx.expr(0), (b, c, sym.floordiv(h, bs), bs, sym.floordiv(w, bs), bs)))
    perm = (0, 3, 5, 1, 2, 4) if ctx.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    x = ctx.emit(manipulate.permute_dims(x, perm))
    return ctx.emit(manipulate.reshape(x, (b, sym.mul(c, bs * bs), sym.floordiv(h, bs), sym.floordiv(w, bs))))
