"""Converters of ONNX neural-network ops: ``MatMul``, ``Gemm``, the normalizations
(``LayerNormalization``, ``RMSNormalization``, ``BatchNormalization``, ``GroupNormalization``,
``InstanceNormalization``, ``LpNormalization``, ``MeanVarianceNormalization``), ``Conv`` and
pooling (1-D and 2-D), ``Dropout`` (inference), and the indexing ops ``GatherElements``,
``ScatterElements``, ``Trilu``, ``OneHot`` and ``EyeLike``.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

import numpy as np

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_math import cast_to, scalar_const
from tilework.frontend.onnx.convert_shape import norm_axis
from tilework.frontend.onnx.registry import ConvertFn, Result, converter
from tilework.frontend.onnx.values import Value, static_ints
from tilework.ir import sym
from tilework.ir.graph import Constant, Expr
from tilework.ir.sym import Dim
from tilework.op import conv, create, index, linalg, manipulate, nn, norm_extra, pad, reduce
from tilework.op import shape as shape_op
from tilework.op import elementwise as ew

# -- matrix products ------------------------------------------------------------------------------


@converter("MatMul", 1, 13)
def _matmul(ctx: NodeCtx) -> Result:
    return ctx.emit(linalg.matmul(ctx.expr(0), ctx.expr(1)))


@converter("Einsum", 12, 28)
def _einsum(ctx: NodeCtx) -> Result:
    return ctx.emit(linalg.einsum(ctx.attr("equation"), *(ctx.expr(i) for i in range(ctx.num_inputs))))


@converter("Gemm", 7, 13)
def _gemm(ctx: NodeCtx) -> Result:
    """``alpha * A' @ B' + beta * C`` with ``A'``, ``B'`` transposed on request."""
    a, b = ctx.expr(0), ctx.expr(1)
    dtype = ctx.dtype(0)
    if int(ctx.attr("transA", 0)):
        a = ctx.emit(manipulate.permute_dims(a, (1, 0)))
    if int(ctx.attr("transB", 0)):
        b = ctx.emit(manipulate.permute_dims(b, (1, 0)))
    y = ctx.emit(linalg.matmul(a, b))
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if alpha != 1.0:
        y = ctx.emit(ew.multiply(y, scalar_const(alpha, dtype)))
    if ctx.has_input(2) and beta != 0.0:
        c = ctx.expr(2)
        if beta != 1.0:
            c = ctx.emit(ew.multiply(c, scalar_const(beta, dtype)))
        y = ctx.emit(ew.add(y, c))
    return y


# -- normalizations --------------------------------------------------------------------------------


def _param_for(ctx: NodeCtx, i: int, target: Sequence[Dim]) -> Expr:
    """Operand ``i`` broadcast (one way) to ``target`` when its shape differs."""
    shape = ctx.known_shape(i)
    e = ctx.expr(i)
    if tuple(shape) == tuple(target):
        return e
    return ctx.emit(manipulate.broadcast_to(e, tuple(target)))


@converter("LayerNormalization", 17, 17)
def _layer_norm(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    axis = norm_axis(ctx, int(ctx.attr("axis", -1)), len(shape))
    eps = float(ctx.attr("epsilon", 1e-5))
    axes = tuple(range(axis, len(shape)))
    inner = shape[axis:]
    x = ctx.expr(0)
    gamma = _param_for(ctx, 1, inner)
    beta = _param_for(ctx, 2, inner) if ctx.has_input(2) else ctx.emit(create.zeros_like(gamma))
    outs: list[Expr | None] = [ctx.emit(nn.layer_norm(x, gamma, beta, axes, eps))]
    wanted = [len(ctx.node.output) > k and bool(ctx.node.output[k]) for k in (1, 2)]
    if any(wanted):
        xf = cast_to(ctx, x, "float32")
        mean = ctx.emit(reduce.mean(xf, axes, keepdims=True))
        dev = ctx.emit(ew.subtract(xf, mean))
        var = ctx.emit(reduce.mean(ctx.emit(ew.multiply(dev, dev)), axes, keepdims=True))
        inv = ctx.emit(ew.rsqrt(ctx.emit(ew.add(var, scalar_const(eps, "float32")))))
        outs += [mean if wanted[0] else None, inv if wanted[1] else None]
    return outs


@converter("RMSNormalization", 23, 23)
def _rms_norm(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    axis = norm_axis(ctx, int(ctx.attr("axis", -1)), len(shape))
    axes = tuple(range(axis, len(shape)))
    return ctx.emit(nn.rms_norm(ctx.expr(0), _param_for(ctx, 1, shape[axis:]), axes, float(ctx.attr("epsilon", 1e-5))))


@converter("BatchNormalization", 9, 15)
def _batch_norm(ctx: NodeCtx) -> Result:
    """Inference normalizes with the given running statistics. Training (``training_mode=1``;
    before opset 14, asking for more than ``Y``) normalizes with the batch's mean and
    population variance over every axis but the channel one, and also returns the running
    statistics moved towards them: ``running * momentum + batch * (1 - momentum)``."""
    x, scale, bias, mean, var = (ctx.expr(i) for i in range(5))
    dtype, stat_dtype = ctx.dtype(0), ctx.dtype(3)
    eps = float(ctx.attr("epsilon", 1e-5))
    extra = [k for k, o in enumerate(ctx.node.output) if o and k > 0]
    training = bool(int(ctx.attr("training_mode", 0))) if ctx.version >= 14 else bool(extra)
    if not training:
        if extra:
            raise ctx.unsupported("running-statistics outputs outside training mode")
        mean, var = cast_to(ctx, mean, dtype), cast_to(ctx, var, dtype)
        return ctx.emit(norm_extra.batch_norm(x, mean, var, scale, bias, 1, eps))
    if any(k > 2 for k in extra):
        raise ctx.unsupported("the saved_mean/saved_var outputs of training mode (opset < 14)")
    axes = tuple(k for k in range(ctx.rank(0)) if k != 1)
    batch_mean = ctx.emit(reduce.mean(x, axes))
    shape = [ctx.known_shape(0)[1] if k == 1 else 1 for k in range(ctx.rank(0))]
    dev = ctx.emit(ew.subtract(x, ctx.emit(manipulate.reshape(batch_mean, shape))))
    batch_var = ctx.emit(reduce.mean(ctx.emit(ew.multiply(dev, dev)), axes))
    y = ctx.emit(norm_extra.batch_norm(x, batch_mean, batch_var, scale, bias, 1, eps))
    momentum = float(ctx.attr("momentum", 0.9))

    def running(old: Expr, batch: Expr) -> Expr:
        kept = ctx.emit(ew.multiply(cast_to(ctx, old, dtype), scalar_const(momentum, dtype)))
        moved = ctx.emit(ew.add(kept, ctx.emit(ew.multiply(batch, scalar_const(1.0 - momentum, dtype)))))
        return cast_to(ctx, moved, stat_dtype)

    return [y, running(mean, batch_mean), running(var, batch_var)]


@converter("GroupNormalization", 18, 21)
def _group_norm(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    groups = int(ctx.attr("num_groups"))
    eps = float(ctx.attr("epsilon", 1e-5))
    channels = shape[1]
    scale, bias = ctx.expr(1), ctx.expr(2)
    if ctx.version < 21:  # one scale and bias per group: repeat them per channel
        if not isinstance(channels, int):
            raise ctx.unsupported("per-group scale needs a static channel count")
        per = channels // groups
        idx = Constant.of(np.arange(channels, dtype=np.int64) // per)
        scale, bias = ctx.emit(manipulate.take(scale, idx)), ctx.emit(manipulate.take(bias, idx))
    return ctx.emit(norm_extra.group_norm(ctx.expr(0), scale, bias, groups, eps))


@converter("InstanceNormalization", 6, 22)
def _instance_norm(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    if not isinstance(shape[1], int):
        raise ctx.unsupported("instance normalization needs a static channel count")
    return ctx.emit(norm_extra.group_norm(ctx.expr(0), ctx.expr(1), ctx.expr(2), shape[1], float(ctx.attr("epsilon", 1e-5))))


@converter("LpNormalization", 1, 22)
def _lp_norm(ctx: NodeCtx) -> Result:
    axis = norm_axis(ctx, int(ctx.attr("axis", -1)), ctx.rank(0))
    p = int(ctx.attr("p", 2))
    x = ctx.expr(0)
    if p == 1:
        norm = ctx.emit(reduce.sum(ctx.emit(ew.abs(x)), axis, keepdims=True))
    elif p == 2:
        norm = ctx.emit(ew.sqrt(ctx.emit(reduce.sum(ctx.emit(ew.multiply(x, x)), axis, keepdims=True))))
    else:
        raise ctx.unsupported(f"p={p} (only 1 and 2 are defined)")
    zero = scalar_const(0, ctx.dtype(0))
    safe = ctx.emit(ew.where(ctx.emit(ew.equal(norm, zero)), scalar_const(1, ctx.dtype(0)), norm))
    return ctx.emit(ew.where(ctx.emit(ew.equal(norm, zero)), zero, ctx.emit(ew.divide(x, safe))))


@converter("MeanVarianceNormalization", 9, 13)
def _mvn(ctx: NodeCtx) -> Result:
    axes = tuple(norm_axis(ctx, int(a), ctx.rank(0)) for a in ctx.attr("axes", (0, 2, 3)))
    x = ctx.expr(0)
    mean = ctx.emit(reduce.mean(x, axes, keepdims=True))
    dev = ctx.emit(ew.subtract(x, mean))
    var = ctx.emit(reduce.mean(ctx.emit(ew.multiply(dev, dev)), axes, keepdims=True))
    std = ctx.emit(ew.sqrt(ctx.emit(ew.add(var, scalar_const(1e-9, ctx.dtype(0))))))
    return ctx.emit(ew.divide(dev, std))


@converter("Dropout", 7, 22)
def _dropout(ctx: NodeCtx) -> Result:
    """Inference: the identity (and an all-true mask when asked for)."""
    training = ctx.const(2) if ctx.version >= 12 and ctx.has_input(2) else None
    if ctx.version >= 12 and ctx.has_input(2) and (training is None or bool(training.reshape(()))):
        raise ctx.unsupported("training mode (random dropout) is not supported")
    out: list[Value | Expr] = [ctx.value(0)]
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        out.append(ctx.emit(create.ones_like(ctx.expr(0), "bool")))
    return out


# -- convolution and pooling ------------------------------------------------------------------------


def _pads(ctx: NodeCtx, spatial: Sequence[Dim], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]) -> tuple[int, ...]:
    n = len(spatial)
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return tuple(int(p) for p in ctx.attr("pads", (0,) * (2 * n)))
    if auto == "VALID":
        return (0,) * (2 * n)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.unsupported(f"auto_pad={auto!r}")
    before, after = [], []
    for d, k, s, dil in zip(spatial, kernel, strides, dilations):
        if not isinstance(d, int):
            raise ctx.unsupported(f"auto_pad={auto} with a symbolic spatial dim")
        total = max((-(-d // s) - 1) * s + (k - 1) * dil + 1 - d, 0)
        small, big = total // 2, total - total // 2
        before.append(small if auto == "SAME_UPPER" else big)
        after.append(big if auto == "SAME_UPPER" else small)
    return tuple(before + after)


@converter("Conv", 1, 22)
def _conv(ctx: NodeCtx) -> Result:
    wshape = ctx.known_shape(1)
    shape = ctx.known_shape(0)
    n = len(shape) - 2
    if n not in (1, 2):
        raise ctx.unsupported(f"{n}-D convolution (1-D and 2-D are supported)")
    kernel = tuple(int(k) for k in ctx.attr("kernel_shape", wshape[2:]))
    strides = tuple(int(s) for s in ctx.attr("strides", (1,) * n))
    dil = tuple(int(d) for d in ctx.attr("dilations", (1,) * n))
    pads = _pads(ctx, shape[2:], kernel, strides, dil)
    fn = conv.conv1d if n == 1 else conv.conv2d
    bias = ctx.expr(2) if ctx.has_input(2) else None
    return ctx.emit(fn(ctx.expr(0), ctx.expr(1), bias, strides, pads, dil, int(ctx.attr("group", 1))))


def _too_much_padding(pads: Sequence[int], kernel: Sequence[int], dil: Sequence[int]) -> bool:
    n = len(kernel)
    return any(2 * max(pads[i], pads[n + i]) > dil[i] * (kernel[i] - 1) + 1 for i in range(n))


def _pad_explicitly(ctx: NodeCtx, x: Expr, pads: tuple[int, ...]) -> tuple[Expr, tuple[int, ...]]:
    """Max pooling with padding wider than half the window: pad the input itself with the
    lowest value and pool without padding."""
    dtype = ctx.dtype(0)
    fill = float(np.finfo(np.dtype(dtype)).min)
    n = len(pads) // 2
    full = (0, 0, *pads[:n], 0, 0, *pads[n:])
    padded = ctx.emit(pad.pad(x, scalar_const(fill, dtype), full))
    return padded, (0,) * len(pads)


def _pool2d(ctx: NodeCtx, x: Expr, kind: str, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int], dil: Sequence[int], ceil_mode: bool, cip: bool) -> Expr:
    if kind == "max":
        return ctx.emit(conv.max_pool2d(x, kernel, strides, pads, dil, ceil_mode))
    return ctx.emit(conv.avg_pool2d(x, kernel, strides, pads, ceil_mode, cip, dil))


def pool_nd(ctx: NodeCtx, x: Expr, kind: str, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int], dil: Sequence[int], ceil_mode: bool, cip: bool) -> Expr:
    """Max or average pooling of a 1-D, 2-D or 3-D (``[N, C, *spatial]``) input with 2-D
    pooling: 1-D pools a height-1 image; 3-D pools each depth slice over (H, W), then over depth
    (both reductions are separable, padding and the average's divisor included)."""
    n = len(kernel)
    if n == 1:
        y = _pool2d(ctx, ctx.emit(manipulate.expand_dims(x, 2)), kind, (1, *kernel), (1, *strides), (0, pads[0], 0, pads[1]), (1, *dil), ceil_mode, cip)
        return ctx.emit(manipulate.squeeze(y, 2))
    if n == 2:
        return _pool2d(ctx, x, kind, kernel, strides, pads, dil, ceil_mode, cip)
    if n != 3:
        raise ctx.unsupported(f"{n}-D pooling (1-D, 2-D and 3-D are supported)")
    b, c, d, h, w = ctx.shape_of(x)
    planes = ctx.emit(manipulate.reshape(x, (b, sym.mul(c, d), h, w)))
    hw = _pool2d(ctx, planes, kind, kernel[1:], strides[1:], (pads[1], pads[2], pads[4], pads[5]), dil[1:], ceil_mode, cip)
    h2, w2 = ctx.shape_of(hw)[2:]
    cols = ctx.emit(manipulate.reshape(hw, (b, c, d, sym.mul(h2, w2))))
    y = _pool2d(ctx, cols, kind, (kernel[0], 1), (strides[0], 1), (pads[0], 0, pads[3], 0), (dil[0], 1), ceil_mode, cip)
    return ctx.emit(manipulate.reshape(y, (b, c, ctx.shape_of(y)[2], h2, w2)))


def _pool(kind: str) -> ConvertFn:
    def conv_pool(ctx: NodeCtx) -> Result:
        shape = ctx.known_shape(0)
        n = len(shape) - 2
        kernel = tuple(int(k) for k in ctx.attr("kernel_shape"))
        strides = tuple(int(s) for s in ctx.attr("strides", (1,) * n))
        dil = tuple(int(d) for d in ctx.attr("dilations", (1,) * n))
        pads = _pads(ctx, shape[2:], kernel, strides, dil)
        ceil_mode = bool(ctx.attr("ceil_mode", 0))
        x = ctx.expr(0)
        indices = len(ctx.node.output) > 1 and bool(ctx.node.output[1])
        if indices and (n not in (1, 2) or (_too_much_padding(pads, kernel, dil) and not ceil_mode)):
            raise ctx.unsupported("the Indices output of 3-D pooling or of padding wider than half the window")
        if kind == "max" and _too_much_padding(pads, kernel, dil) and not ceil_mode:
            x, pads = _pad_explicitly(ctx, x, pads)
        y = pool_nd(ctx, x, kind, kernel, strides, pads, dil, ceil_mode, bool(ctx.attr("count_include_pad", 0)))
        return [y, _max_pool_indices(ctx, x, kernel, strides, pads, dil, ceil_mode)] if indices else y

    return conv_pool


def _max_pool_indices(ctx: NodeCtx, x: Expr, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int], dil: Sequence[int], ceil_mode: bool) -> Expr:
    """MaxPool's Indices: each maximum's flat position in the whole input (row-major, or with
    ``storage_order=1`` its plane flattened column-major), from its position in its plane."""
    shape = ctx.known_shape(0)
    if len(kernel) == 1:  # a height-1 image, as pool_nd pools it
        x = ctx.emit(manipulate.expand_dims(x, 2))
        kernel, strides, pads, dil = (1, *kernel), (1, *strides), (0, pads[0], 0, pads[1]), (1, *dil)
    plane = ctx.emit(conv.max_pool2d_indices(x, kernel, strides, pads, dil, ceil_mode))
    h, w = ctx.shape_of(x)[2:]
    if int(ctx.attr("storage_order", 0)):

        def size(d: Dim) -> Expr:
            return ctx.emit(manipulate.reshape(ctx.emit(shape_op.shape_to_tensor([d])), ()))

        rows, cols = ctx.emit(ew.floor_divide(plane, size(w))), ctx.emit(ew.mod(plane, size(w)))
        plane = ctx.emit(ew.add(rows, ctx.emit(ew.multiply(cols, size(h)))))
    planes = ctx.emit(create.arange(0, sym.mul(shape[0], shape[1]), dtype="int64"))
    first = ctx.emit(ew.multiply(ctx.emit(manipulate.reshape(planes, (shape[0], shape[1], 1, 1))), ctx.emit(shape_op.shape_to_tensor([sym.mul(h, w)]))))
    out = ctx.emit(ew.add(plane, first))
    return ctx.emit(manipulate.squeeze(out, 2)) if len(shape) == 3 else out


