"""Convolution and pooling over channel-first layouts: ``conv1d`` (``[N, C, L]``), ``conv2d``
(``[N, C, H, W]``), ``conv_transpose`` (1-, 2- or 3-D), ``max_pool2d`` (and
``max_pool2d_indices``: where each maximum is), ``avg_pool2d``, ``adaptive_avg_pool2d`` and
``adaptive_max_pool2d``.

Geometry attributes have one entry per spatial dim (``strides``, ``dilation``, ``pool_size``)
except ``padding``, which lists the padding before every spatial dim and then the padding after
every one (``(top, left, bottom, right)`` for 2-D), so asymmetric padding is expressible. The
output length of a spatial dim of length ``d`` is
``(d + pad_before + pad_after - dilation * (k - 1) - 1) // stride + 1`` and stays symbolic.

``conv*`` weights are ``[out_channels, in_channels // groups, *kernel]`` (torch's layout);
output channel ``o`` reads the input channels of group ``o // (out_channels // groups)``.
Pooling with ``ceil_mode`` rounds the output length up but never starts a window in the
padding after the input (torch's rule). ``avg_pool2d`` divides by the number of (dilated) taps
of the window inside the padded input (``count_include_pad``) or inside the input itself; its
padding may exceed half the window (a window wholly in the padding then averages nothing: NaN
without ``count_include_pad``). ``max_pool2d``'s padding is at most half the dilated window.
``max_pool2d_indices`` gives, for each output of ``max_pool2d``, the int64 position
``h * W + w`` in its input plane of the first tap (in window order) holding the maximum
(torch's ``return_indices``).
``adaptive_avg_pool2d`` averages rows ``floor(i * d / out) .. ceil((i + 1) * d / out)``;
``adaptive_max_pool2d`` takes their maximum.

``conv_transpose`` (the gradient of a convolution, torch's and ONNX's ``ConvTranspose``) takes
weights ``[in_channels, out_channels // groups, *kernel]``; input position ``i`` and tap ``k``
add to output position ``i * stride - pad_before + k * dilation``, so a spatial dim of length
``d`` gives ``(d - 1) * stride - pad_before - pad_after + dilation * (k - 1) + output_padding + 1``.

Legalization: padded taps are skipped (never loaded), except that im2col, a short (depthwise)
conv or a small float max pool (without ceil_mode) with padding reads a padded copy of its input; conv accumulates float16/bfloat16 in
float32.
"""

from __future__ import annotations

import itertools
import math
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
    bool_attr,
    int_attr,
    make_call,
    register,
    require_equal,
    require_float,
    tensor_arg,
    unify_dtype,
)
from tilework.op.calls import call_tensor
from tilework.op.kernel import arg, compute_dtype, op_name, out_tensor, reshape_index, upcast

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

_SPATIAL = {"conv1d": 1, "conv2d": 2, "max_pool2d": 2, "max_pool2d_indices": 2, "avg_pool2d": 2, "adaptive_avg_pool2d": 2, "adaptive_max_pool2d": 2}


def _ints_attr(call: Call, name: str, count: int, ctx: InferCtx, minimum: int) -> tuple[int, ...]:
    v = call.attrs[name]
    if not isinstance(v, tuple) or len(v) != count or any(isinstance(a, bool) or not isinstance(a, int) for a in v):
        raise ctx.error(f"attribute {name} must be a tuple of {count} ints, got {v!r}")
    if any(a < minimum for a in v):
        raise ctx.error(f"attribute {name} entries must be >= {minimum}, got {v!r}")
    return tuple(v)


def conv_out_len(d: Dim, k: Dim, stride: int, pad_before: int, pad_after: int, dilation: int, ceil_mode: bool = False) -> Dim:
    """The output length of one spatial dim (see the module docstring)."""
    span = sym.sub(sym.add(d, pad_before + pad_after), sym.add(sym.mul(dilation, sym.sub(k, 1)), 1))
    if not ceil_mode:
        return sym.add(sym.floordiv(span, stride), 1)
    n = sym.add(sym.ceildiv(span, stride), 1)
    return sym.min_(n, sym.ceildiv(sym.add(d, pad_before), stride))


def _require_positive(dims: Sequence[Dim], ctx: InferCtx, what: str) -> None:
    for d in dims:
        if sym.prove_ge(d, 1):
            continue
        if isinstance(d, int):
            raise ctx.shape_error(f"{what} {shape_str(tuple(dims))} must be positive, got {d}")
        ctx.require("ge", (d, 1), f"{what} {shape_str(tuple(dims))} must be positive")


