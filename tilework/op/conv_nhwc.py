"""Channel-last convolution pieces: ``im2col``, the column matrix of a 2-D convolution over an
``[N, H, W, C]`` input, which ``tilework.transform.conv_gemm`` multiplies by a packed weight
(``linear``) so that a convolution runs on the matmul kernels, and ``max_pool2d_nhwc``
(``max_pool2d`` without ``ceil_mode`` over the same layout: the maximum of the taps, vectorized
along the channels; a tap in the padding reads the nearest input element, which is in the same
window, or without that guarantee (dilation, padding as long as the window) the input is padded
with -inf first) and ``depthwise_conv2d_nhwc`` (one input channel per output channel, weights
``[KH * KW, C]``: one sum of products per output, vectorized along the channels, its taps that
can fall in the padding read clamped into the input and masked to zero: no padded copy), and
``direct_conv2d_nhwc`` (a conv of few input channels, an image's, as one sum of products per
output vectorized along the output channels: no column matrix, a channel-first input read as
it is), and ``global_avg_pool_nhwc`` (the spatial mean, ``[N, 1, 1, C]``: sums of pixel rows, then of the
rows, vectorized along the channels).

``im2col(x, kernel, strides, padding, dilation)`` gives ``[N, OH, OW, KH * KW * C]`` with
``col[n, oh, ow, (i * KW + j) * C + c] = x[n, oh * sh - top + i * dh, ow * sw - left + j * dw, c]``
(zero where that falls in the padding); ``padding`` is ``(top, left, bottom, right)`` and the
output lengths are ``conv2d``'s. Every tap is a run of ``C`` contiguous values on both sides.

Legalization: with padding the input is first copied into a zero-padded buffer (one test per
input element instead of one per tap), then one gather kernel writes
``[N, OH, OW, KH, KW, C]`` (``[N, OH, OW, KH, KW * C]`` from the input's rows viewed as
``[N, H, W * C]`` without a column dilation: one contiguous run per kernel row) (labelled ``out_ewise_fusable``: a producer is not inlined, or it
would be computed once per tap), viewed as the 4-D result.
"""

from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING, Sequence

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, shape_str
from tilework.ir.sym import Dim
from tilework.ir.loop import Scalar
from tilework.op.base import InferCtx, Op, OpPattern, make_call, register, require_equal, require_float, tensor_arg
from tilework.op.conv import _call_gather, _ints_attr, _inside, _padded, _require_positive, conv_out_len
from tilework.op.kernel import arg, compute_dtype, out_tensor, reshape_index

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx


def _window(call: Call, ctx: InferCtx, size_attr: str) -> tuple[Sequence[int], ...]:
    """The (size, strides, padding, dilation) attrs of a channel-last window op."""
    return (_ints_attr(call, size_attr, 2, ctx, 1), _ints_attr(call, "strides", 2, ctx, 1), _ints_attr(call, "padding", 4, ctx, 0), _ints_attr(call, "dilation", 2, ctx, 1))


def _out_spatial(shape: Sequence[Dim], window: tuple[Sequence[int], ...], ctx: InferCtx) -> tuple[Dim, ...]:
    """The output height and width of a window over the ``[batch, height, width, channels]`` ``shape``."""
    size, strides, padding, dilation = window
    spatial = tuple(conv_out_len(shape[1 + i], size[i], strides[i], padding[i], padding[2 + i], dilation[i]) for i in range(2))
    _require_positive(spatial, ctx, "output spatial shape")
    return spatial