converter("MaxPool", 8, 22)(_pool("max"))
converter("AveragePool", 7, 22)(_pool("avg"))


@converter("GlobalAveragePool", 1, 22)
def _global_avg(ctx: NodeCtx) -> Result:
    return ctx.emit(reduce.mean(ctx.expr(0), tuple(range(2, ctx.rank(0))), keepdims=True))


@converter("GlobalMaxPool", 1, 22)
def _global_max(ctx: NodeCtx) -> Result:
    return ctx.emit(reduce.max(ctx.expr(0), tuple(range(2, ctx.rank(0))), keepdims=True))


# -- indexing -----------------------------------------------------------------------------------------


@converter("GatherElements", 11, 13)
def _gather_elements(ctx: NodeCtx) -> Result:
    axis = norm_axis(ctx, int(ctx.attr("axis", 0)), ctx.rank(0))
    return ctx.emit(index.gather(ctx.expr(0), ctx.expr(1), axis))


@converter("Scatter", 9, 11)
@converter("ScatterElements", 11, 18)
def _scatter_elements(ctx: NodeCtx) -> Result:
    axis = norm_axis(ctx, int(ctx.attr("axis", 0)), ctx.rank(0))
    reduction = ctx.attr("reduction", "none")
    return ctx.emit(index.scatter(ctx.expr(0), ctx.expr(1), ctx.expr(2), axis, reduction))