def _geometry(call: Call, ctx: InferCtx, nsp: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    strides = _ints_attr(call, "strides", nsp, ctx, 1)
    padding = _ints_attr(call, "padding", 2 * nsp, ctx, 0)
    dilation = _ints_attr(call, "dilation", nsp, ctx, 1) if "dilation" in call.attrs else (1,) * nsp
    return strides, padding, dilation


def _check_input(x: TensorInfo, nsp: int, ctx: InferCtx) -> None:
    if x.ndim not in (-1, nsp + 2):
        raise ctx.shape_error(f"input must be {nsp + 2}-D [batch, channels, *spatial], got shape {shape_str(x.shape)}")


def _infer_conv(call: Call, ctx: InferCtx) -> StructInfo:
    nsp = _SPATIAL[ctx.op_name]
    if len(call.args) not in (2, 3):
        raise ctx.error(f"takes (x, weight) or (x, weight, bias), got {len(call.args)} argument(s)")
    x, w = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    bias = tensor_arg(call, 2, ctx) if len(call.args) == 3 else None
    require_float(x, ctx)
    dtype = unify_dtype([x.dtype, w.dtype] + ([bias.dtype] if bias else []), ctx)
    strides, padding, dilation = _geometry(call, ctx, nsp)
    groups = int_attr(call, "groups", ctx)
    if groups < 1:
        raise ctx.error(f"groups must be >= 1, got {groups}")
    _check_input(x, nsp, ctx)
    if w.ndim not in (-1, nsp + 2):
        raise ctx.shape_error(f"weight must be {nsp + 2}-D [out_channels, in_channels // groups, *kernel], got shape {shape_str(w.shape)}")
    if bias is not None and bias.ndim not in (-1, 1):
        raise ctx.shape_error(f"bias must be 1-D [out_channels], got shape {shape_str(bias.shape)}")
    if x.shape is None or w.shape is None:
        return TensorInfo(None, dtype, nsp + 2)
    out_c = w.shape[0]
    require_equal(x.shape[1], sym.mul(w.shape[1], groups), ctx, f"input channels of {shape_str(x.shape)} must be {groups} group(s) of weight {shape_str(w.shape)}")
    rem = sym.floormod(out_c, groups)
    if isinstance(rem, int) and rem != 0:
        raise ctx.shape_error(f"out_channels {out_c} is not divisible by groups {groups}")
    if rem != 0:
        ctx.require("divides", (out_c, groups), f"out_channels {sym.to_str(out_c)} must be divisible by groups {groups}")
    if bias is not None and bias.shape is not None:
        require_equal(out_c, bias.shape[0], ctx, f"out_channels of weight {shape_str(w.shape)} and bias {shape_str(bias.shape)} differ")
    spatial = tuple(conv_out_len(x.shape[2 + i], w.shape[2 + i], strides[i], padding[i], padding[nsp + i], dilation[i]) for i in range(nsp))
    _require_positive(spatial, ctx, "output spatial shape")
    return TensorInfo((x.shape[0], out_c) + spatial, dtype)


def conv_transpose_out_len(d: Dim, k: Dim, stride: int, pad_before: int, pad_after: int, dilation: int, output_padding: int) -> Dim:
    """The output length of one spatial dim of a transposed convolution."""
    grown = sym.add(sym.mul(sym.sub(d, 1), stride), sym.add(sym.mul(dilation, sym.sub(k, 1)), output_padding + 1))
    return sym.sub(grown, pad_before + pad_after)


def _infer_conv_transpose(call: Call, ctx: InferCtx) -> StructInfo:
    if len(call.args) not in (2, 3):
        raise ctx.error(f"takes (x, weight) or (x, weight, bias), got {len(call.args)} argument(s)")
    x, w = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    bias = tensor_arg(call, 2, ctx) if len(call.args) == 3 else None
    require_float(x, ctx)
    dtype = unify_dtype([x.dtype, w.dtype] + ([bias.dtype] if bias else []), ctx)
    nsp = len(call.attrs["strides"]) if isinstance(call.attrs["strides"], tuple) else -1
    if nsp not in (1, 2, 3):
        raise ctx.error(f"attribute strides must hold 1, 2 or 3 entries (one per spatial dim), got {call.attrs['strides']!r}")
    strides, padding, dilation = _geometry(call, ctx, nsp)
    out_pad = _ints_attr(call, "output_padding", nsp, ctx, 0)
    groups = int_attr(call, "groups", ctx)
    if groups < 1:
        raise ctx.error(f"groups must be >= 1, got {groups}")
    _check_input(x, nsp, ctx)
    if w.ndim not in (-1, nsp + 2):
        raise ctx.shape_error(f"weight must be {nsp + 2}-D [in_channels, out_channels // groups, *kernel], got shape {shape_str(w.shape)}")
    if bias is not None and bias.ndim not in (-1, 1):
        raise ctx.shape_error(f"bias must be 1-D [out_channels], got shape {shape_str(bias.shape)}")
    if x.shape is None or w.shape is None:
        return TensorInfo(None, dtype, nsp + 2)
    require_equal(x.shape[1], w.shape[0], ctx, f"input channels of {shape_str(x.shape)} and weight {shape_str(w.shape)} differ")
    rem = sym.floormod(w.shape[0], groups)
    if isinstance(rem, int) and rem != 0:
        raise ctx.shape_error(f"in_channels {w.shape[0]} is not divisible by groups {groups}")
    if rem != 0:
        ctx.require("divides", (w.shape[0], groups), f"in_channels {sym.to_str(w.shape[0])} must be divisible by groups {groups}")
    out_c = sym.mul(w.shape[1], groups)
    if bias is not None and bias.shape is not None:
        require_equal(out_c, bias.shape[0], ctx, f"out_channels of weight {shape_str(w.shape)} x {groups} group(s) and bias {shape_str(bias.shape)} differ")
    spatial = tuple(conv_transpose_out_len(x.shape[2 + i], w.shape[2 + i], strides[i], padding[i], padding[nsp + i], dilation[i], out_pad[i]) for i in range(nsp))
    _require_positive(x.shape[2:], ctx, "input spatial shape")
    _require_positive(spatial, ctx, "output spatial shape")
    return TensorInfo((x.shape[0], out_c) + spatial, dtype)


def _infer_pool(call: Call, ctx: InferCtx) -> StructInfo:
    nsp = _SPATIAL[ctx.op_name]
    x = tensor_arg(call, 0, ctx)
    if ctx.op_name == "avg_pool2d":
        require_float(x, ctx)
    size = _ints_attr(call, "pool_size", nsp, ctx, 1)
    strides, padding, dilation = _geometry(call, ctx, nsp)
    ceil_mode = bool_attr(call, "ceil_mode", ctx)
    if "count_include_pad" in call.attrs:
        bool_attr(call, "count_include_pad", ctx)
    for i in range(0 if ctx.op_name == "avg_pool2d" else nsp):
        if 2 * max(padding[i], padding[nsp + i]) > dilation[i] * (size[i] - 1) + 1:
            raise ctx.error(f"padding {padding} must be at most half the (dilated) pool size {size}")
    _check_input(x, nsp, ctx)
    if x.shape is None:
        return TensorInfo(None, x.dtype, x.ndim)
    spatial = tuple(conv_out_len(x.shape[2 + i], size[i], strides[i], padding[i], padding[nsp + i], dilation[i], ceil_mode) for i in range(nsp))
    _require_positive(spatial, ctx, "output spatial shape")
    return TensorInfo(x.shape[:2] + spatial, x.dtype)


def _infer_pool_indices(call: Call, ctx: InferCtx) -> StructInfo:
    info = _infer_pool(call, ctx)
    assert isinstance(info, TensorInfo)
    return TensorInfo(info.shape, "int64", info.ndim)


def _infer_adaptive(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if ctx.op_name == "adaptive_avg_pool2d":
        require_float(x, ctx)
    out = _ints_attr(call, "output_size", 2, ctx, 1)
    _check_input(x, 2, ctx)
    if x.shape is None:
        return TensorInfo(None, x.dtype, x.ndim)
    _require_positive(x.shape[2:], ctx, "input spatial shape")
    return TensorInfo(x.shape[:2] + out, x.dtype)


# -- legalization ---------------------------------------------------------------------------


def _taps(out_idx: Sequence[Scalar], ks: Sequence[Scalar], strides: Sequence[int], padding: Sequence[int], dilation: Sequence[int]) -> list[Scalar]:
    """The input position read by kernel tap ``ks`` for output position ``out_idx``."""
    return [o * s - p + k * d for o, k, s, p, d in zip(out_idx, ks, strides, padding, dilation)]


def _inside(pos: Sequence[Scalar], dims: Sequence[Dim]) -> Scalar:
    return te.all(*(te.all(te.ge(p, 0), te.lt(p, d)) for p, d in zip(pos, dims)))


def _legalize_conv(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = op_name(call)
    nsp = _SPATIAL[name]
    x, w = arg(call, 0, "x"), arg(call, 1, "weight")
    bias = arg(call, 2, "bias") if len(call.args) == 3 else None
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    strides, padding, dilation = (tuple(call.attrs[a]) for a in ("strides", "padding", "dilation"))
    groups = int(call.attrs["groups"])
    cin_g = w.shape[1]
    per_group = sym.floordiv(w.shape[0], groups)
    if _use_gemm(w.shape, groups, dtype):
        return _conv_gemm(call, ctx, x, w, bias, shape, strides, padding, dilation, groups)
    if all(isinstance(d, int) for d in w.shape[1:]) and math.prod(_const(d) for d in w.shape[1:]) <= MAX_UNROLLED_TAPS:
        return _conv_unrolled(call, ctx, x, w, bias, shape, strides, padding, dilation, groups)

    def f(n: Scalar, o: Scalar, *sp: Scalar) -> Scalar:
        c = te.reduce_axis(cin_g, "c")
        ks = [te.reduce_axis(w.shape[2 + i], f"k{i}") for i in range(nsp)]
        pos = _taps(sp, ks, strides, padding, dilation)
        chan = c if groups == 1 else o // per_group * cin_g + c
        prod = te.cast(x[(n, chan, *pos)], acc) * te.cast(w[(o, c, *ks)], acc)
        inside = _inside(pos, x.shape[2:]) if any(padding) else None
        total = te.sum(prod, axis=[c, *ks], where=inside)
        return total if bias is None else total + te.cast(bias[o], acc)

    out = te.compute(shape, f, name, dtype)
    inputs = [x, w] if bias is None else [x, w, bias]
    return ctx.call_te(name, call.args, inputs, [out], call.info)


# A conv whose reduction (``in_channels // groups * kernel size``) and output channels per
# group are at least this long runs as im2col + the matmul kernels; a shorter one (depthwise)
# stays a direct loop nest, where the copy would cost more than the products.
GEMM_MIN_REDUCTION = 8
GEMM_MIN_CHANNELS = 4
GEMM_COLUMNS = 32  # the output positions are padded to a multiple of every register tile's width
PAD_UNROLLED = True  # im2col, an unrolled conv or max pool with padding reads a zero- (-inf-) padded copy of its input


def _use_gemm(wshape: Sequence[Dim], groups: int, dtype: str) -> bool:
    if dtype not in ("float32", "float64"):
        return False
    red = sym.product(wshape[1:])
    per_group = sym.floordiv(wshape[0], groups)
    return sym.prove_ge(red, GEMM_MIN_REDUCTION) and sym.prove_ge(per_group, GEMM_MIN_CHANNELS)


def _reshaped(ctx: "LegalizeCtx", value: Expr, src: te.Tensor, shape: Sequence[Dim], hint: str) -> Expr:
    """``value`` (shaped like ``src``) in row-major order as ``shape``: a copy kernel that
    ``rewrite_reshape_to_view`` turns into a view."""
    out = te.compute(tuple(shape), lambda *i: src[reshape_index(i, tuple(shape), src.shape)], hint, src.dtype)
    info = TensorInfo(tuple(shape), src.dtype)
    return ctx.bb.emit(ctx.call_te(hint, [value], [src], [out], info), name=hint)


def _call_gather(ctx: "LegalizeCtx", hint: str, args: Sequence[Expr], inputs: Sequence[te.Tensor], outputs: Sequence[te.Tensor], out_info: StructInfo) -> Call:
    """``ctx.call_te`` for a kernel that reads each input element several times (im2col, a
    pool or a depthwise window): labelled ``out_ewise_fusable`` so that fusion inlines its
    elementwise consumers but none of its producers (an inlined batch norm would be computed
    once per tap)."""
    func = te.create_func(list(inputs), list(outputs))
    func = func.replace(attrs=func.attrs.with_(op_pattern="out_ewise_fusable"))
    return call_tensor(ctx.add_kernel(hint, func), list(args), out_info, tuple(func.sym_params))


def _const(d: Dim) -> int:
    assert isinstance(d, int)
    return d


def _padded(ctx: "LegalizeCtx", value: Expr, x: te.Tensor, padding: Sequence[int], fill: float, hint: str) -> tuple[Expr, te.Tensor]:
    """``value`` (``x``, ``[N, C, *spatial]``) copied into a buffer with ``padding`` (befores,
    then afters) filled with ``fill`` around it: the emitted copy and its placeholder."""
    nsp = len(padding) // 2
    before, dims = padding[:nsp], x.shape[2:]
    pshape = (*x.shape[:2], *(sym.add(d, padding[i] + padding[nsp + i]) for i, d in enumerate(dims)))

    def pad(nn: Scalar, c: Scalar, *sp: Scalar) -> Scalar:
        pos = [q - b for q, b in zip(sp, before)]
        return te.if_then_else(_inside(pos, dims), x[(nn, c, *pos)], te.cast(fill, x.dtype))

    xp = te.compute(pshape, pad, hint, x.dtype)
    emitted = ctx.bb.emit(ctx.call_te(hint, [value], [x], [xp], TensorInfo(pshape, x.dtype)), name=hint)
    return emitted, te.placeholder(pshape, x.dtype, "xp")


def _conv_unrolled(call: Call, ctx: "LegalizeCtx", x: te.Tensor, w: te.Tensor, bias: te.Tensor | None, shape: Sequence[Dim], strides: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int) -> Expr:
    """A short reduction (depthwise: one input channel per output channel) as one sum of
    products per output: an injective kernel, vectorized along the output row, each weight
    a broadcast scalar. With padding (and ``PAD_UNROLLED``) the input is first copied into a
    zero-padded buffer (one test per input element, not one per tap and output), so that the
    taps load without bounds tests."""
    name = op_name(call)
    dtype = out_tensor(call)[1]
    acc = compute_dtype(dtype)
    cin_g, kernel = _const(w.shape[1]), [_const(k) for k in w.shape[2:]]
    per_group = sym.floordiv(w.shape[0], groups)
    x_arg = call.args[0]
    if any(padding) and PAD_UNROLLED:
        x_arg, x = _padded(ctx, call.args[0], x, padding, 0.0, "conv_pad")
        padding = (0,) * len(padding)

    def f(n: Scalar, o: Scalar, *sp: Scalar) -> Scalar:
        total: Scalar | None = None if bias is None else te.cast(bias[o], acc)
        for c in range(cin_g):
            chan = c if groups == 1 else o // per_group * cin_g + c
            for ks in itertools.product(*(range(k) for k in kernel)):
                pos = _taps(sp, ks, strides, padding, dilation)
                v: Scalar = te.cast(x[(n, chan, *pos)], acc)
                if any(padding):
                    v = te.if_then_else(_inside(pos, x.shape[2:]), v, te.cast(0, acc))
                term = v * te.cast(w[(o, c, *ks)], acc)
                total = term if total is None else total + term
        assert total is not None
        return te.cast(total, dtype)

    out = te.compute(tuple(shape), f, name, dtype)
    inputs = [x, w] if bias is None else [x, w, bias]
    return _call_gather(ctx, name, [x_arg, *call.args[1:]], inputs, [out], call.info)


def _conv_gemm(call: Call, ctx: "LegalizeCtx", x: te.Tensor, w: te.Tensor, bias: te.Tensor | None, shape: Sequence[Dim], strides: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int) -> Expr:
    """im2col + matmul: ``col[n, g, c, *k, p]`` holds the input tap ``k`` of channel ``c``
    reads for output position ``p`` (zero in the padding, and past the last position up to a
    multiple of ``GEMM_COLUMNS``), viewed as ``[N, G, C/G * K, P]``; the output is
    ``[G, O/G, C/G * K] @ col`` per batch and group, so the matmul rule's register tiles run
    along the contiguous output positions with no partial tile, and a copy that drops the
    padded positions (where there are any) gives ``[N, O, *spatial]`` (elementwise consumers
    fuse into that copy)."""
    nsp = len(strides)
    n, cin_g, kernel, spatial = x.shape[0], w.shape[1], tuple(w.shape[2:]), tuple(shape[2:])
    per_group = sym.floordiv(w.shape[0], groups)
    red = sym.product((cin_g, *kernel))
    npos = sym.product(spatial)
    padded = npos if sym.prove_eq(sym.floormod(npos, GEMM_COLUMNS), 0) else sym.mul(sym.ceildiv(npos, GEMM_COLUMNS), GEMM_COLUMNS)
    dtype = x.dtype
    pointwise = padded is npos and all(k == 1 for k in kernel) and all(st == 1 for st in strides) and not any(padding)
    x_in = call.args[0]
    if any(padding) and PAD_UNROLLED:  # im2col copies without bounds tests
        x_in, x = _padded(ctx, call.args[0], x, padding, 0.0, "conv_pad")
        padding = (0,) * len(padding)

    def gather(nn: Scalar, g: Scalar, c: Scalar, *kp: Scalar) -> Scalar:
        ks, os_ = kp[:nsp], list(kp[nsp:])
        if padded is not npos:  # one flat position dim, decoded
            p = os_[0]
            os_ = []
            for d in reversed(spatial[1:]):
                os_.insert(0, p % d)
                p = p // d
            os_.insert(0, p)
        pos = _taps(os_, ks, strides, padding, dilation)
        chan = c if groups == 1 else g * cin_g + c
        conds = ([te.lt(kp[nsp], npos)] if padded is not npos else []) + ([_inside(pos, x.shape[2:])] if any(padding) else [])
        load = x[(nn, chan, *pos)]
        return te.if_then_else(te.all(*conds), load, te.cast(0, dtype)) if conds else load

    # without padded positions the output positions stay spatial dims: the row loop is plain
    positions = spatial if padded is npos else (padded,)
    if pointwise:  # the input already is the column matrix
        col2 = _reshaped(ctx, call.args[0], x, (n, groups, red, padded), "im2col_view")
    else:
        col6 = te.compute((n, groups, cin_g, *kernel, *positions), gather, "im2col", dtype)
        col = ctx.bb.emit(_call_gather(ctx, "im2col", [x_in], [x], [col6], TensorInfo(tuple(col6.shape), dtype)), name="im2col")
        col2 = _reshaped(ctx, col, te.placeholder(col6.shape, dtype, "col"), (n, groups, red, padded), "im2col_view")
    w3 = _reshaped(ctx, call.args[1], w, (groups, per_group, red), "weight_view")
    cp, wp = te.placeholder((n, groups, red, padded), dtype, "col"), te.placeholder((groups, per_group, red), dtype, "w")
    bp = None if bias is None else te.placeholder(bias.shape, bias.dtype, "bias")

    def mm(nn: Scalar, g: Scalar, o: Scalar, p: Scalar) -> Scalar:
        k = te.reduce_axis(red, "k")
        total = te.sum(wp[g, o, k] * cp[nn, g, k, p], axis=[k])
        return total if bp is None else total + bp[g * per_group + o if groups > 1 else o]

    out4 = te.compute((n, groups, per_group, padded), mm, "conv_gemm", dtype)
    args = [w3, col2] + ([] if bias is None else [call.args[2]])
    inputs = [wp, cp] + ([] if bp is None else [bp])
    y = ctx.bb.emit(ctx.call_te("conv_gemm", args, inputs, [out4], TensorInfo(tuple(out4.shape), dtype)), name="conv_gemm")
    yp = te.placeholder(out4.shape, dtype, "y")
    if padded is npos:
        view = te.compute(tuple(shape), lambda *i: yp[reshape_index(i, tuple(shape), yp.shape)], "conv_view", dtype)
        return ctx.call_te("conv_view", [y], [yp], [view], call.info)

    def crop(nn: Scalar, o: Scalar, *sp: Scalar) -> Scalar:
        p: Scalar = 0
        for i, d in zip(sp, spatial):
            p = p * d + i
        return yp[nn, o // per_group if groups > 1 else 0, o % per_group if groups > 1 else o, p]

    return ctx.call_te("conv_crop", [y], [yp], [te.compute(tuple(shape), crop, "conv_crop", dtype)], call.info)


def _legalize_conv_transpose(call: Call, ctx: "LegalizeCtx") -> Expr:
    """Output position ``o`` gathers tap ``k`` from input position ``(o + pad - k * dil) /
    stride`` where that is a whole number inside the input."""
    x, w = arg(call, 0, "x"), arg(call, 1, "weight")
    bias = arg(call, 2, "bias") if len(call.args) == 3 else None
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    strides, padding, dilation = (tuple(call.attrs[a]) for a in ("strides", "padding", "dilation"))
    nsp = len(strides)
    groups = int(call.attrs["groups"])
    cin_g = sym.floordiv(w.shape[0], groups)
    cout_g = w.shape[1]

    def f(n: Scalar, o: Scalar, *sp: Scalar) -> Scalar:
        c = te.reduce_axis(cin_g, "c")
        ks = [te.reduce_axis(w.shape[2 + i], f"k{i}") for i in range(nsp)]
        nums = [s + padding[i] - k * dilation[i] for i, (s, k) in enumerate(zip(sp, ks))]
        pos = [num // strides[i] if strides[i] > 1 else num for i, num in enumerate(nums)]
        conds = [te.eq(num % strides[i], 0) for i, num in enumerate(nums) if strides[i] > 1]
        chan = c if groups == 1 else o // cout_g * cin_g + c
        oc = o if groups == 1 else o % cout_g
        prod = te.cast(x[(n, chan, *pos)], acc) * te.cast(w[(chan, oc, *ks)], acc)
        total = te.sum(prod, axis=[c, *ks], where=te.all(*conds, _inside(pos, x.shape[2:])))
        return total if bias is None else total + te.cast(bias[o], acc)

    out = te.compute(shape, f, "conv_transpose", dtype)
    inputs = [x, w] if bias is None else [x, w, bias]
    return ctx.call_te("conv_transpose", call.args, inputs, [out], call.info)


MAX_UNROLLED_TAPS = 25  # a float max pool with at most this many taps is one expression per output


def _legalize_max_pool(call: Call, ctx: "LegalizeCtx") -> Expr:
    """A float pool with a small window takes the maximum of its taps in one expression (an
    injective kernel, vectorized along the output row); otherwise a reduction."""
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    size, strides, padding, dilation = (tuple(call.attrs[a]) for a in ("pool_size", "strides", "padding", "dilation"))
    x_arg = call.args[0]
    unrolled = dtype.startswith(("float", "bfloat")) and math.prod(size) <= MAX_UNROLLED_TAPS
    if unrolled and any(padding) and not call.attrs["ceil_mode"] and PAD_UNROLLED:  # taps without bounds tests
        x_arg, x = _padded(ctx, call.args[0], x, padding, float("-inf"), "max_pool_pad")
        padding = (0,) * len(padding)

    def taps(n: Scalar, c: Scalar, *sp: Scalar) -> Scalar:
        best: Scalar | None = None
        for ks in itertools.product(*(range(k) for k in size)):
            pos = _taps(sp, ks, strides, padding, dilation)
            v: Scalar = x[(n, c, *pos)]
            if any(padding) or call.attrs["ceil_mode"]:
                v = te.if_then_else(_inside(pos, x.shape[2:]), v, te.cast(float("-inf"), dtype))
            best = v if best is None else te.maximum(best, v)
        assert best is not None
        return best

    if unrolled:
        out = te.compute(shape, taps, "max_pool2d", dtype)
        return _call_gather(ctx, "max_pool2d", [x_arg], [x], [out], call.info)

    def f(n: Scalar, c: Scalar, *sp: Scalar) -> Scalar:
        ks = [te.reduce_axis(k, f"k{i}") for i, k in enumerate(size)]
        pos = _taps(sp, ks, strides, padding, dilation)
        return te.max(x[(n, c, *pos)], axis=ks, where=_inside(pos, x.shape[2:]))

    out = te.compute(shape, f, "max_pool2d", dtype)
    return ctx.call_te("max_pool2d", call.args, [x], [out], call.info)


def _legalize_max_pool_indices(call: Call, ctx: "LegalizeCtx") -> Expr:
    """The first maximal tap of each window (an argmax over the taps inside the input), then
    its position in the input plane."""
    x = arg(call, 0, "x")
    shape, _ = out_tensor(call)
    size, strides, padding, dilation = (tuple(call.attrs[a]) for a in ("pool_size", "strides", "padding", "dilation"))

    def best_tap(n: Scalar, c: Scalar, *sp: Scalar) -> Scalar:
        ks = [te.reduce_axis(k, f"k{i}") for i, k in enumerate(size)]
        pos = _taps(sp, ks, strides, padding, dilation)
        return te.argmax(upcast(x[(n, c, *pos)], x.dtype), axis=ks, where=_inside(pos, x.shape[2:]))

    tap = te.compute(shape, best_tap, "max_pool2d_tap", "int64")

    def position(n: Scalar, c: Scalar, oh: Scalar, ow: Scalar) -> Scalar:
        t = tap[n, c, oh, ow]
        h, w = _taps((oh, ow), (t // size[1], t % size[1]), strides, padding, dilation)
        return h * x.shape[3] + w

    out = te.compute(shape, position, "max_pool2d_indices", "int64")
    return ctx.call_te("max_pool2d_indices", call.args, [x], [out], call.info)


def _taps_within(start: Scalar, lo: Dim, hi: Dim, size: int, dilation: int) -> Scalar:
    """How many of the taps ``start + k * dilation`` (``0 <= k < size``) lie in ``[lo, hi)``."""

    def first_at_or_after(bound: Scalar) -> Scalar:  # the first k whose tap is >= bound, clamped to [0, size]
        k = (bound - start + (dilation - 1)) // dilation if dilation > 1 else bound - start
        return te.minimum(te.maximum(k, 0), size)

    return first_at_or_after(hi) - first_at_or_after(lo)


def _legalize_avg_pool(call: Call, ctx: "LegalizeCtx") -> Expr:
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    size, strides, padding, dilation = (tuple(call.attrs[a]) for a in ("pool_size", "strides", "padding", "dilation"))
    include_pad = bool(call.attrs["count_include_pad"])
    nsp = len(size)
    dims = x.shape[2:]

    def count(sp: Sequence[Scalar]) -> Scalar:
        total: Scalar = 1
        for i, o in enumerate(sp):
            lo, hi = (-padding[i], sym.add(dims[i], padding[nsp + i])) if include_pad else (0, dims[i])
            total = total * _taps_within(o * strides[i] - padding[i], lo, hi, size[i], dilation[i])
        return total

    def f(n: Scalar, c: Scalar, *sp: Scalar) -> Scalar:
        ks = [te.reduce_axis(k, f"k{i}") for i, k in enumerate(size)]
        pos = _taps(sp, ks, strides, padding, dilation)
        total = te.sum(te.cast(x[(n, c, *pos)], acc), axis=ks, where=_inside(pos, dims))
        return total / te.cast(count(sp), acc)

    out = te.compute(shape, f, "avg_pool2d", dtype)
    return ctx.call_te("avg_pool2d", call.args, [x], [out], call.info)


def _legalize_adaptive(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = op_name(call)
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    outs = tuple(call.attrs["output_size"])
    dims = x.shape[2:]
    # the longest window: ceil(d / out) + 1 covers every window's rows
    widths = [sym.add(sym.ceildiv(d, o), 1) for d, o in zip(dims, outs)]

    def bounds(i: Scalar, d: Dim, o: int) -> tuple[Scalar, Scalar]:
        return i * d // o, ((i + 1) * d + (o - 1)) // o

    def f(n: Scalar, c: Scalar, *sp: Scalar) -> Scalar:
        ks = [te.reduce_axis(wd, f"k{i}") for i, wd in enumerate(widths)]
        win = [bounds(i, d, o) for i, d, o in zip(sp, dims, outs)]
        pos = [s + k for (s, _), k in zip(win, ks)]
        inside = te.all(*(te.lt(p, e) for p, (_, e) in zip(pos, win)))
        if name == "adaptive_max_pool2d":
            return te.max(x[(n, c, *pos)], axis=ks, where=inside)
        total = te.sum(te.cast(x[(n, c, *pos)], acc), axis=ks, where=inside)
        count: Scalar = 1
        for s, e in win:
            count = count * (e - s)
        return total / te.cast(count, acc)

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [x], [out], call.info)


_CONV_ATTRS = {"strides": None, "padding": None, "dilation": None, "groups": 1}
register(Op("conv1d", _infer_conv, OpPattern.OUT_EWISE_FUSABLE, attrs=_CONV_ATTRS, legalize=_legalize_conv))
register(Op("conv2d", _infer_conv, OpPattern.OUT_EWISE_FUSABLE, attrs=_CONV_ATTRS, legalize=_legalize_conv))
register(Op("max_pool2d", _infer_pool, OpPattern.OUT_EWISE_FUSABLE, attrs={"pool_size": None, "strides": None, "padding": None, "dilation": None, "ceil_mode": False}, num_args=1, legalize=_legalize_max_pool))
register(Op("max_pool2d_indices", _infer_pool_indices, OpPattern.OUT_EWISE_FUSABLE, attrs={"pool_size": None, "strides": None, "padding": None, "dilation": None, "ceil_mode": False}, num_args=1, legalize=_legalize_max_pool_indices))
register(Op("avg_pool2d", _infer_pool, OpPattern.OUT_EWISE_FUSABLE, attrs={"pool_size": None, "strides": None, "padding": None, "ceil_mode": False, "count_include_pad": True, "dilation": (1, 1)}, num_args=1, legalize=_legalize_avg_pool))
register(Op("adaptive_avg_pool2d", _infer_adaptive, OpPattern.OUT_EWISE_FUSABLE, attrs={"output_size": None}, num_args=1, legalize=_legalize_adaptive))
register(Op("adaptive_max_pool2d", _infer_adaptive, OpPattern.OUT_EWISE_FUSABLE, attrs={"output_size": None}, num_args=1, legalize=_legalize_adaptive))
register(Op("conv_transpose", _infer_conv_transpose, OpPattern.OUT_EWISE_FUSABLE, attrs={"strides": None, "padding": None, "output_padding": None, "dilation": None, "groups": 1}, legalize=_legalize_conv_transpose))

# -- constructors ---------------------------------------------------------------------------


def _per_dim(v: int | Sequence[int], n: int, what: str) -> tuple[int, ...]:
    out = (v,) * n if isinstance(v, int) else tuple(v)
    if len(out) != n:
        raise ValueError(f"{what} needs 1 or {n} entries, got {v!r}")
    return out


def _padding(v: int | Sequence[int], n: int) -> tuple[int, ...]:
    """An int, one entry per spatial dim (symmetric) or ``before..., after...``."""
    if isinstance(v, int):
        return (v,) * (2 * n)
    t = tuple(v)
    if len(t) == n:
        return t + t
    if len(t) == 2 * n:
        return t
    raise ValueError(f"padding needs 1, {n} or {2 * n} entries, got {v!r}")


def _conv(name: str, n: int, x: Expr, weight: Expr, bias: Expr | None, strides: int | Sequence[int], padding: int | Sequence[int], dilation: int | Sequence[int], groups: int) -> Call:
    args = [x, weight] if bias is None else [x, weight, bias]
    return make_call(name, args, strides=_per_dim(strides, n, "strides"), padding=_padding(padding, n), dilation=_per_dim(dilation, n, "dilation"), groups=groups)


def conv1d(x: Expr, weight: Expr, bias: Expr | None = None, strides: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1) -> Call:
    """1-D convolution (cross-correlation, like torch) of ``x: [N, C, L]`` with
    ``weight: [O, C // groups, K]``; ``padding`` is an int, ``(p,)`` or ``(before, after)``."""
    return _conv("conv1d", 1, x, weight, bias, strides, padding, dilation, groups)


def conv2d(x: Expr, weight: Expr, bias: Expr | None = None, strides: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1) -> Call:
    """2-D convolution of ``x: [N, C, H, W]`` with ``weight: [O, C // groups, KH, KW]``;
    ``padding`` is an int, ``(ph, pw)`` or ``(top, left, bottom, right)``."""
    return _conv("conv2d", 2, x, weight, bias, strides, padding, dilation, groups)


def conv_transpose(x: Expr, weight: Expr, bias: Expr | None = None, strides: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1, ndim: int = 2) -> Call:
    """Transposed convolution over ``ndim`` spatial dims of ``x: [N, C, *spatial]`` with
    ``weight: [C, O // groups, *kernel]``; ``padding`` crops the output (an int, one per dim,
    or befores then afters) and ``output_padding`` adds to its end."""
    args = [x, weight] if bias is None else [x, weight, bias]
    return make_call("conv_transpose", args, strides=_per_dim(strides, ndim, "strides"), padding=_padding(padding, ndim), output_padding=_per_dim(output_padding, ndim, "output_padding"), dilation=_per_dim(dilation, ndim, "dilation"), groups=groups)


def max_pool2d(x: Expr, pool_size: int | Sequence[int], strides: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, ceil_mode: bool = False) -> Call:
    """The maximum over each (dilated) window of ``x: [N, C, H, W]``; padding never wins.
    ``strides`` None is the pool size."""
    size = _per_dim(pool_size, 2, "pool_size")
    return make_call("max_pool2d", [x], pool_size=size, strides=size if strides is None else _per_dim(strides, 2, "strides"), padding=_padding(padding, 2), dilation=_per_dim(dilation, 2, "dilation"), ceil_mode=ceil_mode)


def max_pool2d_indices(x: Expr, pool_size: int | Sequence[int], strides: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, ceil_mode: bool = False) -> Call:
    """Where in its input plane each maximum ``max_pool2d`` takes lies (see the module
    docstring)."""
    size = _per_dim(pool_size, 2, "pool_size")
    return make_call("max_pool2d_indices", [x], pool_size=size, strides=size if strides is None else _per_dim(strides, 2, "strides"), padding=_padding(padding, 2), dilation=_per_dim(dilation, 2, "dilation"), ceil_mode=ceil_mode)


def avg_pool2d(x: Expr, pool_size: int | Sequence[int], strides: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0, ceil_mode: bool = False, count_include_pad: bool = True, dilation: int | Sequence[int] = 1) -> Call:
    """The mean over each (dilated) window of ``x: [N, C, H, W]`` (see the module docstring for
    the divisor). ``strides`` None is the pool size."""
    size = _per_dim(pool_size, 2, "pool_size")
    return make_call("avg_pool2d", [x], pool_size=size, strides=size if strides is None else _per_dim(strides, 2, "strides"), padding=_padding(padding, 2), ceil_mode=ceil_mode, count_include_pad=count_include_pad, dilation=_per_dim(dilation, 2, "dilation"))


def adaptive_avg_pool2d(x: Expr, output_size: int | Sequence[int]) -> Call:
    """``x: [N, C, H, W]`` averaged down to ``[N, C, *output_size]`` with windows that tile the
    input as evenly as possible."""
    return make_call("adaptive_avg_pool2d", [x], output_size=_per_dim(output_size, 2, "output_size"))


def adaptive_max_pool2d(x: Expr, output_size: int | Sequence[int]) -> Call:
    """The maximum over the windows ``adaptive_avg_pool2d`` averages."""
    return make_call("adaptive_max_pool2d", [x], output_size=_per_dim(output_size, 2, "output_size"))


__all__ = ["conv1d", "conv2d", "conv_transpose", "max_pool2d", "max_pool2d_indices", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d", "conv_out_len", "conv_transpose_out_len"]
