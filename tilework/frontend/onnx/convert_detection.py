"""Converters of the detection ops: ``RoiAlign``, ``DeformConv`` and ``NonMaxSuppression``.

``RoiAlign`` and ``DeformConv`` sample the input bilinearly at computed points (``_bilinear``):
the image goes channels-last, the four corners of every point are gathered with one
``index_tensor`` each, and their weights are computed from the coordinates by elementwise ops.
The two ops differ at the border: ``RoiAlign`` drops points more than one pixel outside and
clamps the others into the image; ``DeformConv`` (like ``GridSample`` with zero padding) reads
0 for every corner outside. Coordinates are computed in float32 (float64 for a double input).

- ``RoiAlign``: ``sampling_ratio ** 2`` points per output bin, averaged (``avg``) or, in
  ``max`` mode, the largest of the weighted corner values of all points (the reference's
  definition). With the adaptive ``sampling_ratio`` 0 each ROI takes ``ceil(bin size)`` points
  per bin and axis: the grid is as wide as the widest ROI's (a count read at run time into a
  fresh sym var), and each ROI pools over its own first points.
- ``DeformConv`` (2-D): each kernel tap of each output position is sampled at its offset
  position and scaled by the mask; the sampled columns then meet the weights in one grouped
  matrix product.
- ``NonMaxSuppression``: the ``non_max_suppression`` op gives the kept boxes per image and class
  padded with -1 (``tilework.op.detection``); the ``[n, 3]`` result takes the positions of the
  kept entries with ``nonzero`` (a data-dependent length bound to a fresh sym var).
"""

from __future__ import annotations

import numpy as np

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_math import cast_to, scalar_const
from tilework.frontend.onnx.registry import Result, converter
from tilework.frontend.onnx.values import Value
from tilework.ir import sym
from tilework.ir.graph import Constant, Expr
from tilework.ir.info import TensorInfo
from tilework.ir.sym import Dim
from tilework.op import create, detection, index, linalg, manipulate, reduce, search
from tilework.op import elementwise as ew