def _infer_im2col(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    window = _window(call, ctx, "kernel")
    if x.ndim not in (-1, 4):
        raise ctx.shape_error(f"input must be 4-D [batch, height, width, channels], got shape {shape_str(x.shape)}")
    if x.shape is None:
        return TensorInfo(None, x.dtype, 4)
    kernel = window[0]
    return TensorInfo((x.shape[0], *_out_spatial(x.shape, window, ctx), sym.mul(x.shape[3], kernel[0] * kernel[1])), x.dtype)


def _padded_nhwc(ctx: "LegalizeCtx", value: Expr, x: te.Tensor, padding: Sequence[int], fill: float, hint: str) -> tuple[Expr, te.Tensor]:
    """``value`` (``x``, ``[N, H, W, C]``) copied into a buffer with ``padding`` (top, left,
    bottom, right) filled with ``fill``: the emitted copy and its placeholder; ``value`` and
    ``x`` themselves without padding."""
    if not any(padding):
        return value, x
    top, left = padding[0], padding[1]
    pshape = (x.shape[0], sym.add(x.shape[1], top + padding[2]), sym.add(x.shape[2], left + padding[3]), x.shape[3])

    def pad(nn: Scalar, h: Scalar, w: Scalar, ch: Scalar) -> Scalar:
        pos = [h - top, w - left]
        return te.if_then_else(_inside(pos, x.shape[1:3]), x[nn, pos[0], pos[1], ch], te.cast(fill, x.dtype))

    xp = te.compute(pshape, pad, hint, x.dtype)
    emitted = ctx.bb.emit(ctx.call_te(hint, [value], [x], [xp], TensorInfo(pshape, x.dtype)), name=hint)
    return emitted, te.placeholder(pshape, x.dtype, "xp")


def _legalize_im2col(call: Call, ctx: "LegalizeCtx") -> Expr:
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    kh, kw = call.attrs["kernel"]
    strides, padding, dilation = (tuple(call.attrs[a]) for a in ("strides", "padding", "dilation"))
    n, c = x.shape[0], x.shape[3]
    x_in, x = _padded_nhwc(ctx, call.args[0], x, padding, 0.0, "im2col_pad")

    if dilation[1] == 1:  # a kernel row's taps are one run of KW * C values: the input's rows viewed flat
        rshape = (n, x.shape[1], sym.mul(x.shape[2], c))
        xr = te.compute(rshape, lambda *i: x[reshape_index(i, rshape, x.shape)], "im2col_rows", dtype)
        x_in = ctx.bb.emit(ctx.call_te("im2col_rows", [x_in], [x], [xr], TensorInfo(rshape, dtype)), name="im2col_rows")
        x = te.placeholder(rshape, dtype, "rows")

        def run(nn: Scalar, oh: Scalar, ow: Scalar, i: Scalar, jc: Scalar) -> Scalar:
            return x[nn, oh * strides[0] + i * dilation[0], ow * (strides[1] * c) + jc]

        col_g = te.compute((n, shape[1], shape[2], kh, sym.mul(kw, c)), run, "im2col", dtype)
    else:

        def gather(nn: Scalar, oh: Scalar, ow: Scalar, i: Scalar, j: Scalar, ch: Scalar) -> Scalar:
            return x[nn, oh * strides[0] + i * dilation[0], ow * strides[1] + j * dilation[1], ch]

        col_g = te.compute((n, shape[1], shape[2], kh, kw, c), gather, "im2col", dtype)
    col = ctx.bb.emit(_call_gather(ctx, "im2col", [x_in], [x], [col_g], TensorInfo(tuple(col_g.shape), dtype)), name="im2col")
    cp = te.placeholder(col_g.shape, dtype, "col")
    view = te.compute(tuple(shape), lambda *i: cp[reshape_index(i, tuple(shape), cp.shape)], "im2col_view", dtype)
    return ctx.call_te("im2col_view", [col], [cp], [view], call.info)


register(Op("im2col", _infer_im2col, OpPattern.INJECTIVE, attrs={"kernel": None, "strides": None, "padding": None, "dilation": None}, num_args=1, legalize=_legalize_im2col))


def _infer_max_pool_nhwc(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    require_float(x, ctx)
    window = _window(call, ctx, "pool_size")
    if x.ndim not in (-1, 4):
        raise ctx.shape_error(f"input must be 4-D [batch, height, width, channels], got shape {shape_str(x.shape)}")
    if x.shape is None:
        return TensorInfo(None, x.dtype, 4)
    return TensorInfo((x.shape[0], *_out_spatial(x.shape, window, ctx), x.shape[3]), x.dtype)


def _legalize_max_pool_nhwc(call: Call, ctx: "LegalizeCtx") -> Expr:
    """The maximum of the taps in one expression, vectorized along the channels. Without
    dilation and with every side's padding shorter than the window, a tap in the padding reads
    the nearest input element instead (clamped: that element is in the same window, so the
    maximum is the same) and no padded copy is made; otherwise the input is padded with -inf
    first."""
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    (kh, kw), strides, padding, dilation = (tuple(call.attrs[a]) for a in ("pool_size", "strides", "padding", "dilation"))
    clamped = tuple(dilation) == (1, 1) and all(p < k for p, k in zip(padding, (kh, kw, kh, kw)))
    x_in = call.args[0]
    if not clamped:
        x_in, x = _padded_nhwc(ctx, call.args[0], x, padding, float("-inf"), "max_pool_pad")

    def taps(nn: Scalar, oh: Scalar, ow: Scalar, ch: Scalar) -> Scalar:
        best: Scalar | None = None
        for i, j in itertools.product(range(kh), range(kw)):
            if clamped:
                h, _ = _tap_index(oh, i, strides[0], padding[0], shape[1], x.shape[1])
                w, _ = _tap_index(ow, j, strides[1], padding[1], shape[2], x.shape[2])
                v: Scalar = x[nn, h, w, ch]
            else:
                v = x[nn, oh * strides[0] + i * dilation[0], ow * strides[1] + j * dilation[1], ch]
            best = v if best is None else te.maximum(best, v)
        assert best is not None
        return best

    out = te.compute(tuple(shape), taps, "max_pool_nhwc", dtype)
    return _call_gather(ctx, "max_pool_nhwc", [x_in], [x], [out], call.info)


register(Op("max_pool2d_nhwc", _infer_max_pool_nhwc, OpPattern.OUT_EWISE_FUSABLE, attrs={"pool_size": None, "strides": None, "padding": None, "dilation": None}, num_args=1, legalize=_legalize_max_pool_nhwc))


def max_pool2d_nhwc(x: Expr, pool_size: Sequence[int], strides: Sequence[int], padding: Sequence[int] = (0, 0, 0, 0), dilation: Sequence[int] = (1, 1)) -> Call:
    """``max_pool2d`` (without ``ceil_mode``) over ``x: [N, H, W, C]``: ``[N, OH, OW, C]``;
    ``padding`` is ``(top, left, bottom, right)``."""
    return make_call("max_pool2d_nhwc", [x], pool_size=tuple(pool_size), strides=tuple(strides), padding=tuple(padding), dilation=tuple(dilation))


def _conv_args(call: Call, ctx: InferCtx) -> tuple[TensorInfo, TensorInfo, tuple[Sequence[int], ...]]:
    """``x``, ``weight`` and the window (``_window``) of a channel-last conv taking ``(x,
    weight)`` or ``(x, weight, bias)`` (depthwise and grouped): ``x`` a float tensor."""
    if len(call.args) not in (2, 3):
        raise ctx.error(f"takes (x, weight) or (x, weight, bias), got {len(call.args)} argument(s)")
    x, w = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    require_float(x, ctx)
    return x, w, _window(call, ctx, "kernel")


def _infer_depthwise_nhwc(call: Call, ctx: InferCtx) -> StructInfo:
    x, w, window = _conv_args(call, ctx)
    kernel = window[0]
    if x.ndim not in (-1, 4) or w.ndim not in (-1, 2):
        raise ctx.shape_error(f"takes x [batch, height, width, channels] and weight [taps, channels], got shapes {shape_str(x.shape)} and {shape_str(w.shape)}")
    if x.shape is None:
        return TensorInfo(None, x.dtype, 4)
    if w.shape is not None:
        require_equal(w.shape[0], kernel[0] * kernel[1], ctx, f"weight {shape_str(w.shape)} must hold {kernel[0] * kernel[1]} taps")
        require_equal(w.shape[1], x.shape[3], ctx, f"channels of weight {shape_str(w.shape)} and input {shape_str(x.shape)} differ")
    return TensorInfo((x.shape[0], *_out_spatial(x.shape, window, ctx), x.shape[3]), x.dtype)


def _tap_index(out: Scalar, tap: int, stride: int, before: int, out_len: Dim, size: Dim) -> tuple[Scalar, list[Scalar]]:
    """The input position ``out * stride + tap - before`` of one window tap along a dim of
    length ``size``, clamped into it where some output's tap can fall in the padding, and the
    conditions under which it is in range (none for a tap that never leaves the input)."""
    pos = sym.add(sym.mul(out, stride), tap - before)  # type: ignore[arg-type]
    conds: list[Scalar] = []
    if tap < before:
        conds.append(te.ge(pos, 0))
        pos = sym.max_(pos, 0)
    if not sym.prove_le(sym.add(sym.mul(sym.sub(out_len, 1), stride), tap - before), sym.sub(size, 1)):
        conds.append(te.lt(pos, size))
        pos = sym.min_(pos, sym.sub(size, 1))
    return pos, conds


_MASKS = {"float32": "int32", "float64": "int64"}


def _zero_unless(conds: Sequence[Scalar], v: Scalar, dtype: str) -> Scalar:
    """``v`` where all ``conds`` hold, else +0.0. For float32/64 as the bits of ``v`` and a
    mask (the AND of ``-cond`` for each: all ones or none) rather than a select: GCC 12 does
    not vectorize a select of vectors by a scalar condition (it turns ``c1 && c2`` into one),
    nor a load inside one."""
    bits = _MASKS.get(dtype)
    if bits is None:
        return te.if_then_else(te.all(*conds), v, te.cast(0.0, dtype))
    masks = [te.cast(0, bits) - te.cast(c, bits) for c in conds]
    mask = functools.reduce(te.bitwise_and, masks)
    return te.bitcast(te.bitwise_and(te.bitcast(v, bits), mask), dtype)


def _legalize_depthwise_nhwc(call: Call, ctx: "LegalizeCtx") -> Expr:
    """One sum of products per output, vectorized along the channels (each tap's weights a
    contiguous row). The padding is not copied: a tap that can fall in it reads its position
    clamped into the input (a valid address whatever the output) and selects zero where it
    is outside, a test that is the same for every channel of the vector loop."""
    x, w = arg(call, 0, "x"), arg(call, 1, "weight")
    bias = arg(call, 2, "bias") if len(call.args) == 3 else None
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    (kh, kw), strides, padding, dilation = (tuple(call.attrs[a]) for a in ("kernel", "strides", "padding", "dilation"))

    def f(nn: Scalar, oh: Scalar, ow: Scalar, ch: Scalar) -> Scalar:
        total: Scalar | None = None if bias is None else te.cast(bias[ch], acc)
        rows = [_tap_index(oh, i * dilation[0], strides[0], padding[0], shape[1], x.shape[1]) for i in range(kh)]
        cols = [_tap_index(ow, j * dilation[1], strides[1], padding[1], shape[2], x.shape[2]) for j in range(kw)]
        for (i, (h, hc)), (j, (wi, wc)) in itertools.product(enumerate(rows), enumerate(cols)):
            v: Scalar = x[nn, h, wi, ch]
            if hc or wc:
                v = _zero_unless([*hc, *wc], v, x.dtype)
            v = te.cast(v, acc) * te.cast(w[i * kw + j, ch], acc)
            total = v if total is None else total + v
        assert total is not None
        return te.cast(total, dtype)

    out = te.compute(tuple(shape), f, "depthwise_nhwc", dtype)
    inputs = [x, w] if bias is None else [x, w, bias]
    return _call_gather(ctx, "depthwise_nhwc", list(call.args), inputs, [out], call.info)


register(Op("depthwise_conv2d_nhwc", _infer_depthwise_nhwc, OpPattern.OUT_EWISE_FUSABLE, attrs={"kernel": None, "strides": None, "padding": None, "dilation": None}, legalize=_legalize_depthwise_nhwc))


def depthwise_conv2d_nhwc(x: Expr, weight: Expr, bias: Expr | None, kernel: Sequence[int], strides: Sequence[int] = (1, 1), padding: Sequence[int] = (0, 0, 0, 0), dilation: Sequence[int] = (1, 1)) -> Call:
    """A depthwise conv (one input channel per output channel) of ``x: [N, H, W, C]`` with
    ``weight: [KH * KW, C]`` (tap-major: ``weight[i * KW + j, c]`` is torch's
    ``w[c, 0, i, j]``): ``[N, OH, OW, C]``; ``padding`` is ``(top, left, bottom, right)``."""
    args = [x, weight] if bias is None else [x, weight, bias]
    return make_call("depthwise_conv2d_nhwc", args, kernel=tuple(kernel), strides=tuple(strides), padding=tuple(padding), dilation=tuple(dilation))


LAYOUTS = ("NHWC", "NCHW")  # the inputs direct_conv2d_nhwc reads


def _infer_direct_nhwc(call: Call, ctx: InferCtx) -> StructInfo:
    if len(call.args) not in (2, 3):
        raise ctx.error(f"takes (x, weight) or (x, weight, bias), got {len(call.args)} argument(s)")
    x, w = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    require_float(x, ctx)
    layout = call.attrs["data_layout"]
    if layout not in LAYOUTS:
        raise ctx.error(f"data_layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    window = _window(call, ctx, "kernel")
    kernel = window[0]
    if x.ndim not in (-1, 4) or w.ndim not in (-1, 2):
        raise ctx.shape_error(f"takes x [batch, height, width, channels] ({layout}) and weight [taps * channels, out], got shapes {shape_str(x.shape)} and {shape_str(w.shape)}")
    if x.shape is None or w.shape is None:
        return TensorInfo(None, x.dtype, 4)
    nhwc = x.shape if layout == "NHWC" else (x.shape[0], x.shape[2], x.shape[3], x.shape[1])
    if not isinstance(nhwc[3], int):
        raise ctx.shape_error(f"the input channels must be static (each is a term of the sum), got {sym.to_str(nhwc[3])}")
    require_equal(w.shape[0], kernel[0] * kernel[1] * nhwc[3], ctx, f"weight {shape_str(w.shape)} must hold {kernel[0] * kernel[1]} taps of {nhwc[3]} channels")
    return TensorInfo((nhwc[0], *_out_spatial(nhwc, window, ctx), w.shape[1]), x.dtype)


def _legalize_direct_nhwc(call: Call, ctx: "LegalizeCtx") -> Expr:
    """One sum of the ``KH * KW * C`` products per output, vectorized along the output
    channels: each input value is read once for all of them (a broadcast), each tap's weights
    are a contiguous row; the products of each kernel row are a partial sum of their own (a
    chain of ``KW * C`` FMAs, not one of ``KH * KW * C``: the chains overlap), the rows' sums
    added at the end. With padding and a symbolic image size the input is first copied into a
    zero-padded buffer (few channels: a small copy), so that no tap needs a clamp or a mask
    (MobileNetV3-Small's stem at batch 8 on AVX-512, one expression per output: 0.53 ms with
    masked taps, 0.44 with the copy). At a static size the stencil schedule takes the conv
    (``tilework.schedule.rules.stencil``): only its border rows and columns test the padding,
    and the copy would cost more than they do (the same stem on an AVX2-only Zen: 2.1 ms +
    1.1 ms for the copy, 2.3 ms without it). No column matrix is written, and a channel-first
    input is read as it is."""
    x, w = arg(call, 0, "x"), arg(call, 1, "weight")
    bias = arg(call, 2, "bias") if len(call.args) == 3 else None
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    (kh, kw), strides, padding, dilation = (tuple(call.attrs[a]) for a in ("kernel", "strides", "padding", "dilation"))
    nchw = call.attrs["data_layout"] == "NCHW"
    c = x.shape[1] if nchw else x.shape[3]
    assert isinstance(c, int)  # (_infer_direct_nhwc)
    x_in = call.args[0]
    hh, ww = (x.shape[2], x.shape[3]) if nchw else (x.shape[1], x.shape[2])
    if any(padding) and not (isinstance(hh, int) and isinstance(ww, int)):  # a padded copy, then no tap is masked
        x_in, x = (_padded if nchw else _padded_nhwc)(ctx, call.args[0], x, padding, 0.0, "direct_conv_pad")
        padding = (0, 0, 0, 0)
        hh, ww = (x.shape[2], x.shape[3]) if nchw else (x.shape[1], x.shape[2])

    def f(nn: Scalar, oh: Scalar, ow: Scalar, o: Scalar) -> Scalar:
        rows = [_tap_index(oh, i * dilation[0], strides[0], padding[0], shape[1], hh) for i in range(kh)]
        cols = [_tap_index(ow, j * dilation[1], strides[1], padding[1], shape[2], ww) for j in range(kw)]
        chains: list[Scalar] = []  # one partial sum per kernel row: independent chains of FMAs
        for i, (h, hc) in enumerate(rows):
            part: Scalar | None = None
            for (j, (wi, wc)), ch in itertools.product(enumerate(cols), range(c)):
                v: Scalar = x[nn, ch, h, wi] if nchw else x[nn, h, wi, ch]
                if hc or wc:
                    v = _zero_unless([*hc, *wc], v, x.dtype)
                v = te.cast(v, acc) * te.cast(w[(i * kw + j) * c + ch, o], acc)
                part = v if part is None else part + v
            assert part is not None
            chains.append(part)
        total = functools.reduce(lambda a, b: a + b, chains)
        return te.cast(total if bias is None else te.cast(bias[o], acc) + total, dtype)

    out = te.compute(tuple(shape), f, "direct_conv_nhwc", dtype)
    inputs = [x, w] if bias is None else [x, w, bias]
    return _call_gather(ctx, "direct_conv_nhwc", [x_in, *call.args[1:]], inputs, [out], call.info)


register(Op("direct_conv2d_nhwc", _infer_direct_nhwc, OpPattern.OUT_EWISE_FUSABLE, attrs={"kernel": None, "strides": None, "padding": None, "dilation": None, "data_layout": "NHWC"}, legalize=_legalize_direct_nhwc))


def direct_conv2d_nhwc(x: Expr, weight: Expr, bias: Expr | None, kernel: Sequence[int], strides: Sequence[int] = (1, 1), padding: Sequence[int] = (0, 0, 0, 0), dilation: Sequence[int] = (1, 1), data_layout: str = "NHWC") -> Call:
    """A 2-D conv of few input channels (an image's) computed directly, no column matrix:
    ``x`` is ``[N, H, W, C]`` (or ``[N, C, H, W]`` with ``data_layout="NCHW"``, read as it is),
    ``weight: [KH * KW * C, O]`` (``weight[(i * KW + j) * C + c, o]`` is torch's ``w[o, c, i,
    j]``: ``conv_weight_matrix`` transposed), and the result ``[N, OH, OW, O]`` channel-last;
    ``padding`` is ``(top, left, bottom, right)``."""
    args = [x, weight] if bias is None else [x, weight, bias]
    return make_call("direct_conv2d_nhwc", args, kernel=tuple(kernel), strides=tuple(strides), padding=tuple(padding), dilation=tuple(dilation), data_layout=data_layout)


MAX_POOLED_RUN = 64  # a global pool over static H, W up to this sums unrolled runs (two kernels)


def _infer_global_avg_pool_nhwc(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    require_float(x, ctx)
    if x.ndim not in (-1, 4):
        raise ctx.shape_error(f"input must be 4-D [batch, height, width, channels], got shape {shape_str(x.shape)}")
    if x.shape is None:
        return TensorInfo(None, x.dtype, 4)
    return TensorInfo((x.shape[0], 1, 1, x.shape[3]), x.dtype)


def _legalize_global_avg_pool_nhwc(call: Call, ctx: "LegalizeCtx") -> Expr:
    """Over static spatial dims of at most ``MAX_POOLED_RUN``: the sum of each row of pixels
    (``W`` terms, one expression per ``[n, h, c]``), then of the ``H`` row sums, divided by
    ``H * W``: both vectorized along the channels (a ``mean`` reduces each channel alone, a
    scalar loop with a stride of ``C``). Otherwise that ``mean``."""
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    n, h, w, c = x.shape
    if not (isinstance(h, int) and isinstance(w, int) and h <= MAX_POOLED_RUN and w <= MAX_POOLED_RUN):
        kh, kw = te.reduce_axis(h, "kh"), te.reduce_axis(w, "kw")
        area = te.cast(sym.mul(h, w), acc)
        out = te.compute(tuple(shape), lambda nn, _i, _j, ch: te.cast(te.sum(te.cast(x[nn, kh, kw, ch], acc), axis=[kh, kw]) / area, dtype), "global_avg_pool", dtype)
        return ctx.call_te("global_avg_pool", list(call.args), [x], [out], call.info)

    def row_sums(nn: Scalar, hh: Scalar, ch: Scalar) -> Scalar:
        total: Scalar = te.cast(x[nn, hh, 0, ch], acc)
        for j in range(1, w):
            total = total + te.cast(x[nn, hh, j, ch], acc)
        return total

    rows = te.compute((n, h, c), row_sums, "global_pool_rows", acc)
    rows_info = TensorInfo((n, h, c), acc)
    summed = ctx.bb.emit(_call_gather(ctx, "global_pool_rows", list(call.args), [x], [rows], rows_info), name="global_pool_rows")
    r = te.placeholder((n, h, c), acc, "rows")

    def mean(nn: Scalar, _i: Scalar, _j: Scalar, ch: Scalar) -> Scalar:
        total: Scalar = r[nn, 0, ch]
        for i in range(1, h):
            total = total + r[nn, i, ch]
        return te.cast(total / te.constant(float(h * w), acc), dtype)

    out = te.compute(tuple(shape), mean, "global_avg_pool", dtype)
    return _call_gather(ctx, "global_avg_pool", [summed], [r], [out], call.info)


register(Op("global_avg_pool_nhwc", _infer_global_avg_pool_nhwc, OpPattern.OUT_EWISE_FUSABLE, num_args=1, legalize=_legalize_global_avg_pool_nhwc))


def global_avg_pool_nhwc(x: Expr) -> Call:
    """The mean over the spatial dims of ``x: [N, H, W, C]``: ``[N, 1, 1, C]``."""
    return make_call("global_avg_pool_nhwc", [x])


def im2col(x: Expr, kernel: Sequence[int], strides: Sequence[int] = (1, 1), padding: Sequence[int] = (0, 0, 0, 0), dilation: Sequence[int] = (1, 1)) -> Call:
    """The column matrix of a 2-D convolution over ``x: [N, H, W, C]`` (see the module
    docstring): ``[N, OH, OW, KH * KW * C]``."""
    return make_call("im2col", [x], kernel=tuple(kernel), strides=tuple(strides), padding=tuple(padding), dilation=tuple(dilation))