def _flat_index(ctx: NodeCtx, batch_dims: int = 0) -> tuple[Expr, int, tuple[int, ...]]:
    """For ``GatherND``/``ScatterND``: the row-major position of each index tuple (the last dim
    of operand 1, ``k`` long) in the first ``batch_dims + k`` dims of operand 0 (negative
    entries count from the end; the tuple at batch position ``b`` indexes batch entry ``b``),
    the tuple length ``k``, and the static shape of operand 0."""
    shape = static_ints(ctx.known_shape(0))
    ishape = ctx.known_shape(1)
    k = ishape[-1]
    if shape is None or not isinstance(k, int):
        raise ctx.unsupported("needs static data dims and a static index length")
    lead = shape[batch_dims : batch_dims + k]
    strides = [int(np.prod(lead[j + 1 :], dtype=np.int64)) for j in range(k)]
    idx = cast_to(ctx, ctx.expr(1), "int64")
    dims = Constant.of(np.asarray(lead, np.int64))
    idx = ctx.emit(ew.where(ctx.emit(ew.less(idx, scalar_const(0, "int64"))), ctx.emit(ew.add(idx, dims)), idx))
    flat = ctx.emit(reduce.sum(ctx.emit(ew.multiply(idx, Constant.of(np.asarray(strides, np.int64)))), -1))
    if batch_dims:
        batches = int(np.prod(shape[:batch_dims], dtype=np.int64))
        first = np.arange(batches, dtype=np.int64) * int(np.prod(lead, dtype=np.int64))
        first = first.reshape(tuple(shape[:batch_dims]) + (1,) * (len(ishape) - 1 - batch_dims))
        flat = ctx.emit(ew.add(flat, Constant.of(first)))
    return flat, k, shape