def _coord_dtype(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def _dim_scalar(ctx: NodeCtx, d: Dim, dtype: str) -> Expr:
    """A 0-d tensor of ``dtype`` holding the (maybe symbolic) dim ``d``."""
    if isinstance(d, int):
        return scalar_const(d, dtype)
    return cast_to(ctx, ctx.imp.materialize(Value.of_elems((d,), "int64", scalar=True)), dtype)


def _bilinear(ctx: NodeCtx, img: Expr, n: Expr, y: Expr, x: Expr, rest: list[Expr], clamp: bool) -> list[Expr]:
    """The four weighted corner values of bilinear samples of ``img`` (``[N, H, W, *G, C]``,
    channels last) at rows ``y`` and columns ``x`` (float tensors) of images ``n`` and groups
    ``rest`` (int64); all of them broadcast to the points' shape ``P`` and each term has shape
    ``P + (C,)``. ``clamp``: RoiAlign's border (points over a pixel outside are 0, the others
    clamped into the image); else each corner outside the image reads 0."""
    shape = ctx.shape_of(img)
    height, width = shape[1], shape[2]
    dtype = str(getattr(img.info, "dtype"))
    cd = str(getattr(y.info, "dtype"))
    zero, one = scalar_const(0, cd), scalar_const(1, cd)

    def axis(v: Expr, size: Dim) -> tuple[list[tuple[Expr, Expr]], Expr | None]:
        """The two (index, weight) corners along one axis, and the points that count."""
        w: Expr
        last = _dim_scalar(ctx, sym.sub(size, 1), cd)
        inside: Expr | None = None
        if clamp:
            lo, hi = ctx.emit(ew.greater_equal(v, scalar_const(-1, cd))), ctx.emit(ew.less_equal(v, _dim_scalar(ctx, size, cd)))
            inside = ctx.emit(ew.logical_and(lo, hi))
            v = ctx.emit(ew.minimum(ctx.emit(ew.maximum(v, zero)), last))
        v0 = ctx.emit(ew.floor(v))
        v1 = ctx.emit(ew.add(v0, one))
        if clamp:
            v1 = ctx.emit(ew.minimum(v1, last))
        frac = ctx.emit(ew.subtract(v, v0))
        corners: list[tuple[Expr, Expr]] = []
        for c, w in ((v0, ctx.emit(ew.subtract(one, frac))), (v1, frac)):
            if not clamp:  # a corner outside the image reads 0
                ok = ctx.emit(ew.logical_and(ctx.emit(ew.greater_equal(c, zero)), ctx.emit(ew.less_equal(c, last))))
                w = ctx.emit(ew.where(ok, w, zero))
                c = ctx.emit(ew.minimum(ctx.emit(ew.maximum(c, zero)), last))
            corners.append((cast_to(ctx, c, "int64"), w))
        return corners, inside

    rows, y_in = axis(y, height)
    cols, x_in = axis(x, width)
    terms: list[Expr] = []
    for yi, wy in rows:
        for xi, wx in cols:
            w = ctx.emit(ew.multiply(wy, wx))
            if y_in is not None and x_in is not None:
                w = ctx.emit(ew.where(ctx.emit(ew.logical_and(y_in, x_in)), w, zero))
            value = ctx.emit(index.index_tensor(img, [n, yi, xi, *rest], 0))
            terms.append(ctx.emit(ew.multiply(value, ctx.emit(manipulate.expand_dims(cast_to(ctx, w, dtype), -1)))))
    return terms


def _arange(ctx: NodeCtx, n: Dim, shape: tuple[Dim, ...], dtype: str = "int64") -> Expr:
    return cast_to(ctx, ctx.emit(manipulate.reshape(ctx.emit(create.arange(0, n)), shape)), dtype)


@converter("RoiAlign", 10, 22)
def _roi_align(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    if len(shape) != 4:
        raise ctx.unsupported(f"X must be 4-D (N, C, H, W), got shape {shape}")
    oh, ow = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    ratio = int(ctx.attr("sampling_ratio", 0))
    if oh <= 0 or ow <= 0:
        raise ctx.unsupported(f"output size {oh}x{ow}")
    mode = ctx.attr("mode", "avg")
    if mode not in ("avg", "max"):
        raise ctx.unsupported(f"mode={mode!r}")
    ctm = ctx.attr("coordinate_transformation_mode", "half_pixel" if ctx.version >= 16 else "output_half_pixel")
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise ctx.unsupported(f"coordinate_transformation_mode={ctm!r}")
    half = ctm == "half_pixel"
    cd = _coord_dtype(ctx.dtype(0))
    rois = cast_to(ctx, ctx.expr(1), cd)
    r = ctx.known_shape(1)[0]
    scale = scalar_const(float(ctx.attr("spatial_scale", 1.0)), cd)
    shift = scalar_const(0.5 if half else 0.0, cd)

    def coord(k: int) -> Expr:  # column k of the ROIs in input pixels
        col = ctx.emit(manipulate.strided_slice(rois, [1], [k], [k + 1]))
        return ctx.emit(ew.subtract(ctx.emit(ew.multiply(col, scale)), shift))

    def points(start: Expr, end: Expr, bins: int) -> tuple[Expr, Expr | None]:
        """``start + bin * (p + (s + 0.5) / count)`` for bin ``p`` and sample ``s`` as
        ``(r, bins, samples)``, and with an adaptive ratio each ROI's sample count ``(r, 1)``."""
        size = ctx.emit(ew.subtract(end, start))
        if not half:  # malformed ROIs count as 1x1
            size = ctx.emit(ew.maximum(size, scalar_const(1, cd)))
        step = ctx.emit(manipulate.expand_dims(ctx.emit(ew.divide(size, scalar_const(bins, cd))), 2))
        if ratio > 0:
            frac: Expr = Constant.of(np.asarray([[p + (s + 0.5) / ratio for s in range(ratio)] for p in range(bins)], dtype=cd))
            return ctx.emit(ew.add(ctx.emit(manipulate.expand_dims(start, 2)), ctx.emit(ew.multiply(step, frac)))), None
        count = ctx.emit(ew.ceil(step))  # (r, 1, 1): as many samples as the bin spans pixels
        counts = ctx.emit(manipulate.concat([ctx.emit(manipulate.reshape(count, (-1,))), Constant.of(np.ones(1, cd))], 0))
        widest = ctx.emit(reduce.max(counts, 0, keepdims=True))  # at least 1, also without ROIs
        (samples,) = ctx.imp.lift_dims(Value.of_expr(cast_to(ctx, widest, "int64")), "the widest ROI's sample count", ctx)
        offsets = ctx.emit(ew.divide(ctx.emit(ew.add(_arange(ctx, samples, (1, 1, samples), cd), scalar_const(0.5, cd))), count))
        frac = ctx.emit(ew.add(Constant.of(np.arange(bins, dtype=cd).reshape(1, bins, 1)), offsets))
        at = ctx.emit(ew.add(ctx.emit(manipulate.expand_dims(start, 2)), ctx.emit(ew.multiply(step, frac))))
        return at, ctx.emit(manipulate.reshape(count, (r, 1)))

    ys, y_count = points(coord(1), coord(3), oh)
    xs, x_count = points(coord(0), coord(2), ow)
    sh, sw = ctx.shape_of(ys)[2], ctx.shape_of(xs)[2]
    ys, xs = ctx.emit(manipulate.reshape(ys, (r, oh, sh, 1, 1))), ctx.emit(manipulate.reshape(xs, (r, 1, 1, ow, sw)))
    n = ctx.emit(manipulate.reshape(cast_to(ctx, ctx.expr(2), "int64"), (r, 1, 1, 1, 1)))
    img = ctx.emit(manipulate.permute_dims(ctx.expr(0), (0, 2, 3, 1)))
    terms = _bilinear(ctx, img, n, ys, xs, [], clamp=True)
    acc: Expr = terms[0]
    for t in terms[1:]:
        acc = ctx.emit(ew.add(acc, t) if mode == "avg" else ew.maximum(acc, t))
    if y_count is None or x_count is None:
        pooled: Expr = ctx.emit(reduce.mean(acc, (2, 4)) if mode == "avg" else reduce.max(acc, (2, 4)))
    else:
        pooled = _adaptive_pool(ctx, acc, y_count, x_count, mode)
    return ctx.emit(manipulate.permute_dims(pooled, (0, 3, 1, 2)))


def _adaptive_pool(ctx: NodeCtx, acc: Expr, y_count: Expr, x_count: Expr, mode: str) -> Expr:
    """Pool ``acc`` ``(r, oh, sh, ow, sw, c)`` over each ROI's own first ``y_count`` by
    ``x_count`` samples (``(r, 1)`` each): their mean (over at least one), or their maximum
    (0 for a ROI with none)."""
    r, _, sh, _, sw, _ = ctx.shape_of(acc)
    cd = str(getattr(y_count.info, "dtype"))
    dtype = str(getattr(acc.info, "dtype"))

    def within(count: Expr, samples: Dim, shape: tuple[Dim, ...]) -> Expr:
        at = _arange(ctx, samples, shape, cd)
        return ctx.emit(ew.less(at, ctx.emit(manipulate.reshape(count, (r, 1, 1, 1, 1, 1)))))

    inside = ctx.emit(ew.logical_and(within(y_count, sh, (1, 1, sh, 1, 1, 1)), within(x_count, sw, (1, 1, 1, 1, sw, 1))))
    total = ctx.emit(manipulate.reshape(ctx.emit(ew.multiply(y_count, x_count)), (r, 1, 1, 1)))
    if mode == "avg":
        summed = ctx.emit(reduce.sum(ctx.emit(ew.where(inside, acc, scalar_const(0, dtype))), (2, 4)))
        return ctx.emit(ew.divide(summed, cast_to(ctx, ctx.emit(ew.maximum(total, scalar_const(1, cd))), dtype)))
    best = ctx.emit(reduce.max(ctx.emit(ew.where(inside, acc, scalar_const(-np.inf, dtype))), (2, 4)))
    some = ctx.emit(ew.logical_and(ctx.emit(ew.greater(y_count, scalar_const(0, cd))), ctx.emit(ew.greater(x_count, scalar_const(0, cd)))))
    return ctx.emit(ew.where(ctx.emit(manipulate.reshape(some, (r, 1, 1, 1))), best, scalar_const(0, dtype)))


def _static(ctx: NodeCtx, dims: tuple[Dim, ...], what: str) -> tuple[int, ...]:
    out = tuple(d for d in dims if isinstance(d, int))
    if len(out) != len(dims):
        raise ctx.unsupported(f"{what} must be static, got {dims}")
    return out


@converter("DeformConv", 19, 22)
def _deform_conv(ctx: NodeCtx) -> Result:
    shape, wshape, oshape = ctx.known_shape(0), ctx.known_shape(1), ctx.known_shape(2)
    if len(shape) != 4:
        raise ctx.unsupported(f"only 2-D deformable convolution is supported, got X of shape {shape}")
    n, c, _, _ = shape
    oc, cin, kh, kw = _static(ctx, wshape, "the weight shape")
    if tuple(int(k) for k in ctx.attr("kernel_shape", (kh, kw))) != (kh, kw):
        raise ctx.unsupported(f"kernel_shape {ctx.attr('kernel_shape')} differs from the weights {wshape}")
    (channels,) = _static(ctx, (c,), "the channel count")
    sh, sw = (int(s) for s in ctx.attr("strides", (1, 1)))
    dh, dw = (int(d) for d in ctx.attr("dilations", (1, 1)))
    ph, pw = (int(p) for p in ctx.attr("pads", (0, 0, 0, 0))[:2])
    group, og = int(ctx.attr("group", 1)), int(ctx.attr("offset_group", 1))
    taps = kh * kw
    if group <= 0 or og <= 0 or channels % og or channels != cin * group or oc % group:
        raise ctx.unsupported(f"{channels} input channels do not fit group={group}, offset_group={og} and weights {wshape}")
    oh, ow = oshape[2], oshape[3]
    if not sym.prove_eq(oshape[1], og * taps * 2):
        raise ctx.unsupported(f"offset {oshape} must have offset_group * kernel taps * 2 = {og * taps * 2} channels")
    dtype = ctx.dtype(0)
    cd = _coord_dtype(dtype)
    off = ctx.emit(manipulate.reshape(cast_to(ctx, ctx.expr(2), cd), (n, og, taps, 2, oh, ow)))

    def position(k: int, tap: np.ndarray, out: Dim, stride: int, axis: int) -> Expr:
        """Tap and output position plus the offset: ``(n, og, taps, oh, ow)``."""
        delta = ctx.emit(manipulate.reshape(ctx.emit(manipulate.strided_slice(off, [3], [k], [k + 1])), (n, og, taps, oh, ow)))
        base = ctx.emit(ew.multiply(_arange(ctx, out, (1, 1, 1, out, 1) if axis == 0 else (1, 1, 1, 1, out), cd), scalar_const(stride, cd)))
        taps_at = Constant.of(tap.astype(cd).reshape(1, 1, taps, 1, 1))
        return ctx.emit(ew.add(delta, ctx.emit(ew.add(base, taps_at))))

    ky, kx = np.divmod(np.arange(taps), kw)
    y = position(0, ky * dh - ph, oh, sh, 0)
    x = position(1, kx * dw - pw, ow, sw, 1)
    img = ctx.emit(manipulate.permute_dims(ctx.expr(0), (0, 2, 3, 1)))
    img = ctx.emit(manipulate.reshape(img, (n, shape[2], shape[3], og, channels // og)))
    terms = _bilinear(ctx, img, _arange(ctx, n, (n, 1, 1, 1, 1)), y, x, [_arange(ctx, og, (1, og, 1, 1, 1))], clamp=False)
    sampled = terms[0]
    for t in terms[1:]:
        sampled = ctx.emit(ew.add(sampled, t))  # (n, og, taps, oh, ow, c / og)
    if ctx.has_input(4):
        mask = ctx.emit(manipulate.reshape(cast_to(ctx, ctx.expr(4), dtype), (n, og, taps, oh, ow, 1)))
        sampled = ctx.emit(ew.multiply(sampled, mask))
    cols = ctx.emit(manipulate.permute_dims(sampled, (0, 1, 5, 2, 3, 4)))
    cols = ctx.emit(manipulate.reshape(cols, (n, group, cin * taps, sym.mul(oh, ow))))
    w = ctx.emit(manipulate.reshape(ctx.expr(1), (group, oc // group, cin * taps)))
    out = ctx.emit(manipulate.reshape(ctx.emit(linalg.matmul(w, cols)), (n, oc, oh, ow)))
    if ctx.has_input(3):
        out = ctx.emit(ew.add(out, ctx.emit(manipulate.reshape(ctx.expr(3), (1, oc, 1, 1)))))
    return out


@converter("NonMaxSuppression", 10, 11)
def _non_max_suppression(ctx: NodeCtx) -> Result:
    bshape, sshape = ctx.known_shape(0), ctx.known_shape(1)
    if len(bshape) != 3 or len(sshape) != 3:
        raise ctx.unsupported(f"boxes and scores must be 3-D, got shapes {bshape} and {sshape}")
    dtype = ctx.dtype(0)

    def one(i: int, dt: str, default: float) -> Expr:
        if not ctx.has_input(i):
            return Constant.of(np.asarray([default], dtype=dt))
        return ctx.emit(manipulate.reshape(cast_to(ctx, ctx.expr(i), dt), (1,)))

    center = int(ctx.attr("center_point_box", 0))
    if center not in (0, 1):
        raise ctx.unsupported(f"center_point_box={center}")
    call = detection.non_max_suppression(
        ctx.expr(0), cast_to(ctx, ctx.expr(1), dtype), one(2, "int64", 0), one(3, dtype, 0.0), one(4, dtype, 0.0),
        center_point_box=bool(center), use_score_threshold=ctx.has_input(4),
    )  # fmt: skip
    flat = ctx.emit(manipulate.reshape(ctx.emit(call), (-1,)))
    found = ctx.emit(search.nonzero(ctx.emit(ew.greater_equal(flat, scalar_const(0, "int64")))))
    found = ctx.imp.bb.match_cast(found, TensorInfo((1, ctx.fresh_dim("nms_selected")), "int64"))
    pos = ctx.emit(manipulate.reshape(found, (-1,)))
    classes, boxes = sshape[1], sshape[2]
    per_image = _dim_scalar(ctx, sym.mul(classes, boxes), "int64")
    batch = ctx.emit(ew.floor_divide(pos, per_image))
    cls = ctx.emit(ew.mod(ctx.emit(ew.floor_divide(pos, _dim_scalar(ctx, boxes, "int64"))), _dim_scalar(ctx, classes, "int64")))
    box = ctx.emit(manipulate.take(flat, pos, 0))
    return ctx.emit(manipulate.concat([ctx.emit(manipulate.expand_dims(v, 1)) for v in (batch, cls, box)], 1))
