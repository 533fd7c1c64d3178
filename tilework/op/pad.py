"""Padding, repetition and resampling: ``pad`` (constant, reflect, edge and wrap modes),
``tile``, ``resize`` (nearest, linear and cubic) and ``grid_sample`` (see its constructor).

- ``pad(x, value, pads, mode)``: ``pads`` lists the amount added before every dim and then the
  amount added after every dim (ONNX's layout); a negative amount crops. Dims stay symbolic:
  ``d + before + after``. ``value`` is a 0-d tensor (the fill of ``constant`` mode) of ``x``'s
  dtype. ``reflect`` mirrors without repeating the edge (``[a b c] -> b [a b c] b``) and needs
  each pad smaller than the dim; ``edge`` repeats the edge; ``wrap`` continues periodically.
- ``tile(x, repeats)``: ``x`` repeated ``repeats[i]`` times along dim ``i`` (``d * r``).
- ``resize(x, sizes, scales, mode, coord, ...)``: every dim resampled to ``sizes`` with ONNX's
  coordinate transformations (``half_pixel``, ``half_pixel_symmetric``, ``asymmetric``,
  ``align_corners``, ``pytorch_half_pixel``, ``tf_half_pixel_for_nn``). ``nearest`` rounds the
  source coordinate (``round_prefer_floor``, ``round_prefer_ceil``, ``floor``, ``ceil``);
  ``linear`` interpolates the two neighbours and ``cubic`` four (Keys' kernel with parameter
  ``cubic_a``; ``exclude_outside`` drops taps outside the input and renormalizes), reading the
  edge element for taps beyond it. ``scales`` (one per dim) are what the source coordinate
  divides by; None uses ``size / d``. ``tf_crop_and_resize`` samples the box ``roi`` (the
  start of every dim, then the end of every dim, as fractions of ``d - 1``) and gives
  ``extrapolation`` where the source coordinate of any dim falls outside ``[0, d - 1]``.
  ``antialias`` widens the linear or cubic kernel of a dim that shrinks by the scale ``s < 1``
  to ``1 / s`` times its taps (weights ``kernel((tap - source) * s)``, normalized; the scale
  must then be known when compiling).
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Callable, Sequence

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, shape_str
from tilework.ir.loop import Operand, PExpr, Scalar
from tilework.ir.sym import Dim, SymExpr
from tilework.op.base import InferCtx, Op, OpPattern, make_call, register, require_equal, require_nonneg, tensor_arg, unify_dtype
from tilework.op.kernel import arg, out_tensor

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

PAD_MODES = ("constant", "reflect", "edge", "wrap")
COORD_MODES = ("half_pixel", "half_pixel_symmetric", "asymmetric", "align_corners", "pytorch_half_pixel", "tf_half_pixel_for_nn", "tf_crop_and_resize")
RESIZE_MODES = ("nearest", "linear", "cubic")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _dims_attr(v: object, name: str, ctx: InferCtx) -> tuple[Dim, ...]:
    if not isinstance(v, tuple) or any(isinstance(d, bool) or not isinstance(d, (int, SymExpr)) for d in v):
        raise ctx.error(f"attribute {name} must be a tuple of ints or symbolic dims, got {v!r}")
    return v


# -- pad ---------------------------------------------------------------------------------------


def _infer_pad(call: Call, ctx: InferCtx) -> StructInfo:
    x, value = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    dtype = unify_dtype([x.dtype, value.dtype], ctx)
    if value.ndim not in (-1, 0):
        raise ctx.shape_error(f"the pad value must be a 0-d tensor, got shape {shape_str(value.shape)}")
    mode = call.attrs["mode"]
    if mode not in PAD_MODES:
        raise ctx.error(f"mode must be one of {', '.join(PAD_MODES)}, got {mode!r}")
    pads = _dims_attr(call.attrs["pads"], "pads", ctx)
    if x.ndim == -1:
        return TensorInfo(None, dtype, -1)
    if len(pads) != 2 * x.ndim:
        raise ctx.error(f"pads needs {2 * x.ndim} entries (before and after each dim), got {len(pads)}")
    if x.shape is None:
        return TensorInfo(None, dtype, x.ndim)
    n = x.ndim
    out = tuple(sym.add(sym.add(d, pads[k]), pads[n + k]) for k, d in enumerate(x.shape))
    require_nonneg(out, ctx, "padded shape")
    if mode == "reflect":
        for k, d in enumerate(x.shape):
            for p in (pads[k], pads[n + k]):
                if not (isinstance(p, int) and p <= 0):
                    if isinstance(p, int) and isinstance(d, int) and p >= d:
                        raise ctx.shape_error(f"reflect padding {p} must be smaller than dim {k} of {shape_str(x.shape)}")
    return TensorInfo(out, dtype)


def _source(j: Scalar, d: Dim, mode: str) -> Scalar:
    """The source index for position ``j`` (which may lie outside ``[0, d)``) of a dim of
    length ``d`` under ``mode`` (not constant)."""
    if mode == "edge":
        return te.minimum(te.maximum(j, 0), sym.sub(d, 1))
    if mode == "wrap":
        return j % d
    r = te.if_then_else(te.lt(j, 0), -j, j)
    return te.if_then_else(te.ge(r, d), sym.mul(2, sym.sub(d, 1)) - r, r)


def _legalize_pad(call: Call, ctx: "LegalizeCtx") -> Expr:
    x, value = arg(call, 0, "x"), arg(call, 1, "value")
    shape, dtype = out_tensor(call)
    pads = call.attrs["pads"]
    mode = call.attrs["mode"]
    n = x.ndim

    def f(*i: Scalar) -> Scalar:
        js = [i[k] - pads[k] for k in range(n)]
        if mode != "constant":
            return x[tuple(_source(j, x.shape[k], mode) for k, j in enumerate(js))]
        inside = te.all(*(te.logical_and(te.ge(j, 0), te.lt(j, x.shape[k])) for k, j in enumerate(js)))
        return te.if_then_else(inside, x[tuple(js)], value[()])

    out = te.compute(shape, f, "pad", dtype)
    return ctx.call_te("pad", call.args, [x, value], [out], call.info)


register(Op("pad", _infer_pad, OpPattern.INJECTIVE, attrs={"pads": (), "mode": "constant"}, num_args=2, legalize=_legalize_pad))


def pad(x: Expr, value: Expr, pads: Sequence[Dim], mode: str = "constant") -> Call:
    """``x`` padded by ``pads`` (all befores, then all afters; negative crops); ``value`` is a
    0-d tensor used by ``constant`` mode."""
    return make_call("pad", [x, value], pads=tuple(pads), mode=mode)


# -- tile --------------------------------------------------------------------------------------


def _infer_tile(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    reps = _dims_attr(call.attrs["repeats"], "repeats", ctx)
    if x.ndim == -1:
        return TensorInfo(None, x.dtype, len(reps))
    if len(reps) != x.ndim:
        raise ctx.error(f"repeats needs one entry per dim ({x.ndim}), got {len(reps)}")
    require_nonneg(reps, ctx, "repeats")
    if x.shape is None:
        return TensorInfo(None, x.dtype, x.ndim)
    return TensorInfo(tuple(sym.mul(d, r) for d, r in zip(x.shape, reps)), x.dtype)


def _legalize_tile(call: Call, ctx: "LegalizeCtx") -> Expr:
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    out = te.compute(shape, lambda *i: x[tuple(v % d for v, d in zip(i, x.shape))], "tile", dtype)
    return ctx.call_te("tile", call.args, [x], [out], call.info)


register(Op("tile", _infer_tile, OpPattern.INJECTIVE, attrs={"repeats": ()}, num_args=1, legalize=_legalize_tile))


def tile(x: Expr, repeats: Sequence[Dim]) -> Call:
    """``x`` repeated ``repeats[i]`` times along each dim ``i``."""
    return make_call("tile", [x], repeats=tuple(repeats))


# -- resize -------------------------------------------------------------------------------------


def _infer_resize(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    sizes = _dims_attr(call.attrs["sizes"], "sizes", ctx)
    scales, roi = call.attrs["scales"], call.attrs["roi"]
    for attr, allowed in (("coord", COORD_MODES), ("rounding", NEAREST_MODES), ("mode", RESIZE_MODES)):
        if call.attrs[attr] not in allowed:
            raise ctx.error(f"{attr} must be one of {', '.join(allowed)}, got {call.attrs[attr]!r}")
    if scales is not None and (not isinstance(scales, tuple) or len(scales) != len(sizes)):
        raise ctx.error(f"scales must be None or one float per dim, got {scales!r}")
    if (call.attrs["coord"] == "tf_crop_and_resize") != (roi is not None):
        raise ctx.error(f"roi must be given exactly when coord is tf_crop_and_resize, got {roi!r}")
    if roi is not None and (not isinstance(roi, tuple) or len(roi) != 2 * len(sizes)):
        raise ctx.error(f"roi needs a start and an end per dim ({2 * len(sizes)} floats), got {roi!r}")
    if x.ndim not in (-1, len(sizes)):
        raise ctx.error(f"sizes needs one entry per dim ({x.ndim}), got {len(sizes)}")
    if call.attrs["mode"] != "nearest" and x.dtype is not None and not x.dtype.startswith(("float", "bfloat")):
        raise ctx.error(f"{call.attrs['mode']} interpolation needs a floating-point tensor, got {x.dtype}")
    if call.attrs["antialias"] and call.attrs["mode"] != "nearest" and scales is None and x.shape is not None:
        for k, (d, out) in enumerate(zip(x.shape, sizes)):
            if d is not out and _growth(d, out, None) is None:
                raise ctx.error(f"antialias needs the scale of dim {k} ({sym.to_str(d)} -> {sym.to_str(out)}) when compiling: give scales or static sizes")
    require_nonneg(sizes, ctx, "sizes")
    return TensorInfo(sizes, x.dtype)


def _nearest(s: PExpr, mode: str) -> PExpr:
    if mode == "floor":
        return te.floor(s)
    if mode == "ceil":
        return te.ceil(s)
    frac = s - te.floor(s)
    if mode == "round_prefer_floor":
        return te.if_then_else(te.le(frac, 0.5), te.floor(s), te.ceil(s))
    return te.if_then_else(te.lt(frac, 0.5), te.floor(s), te.ceil(s))


def _src_coord(i: Scalar, d: Dim, out: Dim, scale: float | None, coord: str, box: tuple[float, float]) -> PExpr:
    """The source coordinate (float64) of output index ``i`` (``box``: tf_crop_and_resize's
    start and end along this dim)."""
    fi = te.cast(i, "float64")
    fd, fo = te.cast(d, "float64"), te.cast(out, "float64")
    s = fo / fd if scale is None else te.constant(scale, "float64")
    span = fo if scale is None else fd * scale  # with a given scale, the unrounded output length
    if coord == "asymmetric":
        return fi / s
    if coord == "align_corners":
        return te.if_then_else(te.le(fo, 1.0), 0.0, fi * (fd - 1.0) / (span - 1.0))
    if coord == "tf_crop_and_resize":
        start, end = box
        middle = (start + end) * 0.5 * (fd - 1.0)
        return te.if_then_else(te.le(fo, 1.0), middle, start * (fd - 1.0) + fi * (end - start) * (fd - 1.0) / (span - 1.0))
    if coord == "tf_half_pixel_for_nn":
        return (fi + 0.5) / s
    half = (fi + 0.5) / s - 0.5
    if coord == "pytorch_half_pixel":
        return te.if_then_else(te.gt(fo, 1.0), half, 0.0)
    if coord == "half_pixel_symmetric":
        adjust = fo / (s * fd)
        return fd * 0.5 * (1.0 - adjust) + half
    return half


def _clamp(v: Scalar, d: Dim) -> Scalar:
    return te.minimum(te.maximum(v, 0), sym.sub(d, 1))


def _cubic_weights(r: PExpr, a: float) -> list[PExpr]:
    """Keys' cubic convolution weights of the taps at offsets -1, 0, 1, 2 from ``floor(x)``
    for the fraction ``r``."""
    def far(t: PExpr) -> PExpr:  # 1 < |t| < 2
        return ((t * a - 5.0 * a) * t + 8.0 * a) * t - 4.0 * a

    def near(t: PExpr) -> PExpr:  # |t| <= 1
        return ((t * (a + 2.0)) - (a + 3.0)) * t * t + 1.0

    return [far(r + 1.0), near(r), near(1.0 - r), far(2.0 - r)]


def _kernel(t: PExpr, mode: str, a: float) -> PExpr:
    """The linear or (Keys) cubic interpolation kernel at distance ``t``."""
    u = te.abs(t)
    if mode == "linear":
        return te.maximum(1.0 - u, 0.0)
    near = ((u * (a + 2.0)) - (a + 3.0)) * u * u + 1.0
    far = ((u * a - 5.0 * a) * u + 8.0 * a) * u - 4.0 * a
    return te.if_then_else(te.le(u, 1.0), near, te.if_then_else(te.lt(u, 2.0), far, 0.0))


def _taps(call: Call, x: PExpr, d: Dim) -> list[tuple[Scalar, float | PExpr]]:
    """(source index, weight) pairs for source coordinate ``x`` along one resized dim."""
    mode = call.attrs["mode"]
    if mode == "nearest":
        return [(_clamp(te.cast(_nearest(x, call.attrs["rounding"]), "int64"), d), 1.0)]
    base = te.floor(x)
    r = x - base
    b = te.cast(base, "int64")
    if mode == "linear":
        return [(_clamp(b, d), 1.0 - r), (_clamp(b + 1, d), r)]
    weights = _cubic_weights(r, float(call.attrs["cubic_a"]))
    taps = [(b + off, w) for off, w in zip((-1, 0, 1, 2), weights)]
    if not call.attrs["exclude_outside"]:
        return [(_clamp(t, d), w) for t, w in taps]
    inside = [te.logical_and(te.ge(t, 0), te.lt(t, d)) for t, _ in taps]
    kept = [te.if_then_else(c, w, 0.0) for c, (_, w) in zip(inside, taps)]
    total = kept[0] + kept[1] + kept[2] + kept[3]
    return [(_clamp(t, d), k / total) for (t, _), k in zip(taps, kept)]


def _growth(d: Dim, out: Dim, scale: float | None) -> float | None:
    """How much a dim grows: its given scale, or ``out / d`` when both are static."""
    if scale is not None:
        return scale
    return out / d if isinstance(d, int) and isinstance(out, int) and d > 0 else None


def _legalize_resize(call: Call, ctx: "LegalizeCtx") -> Expr:
    """Every output element is a weighted sum over the taps of each resized dim (one for
    nearest, two for linear, four for cubic, more for an antialiased shrink), accumulated in
    float64."""
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    scales, roi, coord = call.attrs["scales"], call.attrs["roi"], call.attrs["coord"]
    nearest = call.attrs["mode"] == "nearest"
    rank = len(shape)
    boxes = [(0.0, 1.0) if roi is None else (float(roi[k]), float(roi[rank + k])) for k in range(rank)]
    resized = [k for k, d in enumerate(x.shape) if not (d is shape[k] and (scales is None or scales[k] == 1.0) and boxes[k] == (0.0, 1.0))]

    if call.attrs["antialias"] and not nearest:
        return _resize_separably(call, ctx, x, resized, boxes)

    def f(*i: Scalar) -> Operand:
        coords = {k: _src_coord(i[k], x.shape[k], shape[k], None if scales is None else float(scales[k]), coord, boxes[k]) for k in resized}
        per_dim = [_taps(call, coords[k], x.shape[k]) for k in resized]
        total: Operand = 0.0
        for combo in itertools.product(*per_dim):
            idx: list[Scalar] = list(i)
            weight: float | PExpr = 1.0
            for k, (src, w) in zip(resized, combo):
                idx[k] = src
                weight = weight * w
            value = x[tuple(idx)]
            if nearest:
                total = value
                break
            total = total + weight * te.cast(value, "float64")
        if not resized:
            total = x[i]
        if coord != "tf_crop_and_resize" or not resized:
            return total
        outside = te.any(*(te.logical_or(te.lt(c, 0.0), te.gt(c, te.cast(sym.sub(x.shape[k], 1), "float64"))) for k, c in coords.items()))
        return te.if_then_else(outside, te.cast(float(call.attrs["extrapolation"]), dtype if nearest else "float64"), total)

    out = te.compute(shape, f, "resize", dtype)
    return ctx.call_te("resize", call.args, [x], [out], call.info)


def _resize_separably(call: Call, ctx: "LegalizeCtx", x: te.Tensor, resized: Sequence[int], boxes: Sequence[tuple[float, float]]) -> Expr:
    """One stage per resized dim, each interpolating along that dim only (in float64), with
    the taps' first index and weights per output position in tables of their own: an
    antialiased kernel has many taps, each weight normalized by all of them."""
    shape, dtype = out_tensor(call)
    scales = call.attrs["scales"]
    mode, a = call.attrs["mode"], float(call.attrs["cubic_a"])
    extrapolate = call.attrs["coord"] == "tf_crop_and_resize"
    stage = x
    for n, k in enumerate(resized):
        d, out = x.shape[k], shape[k]
        scale = None if scales is None else float(scales[k])
        growth = min(_growth(d, out, scale) or 1.0, 1.0)
        reach = 1 if mode == "linear" else 2
        first = math.floor(-reach / growth) + 1
        ntaps = 2 - 2 * first

        def coord(i: Scalar, d: Dim = d, out: Dim = out, scale: float | None = scale, k: int = k) -> PExpr:
            return _src_coord(i, d, out, scale, call.attrs["coord"], boxes[k])

        def frac(i: Scalar, coord: Callable[[Scalar], PExpr] = coord) -> PExpr:  # in (0, 1]
            c = coord(i)
            return te.if_then_else(te.eq(c, te.floor(c)), 1.0, c - te.floor(c))

        base = te.compute((out,), lambda i, coord=coord, frac=frac, first=first: te.cast(coord(i) - frac(i), "int64") + first, f"resize_base{k}", "int64")

        def raw(t: Scalar, i: Scalar, d: Dim = d, frac: Callable[[Scalar], PExpr] = frac, base: te.Tensor = base, growth: float = growth, first: int = first) -> PExpr:
            w = _kernel((te.cast(t + first, "float64") - frac(i)) * growth, mode, a)
            if not call.attrs["exclude_outside"]:
                return w
            pos = base[i] + t
            return te.if_then_else(te.logical_and(te.ge(pos, 0), te.lt(pos, d)), w, 0.0)

        weights = te.compute((ntaps, out), raw, f"resize_weights{k}", "float64")
        totals = te.compute((out,), lambda i, weights=weights, ntaps=ntaps: te.sum(weights[(r := te.reduce_axis(ntaps, "r")), i], axis=r), f"resize_total{k}", "float64")
        src: te.Tensor = stage
        dims = tuple(shape[j] if j == k or j in resized[:n] else x.shape[j] for j in range(len(shape)))

        def f(*i: Scalar, k: int = k, d: Dim = d, src: te.Tensor = src, base: te.Tensor = base, weights: te.Tensor = weights, totals: te.Tensor = totals, ntaps: int = ntaps, coord: Callable[[Scalar], PExpr] = coord) -> Operand:
            total: Operand = 0.0
            for t in range(ntaps):
                total = total + weights[t, i[k]] * te.cast(src[(*i[:k], _clamp(base[i[k]] + t, d), *i[k + 1 :])], "float64")
            total = total / totals[i[k]]
            if not extrapolate:
                return total
            c = coord(i[k])
            return te.if_then_else(te.logical_or(te.lt(c, 0.0), te.gt(c, te.cast(sym.sub(d, 1), "float64"))), float(call.attrs["extrapolation"]), total)

        last = n == len(resized) - 1
        stage = te.compute(dims, f, "resize" if last else f"resize_dim{k}", dtype if last else "float64")
    return ctx.call_te("resize", call.args, [x], [stage], call.info)


register(Op("resize", _infer_resize, OpPattern.INJECTIVE, attrs={"sizes": (), "scales": None, "mode": "nearest", "coord": "half_pixel", "rounding": "round_prefer_floor", "cubic_a": -0.75, "exclude_outside": False, "antialias": False, "roi": None, "extrapolation": 0.0}, num_args=1, legalize=_legalize_resize))


def resize(
    x: Expr,
    sizes: Sequence[Dim],
    scales: Sequence[float] | None = None,
    mode: str = "nearest",
    coord: str = "half_pixel",
    rounding: str = "round_prefer_floor",
    cubic_a: float = -0.75,
    exclude_outside: bool = False,
    antialias: bool = False,
    roi: Sequence[float] | None = None,
    extrapolation: float = 0.0,
) -> Call:
    """``x`` resampled to ``sizes`` (see the module docstring)."""
    sc = None if scales is None else tuple(float(s) for s in scales)
    if sc is not None and any(not math.isfinite(s) or s <= 0 for s in sc):
        raise ValueError(f"resize scales must be positive, got {sc}")
    box = None if roi is None else tuple(float(v) for v in roi)
    return make_call("resize", [x], sizes=tuple(sizes), scales=sc, mode=mode, coord=coord, rounding=rounding, cubic_a=float(cubic_a), exclude_outside=bool(exclude_outside), antialias=bool(antialias), roi=box, extrapolation=float(extrapolation))


# -- grid_sample ---------------------------------------------------------------------------------

GRID_MODES = ("linear", "nearest", "cubic")
GRID_PADDINGS = ("zeros", "border", "reflection")


def _infer_grid_sample(call: Call, ctx: InferCtx) -> StructInfo:
    x, grid = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    for attr, allowed in (("mode", GRID_MODES), ("padding", GRID_PADDINGS)):
        if call.attrs[attr] not in allowed:
            raise ctx.error(f"{attr} must be one of {', '.join(allowed)}, got {call.attrs[attr]!r}")
    dtype = unify_dtype([x.dtype, grid.dtype], ctx)
    if dtype is not None and not dtype.startswith(("float", "bfloat")):
        raise ctx.error(f"grid_sample needs floating-point tensors, got {dtype}")
    if x.ndim == -1 or grid.ndim == -1:
        return TensorInfo(None, dtype, x.ndim)
    nsp = x.ndim - 2
    if nsp < 1 or grid.ndim != nsp + 2:
        raise ctx.shape_error(f"x {shape_str(x.shape)} must be [N, C, *spatial] and grid {shape_str(grid.shape)} [N, *out, {max(nsp, 1)}]")
    if call.attrs["mode"] == "cubic" and nsp != 2:
        raise ctx.error(f"cubic grid sampling needs a 2-D input, got {nsp} spatial dims")
    if x.shape is None or grid.shape is None:
        return TensorInfo(None, dtype, x.ndim)
    require_equal(x.shape[0], grid.shape[0], ctx, f"the batch of x {shape_str(x.shape)} and grid {shape_str(grid.shape)} differ")
    require_equal(grid.shape[-1], nsp, ctx, f"the last dim of grid {shape_str(grid.shape)} must be {nsp} (one coordinate per spatial dim)")
    return TensorInfo(x.shape[:2] + grid.shape[1:-1], dtype)


def _unnormalize(g: PExpr, size: PExpr, align: bool) -> PExpr:
    """A grid coordinate in ``[-1, 1]`` as a position along a dim of ``size`` elements."""
    if align:
        return (g + 1.0) * 0.5 * (size - 1.0)
    return ((g + 1.0) * size - 1.0) * 0.5


def _reflect(c: PExpr, twice_low: PExpr, twice_high: PExpr) -> PExpr:
    """``c`` reflected into ``[twice_low / 2, twice_high / 2]`` (as often as it takes)."""
    low = twice_low * 0.5
    span = (twice_high - twice_low) * 0.5
    r = te.abs(c - low)
    flips = te.floor(r / span)
    extra = r - flips * span
    even = te.eq(flips - 2.0 * te.floor(flips * 0.5), 0.0)
    return te.if_then_else(te.gt(span, 0.0), te.if_then_else(even, extra + low, span - extra + low), 0.0)


def _padded_coord(c: PExpr, size: PExpr, padding: str, align: bool) -> PExpr:
    if padding == "zeros":
        return c
    if padding == "reflection":
        c = _reflect(c, te.constant(0.0, "float64"), 2.0 * (size - 1.0)) if align else _reflect(c, te.constant(-1.0, "float64"), 2.0 * size - 1.0)
    return te.minimum(te.maximum(c, 0.0), size - 1.0)


def _legalize_grid_sample(call: Call, ctx: "LegalizeCtx") -> Expr:
    """Each output element reads the taps around its grid point (one for nearest, ``2**n``
    for linear, 16 for cubic) in float64; a tap outside the input reads 0 (its load is
    clamped inside, the value replaced)."""
    x, grid = arg(call, 0, "x"), arg(call, 1, "grid")
    shape, dtype = out_tensor(call)
    mode, padding, align = call.attrs["mode"], call.attrs["padding"], bool(call.attrs["align_corners"])
    nsp = x.ndim - 2
    dims = x.shape[2:]

    def tap(n: Scalar, c: Scalar, idx: Sequence[Scalar]) -> PExpr:
        inside = te.all(*(te.logical_and(te.ge(i, 0), te.lt(i, d)) for i, d in zip(idx, dims)))
        value = te.cast(x[(n, c, *(_clamp(i, d) for i, d in zip(idx, dims)))], "float64")
        return te.if_then_else(inside, value, 0.0)

    def f(n: Scalar, c: Scalar, *o: Scalar) -> Operand:
        sizes = [te.cast(d, "float64") for d in dims]
        raw = [_unnormalize(te.cast(grid[(n, *o, nsp - 1 - k)], "float64"), sizes[k], align) for k in range(nsp)]
        if mode == "cubic":
            return _cubic_tap_sum(n, c, raw, sizes, padding, align, tap)
        coords = [_padded_coord(r, s, padding, align) for r, s in zip(raw, sizes)]
        if mode == "nearest":
            return tap(n, c, [te.cast(te.round(v), "int64") for v in coords])
        base = [te.floor(v) for v in coords]
        frac = [v - b for v, b in zip(coords, base)]
        ib = [te.cast(b, "int64") for b in base]
        total: float | PExpr = 0.0
        for corner in itertools.product((0, 1), repeat=nsp):
            weight: float | PExpr = 1.0
            for k, bit in enumerate(corner):
                weight = weight * (frac[k] if bit else 1.0 - frac[k])
            total = total + weight * tap(n, c, [b + bit for b, bit in zip(ib, corner)])
        return total

    out = te.compute(shape, f, "grid_sample", dtype)
    return ctx.call_te("grid_sample", call.args, [x, grid], [out], call.info)


def _cubic_tap_sum(n: Scalar, c: Scalar, raw: Sequence[PExpr], sizes: Sequence[PExpr], padding: str, align: bool, tap: Callable[..., PExpr]) -> PExpr:
    """Bicubic: the 4x4 taps around the unpadded point, each tap's position padded on its own."""
    base = [te.floor(v) for v in raw]
    weights = [_cubic_weights(v - b, -0.75) for v, b in zip(raw, base)]
    total: float | PExpr = 0.0
    for (dy, wy), (dx, wx) in itertools.product(zip((-1, 0, 1, 2), weights[0]), zip((-1, 0, 1, 2), weights[1])):
        pos = [_padded_coord(base[0] + float(dy), sizes[0], padding, align), _padded_coord(base[1] + float(dx), sizes[1], padding, align)]
        total = total + wy * wx * tap(n, c, [te.cast(p, "int64") for p in pos])
    assert isinstance(total, PExpr)
    return total


register(Op("grid_sample", _infer_grid_sample, OpPattern.INJECTIVE, attrs={"mode": "linear", "padding": "zeros", "align_corners": False}, num_args=2, legalize=_legalize_grid_sample))


def grid_sample(x: Expr, grid: Expr, mode: str = "linear", padding: str = "zeros", align_corners: bool = False) -> Call:
    """``x: [N, C, *spatial]`` sampled at the normalized points ``grid: [N, *out, n]`` (the
    last entry of a point indexes the first spatial dim: ``(x, y)`` for ``[H, W]``), as torch's
    ``grid_sample`` and ONNX's ``GridSample``: ``mode`` linear, nearest (half to even) or cubic
    (2-D, Keys with ``a = -0.75``); ``padding`` zeros, border or reflection."""
    return make_call("grid_sample", [x, grid], mode=mode, padding=padding, align_corners=bool(align_corners))