@converter("GatherND", 11, 13)
def _gather_nd(ctx: NodeCtx) -> Result:
    """The rows of the data, its first ``batch_dims + k`` dims flattened, at the flat index of
    each index tuple."""
    b = int(ctx.attr("batch_dims", 0))
    flat, k, shape = _flat_index(ctx, b)
    rows = ctx.emit(manipulate.reshape(ctx.expr(0), (int(np.prod(shape[: b + k], dtype=np.int64)), *shape[b + k :])))
    return ctx.emit(manipulate.take(rows, flat, 0))


@converter("ScatterND", 11, 18)
def _scatter_nd(ctx: NodeCtx) -> Result:
    """A scatter along the flattened leading dims: each index tuple names one row."""
    flat, k, shape = _flat_index(ctx)
    rest = shape[k:]
    rows = ctx.emit(manipulate.reshape(ctx.expr(0), (int(np.prod(shape[:k], dtype=np.int64)), *rest)))
    count = sym.product(ctx.known_shape(1)[:-1])
    updates = ctx.emit(manipulate.reshape(ctx.expr(2), (count, *rest)))
    where = ctx.emit(manipulate.reshape(flat, (count, *([1] * len(rest)))))
    where = ctx.emit(manipulate.broadcast_to(where, (count, *rest)))
    out = ctx.emit(index.scatter(rows, where, updates, 0, ctx.attr("reduction", "none")))
    return ctx.emit(manipulate.reshape(out, shape))


@converter("Trilu", 14, 14, static_inputs=(1,))
def _trilu(ctx: NodeCtx) -> Result:
    k = ctx.scalar(1, "k") if ctx.has_input(1) else 0
    fn = index.triu if int(ctx.attr("upper", 1)) else index.tril
    return ctx.emit(fn(ctx.expr(0), k))


@converter("OneHot", 9, 28, static_inputs=(1,))
def _one_hot(ctx: NodeCtx) -> Result:
    depth_c = ctx.const(1)
    depth: Dim = int(depth_c.reshape(-1)[0]) if depth_c is not None else ctx.scalar(1, "depth")
    values = ctx.expr(2)
    return ctx.emit(index.one_hot(ctx.expr(0), values, depth, int(ctx.attr("axis", -1))))


@converter("EyeLike", 9, 22)
def _eye_like(ctx: NodeCtx) -> Result:
    dtype = ctx.dtype_attr("dtype") if ctx.has_attr("dtype") else None
    return ctx.emit(create.eye_like(ctx.expr(0), int(ctx.attr("k", 0)), dtype))





# -- resampling ---------------------------------------------------------------------------------------

_COORD_V11 = ("half_pixel", "half_pixel_symmetric", "asymmetric", "align_corners", "pytorch_half_pixel", "tf_half_pixel_for_nn", "tf_crop_and_resize")


def _resize_roi(ctx: NodeCtx, axes: Sequence[int], rank: int) -> tuple[float, ...] | None:
    """tf_crop_and_resize's box for every dim (the starts, then the ends; an axis not listed
    keeps all of it), or None in the other modes."""
    if ctx.attr("coordinate_transformation_mode", "half_pixel") != "tf_crop_and_resize":
        return None
    given = ctx.const(1) if ctx.has_input(1) else None
    if given is None or given.size != 2 * len(axes):
        raise ctx.unsupported(f"tf_crop_and_resize needs a static roi with a start and an end per axis ({2 * len(axes)} values)")
    box = [0.0] * rank + [1.0] * rank
    for j, a in enumerate(axes):
        box[a], box[rank + a] = float(given.reshape(-1)[j]), float(given.reshape(-1)[len(axes) + j])
    return tuple(box)


@converter("Resize", 11, 19, static_inputs=(1, 2, 3))
def _resize(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    rank = len(shape)
    coord = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if coord not in _COORD_V11:
        raise ctx.unsupported(f"coordinate_transformation_mode={coord!r}")
    axes = [norm_axis(ctx, int(a), rank) for a in ctx.attr("axes", range(rank))]
    roi = _resize_roi(ctx, axes, rank)
    scales_in = ctx.const(2)
    sizes: list[Dim] = list(shape)
    scales: list[float] = [1.0] * rank
    if scales_in is not None and scales_in.size:
        for a, sc in zip(axes, scales_in.reshape(-1).tolist()):
            scales[a] = float(sc)
            d = shape[a]
            if roi is not None:  # the output covers the box
                if not isinstance(d, int):
                    raise ctx.unsupported("tf_crop_and_resize with scales of a symbolic dim")
                sizes[a] = int(np.floor(d * (roi[rank + a] - roi[a]) * sc))
            elif float(sc).is_integer():
                sizes[a] = sym.mul(d, int(sc))
            elif isinstance(d, int):
                sizes[a] = int(np.floor(d * sc))
            else:
                frac = Fraction(float(sc)).limit_denominator(1024)
                if float(frac) != float(sc):
                    raise ctx.unsupported(f"a scale of a symbolic dim that is no fraction with a small denominator ({sc})")
                sizes[a] = sym.floordiv(sym.mul(d, frac.numerator), frac.denominator)
        given_scales: tuple[float, ...] | None = tuple(scales)
    elif ctx.has_input(3):
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            req = ctx.ints(3, "sizes")
            dims = [d for d in (shape[a] for a in axes) if isinstance(d, int)]
            if len(dims) != len(axes):
                raise ctx.unsupported(f"keep_aspect_ratio_policy={policy} with symbolic dims")
            ratios = [r / d for r, d in zip(req, dims)]
            sc = min(ratios) if policy == "not_larger" else max(ratios)
            for a, d in zip(axes, dims):
                scales[a] = sc
                sizes[a] = int(np.floor(d * sc + 0.5))
            given_scales = tuple(scales)
        else:
            for a, r in zip(axes, ctx.dims(3, "sizes")):  # static, tracked or lifted at run time
                sizes[a] = r
            given_scales = None
    else:
        raise ctx.unsupported("one of scales and sizes is required")
    return ctx.emit(
        pad.resize(
            ctx.expr(0),
            sizes,
            given_scales,
            ctx.attr("mode", "nearest"),
            coord,
            ctx.attr("nearest_mode", "round_prefer_floor"),
            float(ctx.attr("cubic_coeff_a", -0.75)),
            bool(ctx.attr("exclude_outside", 0)),
            bool(int(ctx.attr("antialias", 0))),
            roi,
            float(ctx.attr("extrapolation_value", 0.0)),
        )
    )


@converter("Upsample", 7, 9, static_inputs=(1,))
def _upsample(ctx: NodeCtx) -> Result:
    """Upsample: asymmetric coordinates; nearest rounds down."""
    shape = ctx.known_shape(0)
    scales = [float(v) for v in (ctx.attr("scales") if ctx.version < 9 else ctx.static(1, "scales").reshape(-1))]
    sizes: list[Dim] = []
    for d, sc in zip(shape, scales):
        if sc.is_integer():
            sizes.append(sym.mul(d, int(sc)))
        elif isinstance(d, int):
            sizes.append(int(np.floor(d * sc)))
        else:
            raise ctx.unsupported("a fractional scale of a symbolic dim")
    mode = ctx.attr("mode", "nearest")
    return ctx.emit(pad.resize(ctx.expr(0), sizes, scales, "linear" if mode in ("linear", "bilinear") else "nearest", "asymmetric", "floor"))


@converter("LpPool", 2, 22)
def _lp_pool(ctx: NodeCtx) -> Result:
    """``(sum over the window of |x|**p) ** (1/p)``: an average pool of ``|x|**p`` that counts
    the (zero) padding, times the window size."""
    shape = ctx.known_shape(0)
    n = len(shape) - 2
    kernel = tuple(int(k) for k in ctx.attr("kernel_shape"))
    strides = tuple(int(s) for s in ctx.attr("strides", (1,) * n))
    dil = tuple(int(d) for d in ctx.attr("dilations", (1,) * n))
    pads = _pads(ctx, shape[2:], kernel, strides, dil)
    dtype = ctx.dtype(0)
    p = float(ctx.attr("p", 2))
    x = ctx.emit(ew.power(ctx.emit(ew.abs(ctx.expr(0))), scalar_const(p, dtype)))
    mean = pool_nd(ctx, x, "avg", kernel, strides, pads, dil, bool(ctx.attr("ceil_mode", 0)), True)
    total = ctx.emit(ew.multiply(mean, scalar_const(float(np.prod(kernel)), dtype)))
    return ctx.emit(ew.power(total, scalar_const(1.0 / p, dtype)))


@converter("CenterCropPad", 18, 18, static_inputs=(1,))
def _center_crop_pad(ctx: NodeCtx) -> Result:
    """Each listed axis cropped (centered, the extra element at the end) or zero-padded
    (centered, the extra element at the end) to the requested length."""
    shape = ctx.known_shape(0)
    rank = len(shape)
    want = ctx.ints(1, "shape")
    axes = [norm_axis(ctx, int(a), rank) for a in ctx.attr("axes", range(rank))]
    x = ctx.expr(0)
    for a, t in zip(axes, want):
        d = shape[a]
        if not isinstance(d, int):
            raise ctx.unsupported("a symbolic dim to crop or pad")
        if t < d:
            start = (d - t) // 2
            x = ctx.emit(manipulate.strided_slice(x, [a], [start], [start + t]))
        elif t > d:
            before = (t - d) // 2
            pads = [0] * (2 * rank)
            pads[a], pads[rank + a] = before, t - d - before
            x = ctx.emit(pad.pad(x, scalar_const(0, ctx.dtype(0)), pads))
    return x


@converter("ReverseSequence", 10, 28)
def _reverse_sequence(ctx: NodeCtx) -> Result:
    """Along the time axis, the first ``lens[b]`` steps of each batch entry reversed: a gather
    with index ``t < len ? len - 1 - t : t``."""
    shape = ctx.known_shape(0)
    t_axis, b_axis = int(ctx.attr("time_axis", 0)), int(ctx.attr("batch_axis", 1))
    steps = ctx.emit(manipulate.reshape(ctx.emit(create.arange(0, shape[t_axis])), [shape[t_axis] if k == t_axis else 1 for k in range(len(shape))]))
    lens = ctx.emit(manipulate.reshape(cast_to(ctx, ctx.expr(1), "int64"), [shape[b_axis] if k == b_axis else 1 for k in range(len(shape))]))
    flipped = ctx.emit(ew.subtract(ctx.emit(ew.subtract(lens, scalar_const(1, "int64"))), steps))
    idx = ctx.emit(ew.where(ctx.emit(ew.less(steps, lens)), flipped, steps))
    idx = ctx.emit(manipulate.broadcast_to(idx, shape))
    return ctx.emit(index.gather(ctx.expr(0), idx, t_axis))
