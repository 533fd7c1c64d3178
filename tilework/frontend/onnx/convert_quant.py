"""Converters of the linear quantization ops over integer types: ``QuantizeLinear``,
``DequantizeLinear`` (per tensor, per axis and blocked), ``DynamicQuantizeLinear``,
``QLinearMatMul``, ``QLinearConv``, ``MatMulInteger`` and ``ConvInteger``.

All are compositions of graph ops: ``dequantize(q) = (q - zero_point) * scale`` and
``quantize(x) = saturate(round_half_even(x / scale) + zero_point)``. The integer products
accumulate exactly (int32 for ``MatMulInteger``; float64, exact for these magnitudes, for the
convolutions), then are rescaled in float64 as the ONNX reference does. The 2- and 4-bit
integers quantize like the others (saturating to their range). To the float8 types,
``quantize(x) = convert(x / scale)``, saturating unless ``saturate=0`` (the zero point must be 0
and is not added); to float4, ``convert(x / scale + zero_point)``; dequantizing either ignores
the zero point, as the ONNX reference does.
"""

from __future__ import annotations

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_math import FLOAT8_DTYPES, lowp_cast, scalar_const
from tilework.frontend.onnx.convert_nn import _pads
from tilework.frontend.onnx.registry import Result, converter
from tilework.ir import sym
from tilework.ir.dtype import is_float_dtype, is_int_dtype
from tilework.ir.graph import Expr
from tilework.ir.info import TensorInfo
from tilework.ir.sym import Dim
from tilework.op import conv, linalg, manipulate, reduce
from tilework.op import elementwise as ew
from tilework.te.tensor import int_range


_QUANT_FLOATS = FLOAT8_DTYPES + ("float4_e2m1fn",)


def _along(ctx: NodeCtx, p: Expr, rank: int, axis: int, block: int, dims: tuple[Dim, ...]) -> Expr:
    """A scale or zero point shaped to broadcast against a tensor of ``dims``: as is when 0-d,
    a 1-D one placed on ``axis``, a blocked one (same rank) repeated ``block`` times on it."""
    shape = ctx.shape_of(p)
    if len(shape) == 0 or (len(shape) == 1 and shape[0] == 1 and not block):
        return p if len(shape) == 0 else ctx.emit(manipulate.reshape(p, ()))
    if not block:
        if len(shape) != 1:
            raise ctx.unsupported(f"a scale or zero point of shape {shape} without block_size")
        return ctx.emit(manipulate.reshape(p, tuple(shape[0] if k == axis else 1 for k in range(rank))))
    if len(shape) != rank:
        raise ctx.unsupported(f"a blocked scale or zero point must have the input's rank {rank}, got shape {shape}")
    grown = ctx.emit(manipulate.expand_dims(p, axis + 1))
    target = tuple(shape[:axis + 1]) + (block,) + tuple(shape[axis + 1 :])
    grown = ctx.emit(manipulate.broadcast_to(grown, target))
    flat = tuple(shape[:axis]) + (sym.mul(shape[axis], block),) + tuple(shape[axis + 1 :])
    grown = ctx.emit(manipulate.reshape(grown, flat))
    return ctx.emit(manipulate.strided_slice(grown, (axis,), (0,), (dims[axis],)))


def _axis(ctx: NodeCtx, rank: int) -> int:
    a = int(ctx.attr("axis", 1))
    return a + rank if a < 0 else a


def _saturate(ctx: NodeCtx, x: Expr, dtype: str) -> Expr:
    """``x`` (float64) clamped to ``dtype``'s range and cast to it."""
    lo, hi = int_range(dtype)
    x = ctx.emit(ew.maximum(x, scalar_const(float(lo), "float64")))
    x = ctx.emit(ew.minimum(x, scalar_const(float(hi), "float64")))
    return ctx.emit(ew.astype(x, dtype))


def quantize(ctx: NodeCtx, x: Expr, scale: Expr, zp: Expr | None, dtype: str) -> Expr:
    """``saturate(round(x / scale) + zp)`` (scale and zp already broadcastable); the division
    runs in ``x``'s float dtype as the ONNX reference's does, the rest in float64."""
    dt = x.info.dtype if isinstance(x.info, TensorInfo) and x.info.dtype in ("float32", "float64") else "float32"
    q = ctx.emit(ew.divide(ctx.emit(ew.astype(x, dt)), ctx.emit(ew.astype(scale, dt))))
    if is_float_dtype(dtype):
        if dtype == "float4_e2m1fn" and zp is not None:
            q = ctx.emit(ew.add(q, ctx.emit(ew.astype(zp, dt))))
        return lowp_cast(ctx, q, dtype, bool(int(ctx.attr("saturate", 1))))
    y = ctx.emit(ew.astype(ctx.emit(ew.round(q)), "float64"))
    if zp is not None:
        y = ctx.emit(ew.add(y, ctx.emit(ew.astype(zp, "float64"))))
    return _saturate(ctx, y, dtype)


@converter("DequantizeLinear", 10, 28)
def _dequantize(ctx: NodeCtx) -> Result:
    x, dims = ctx.expr(0), ctx.known_shape(0)
    if not is_int_dtype(ctx.dtype(0)) and ctx.dtype(0) not in _QUANT_FLOATS:
        raise ctx.unsupported(f"dequantizing {ctx.dtype(0)} (integer, float8 and float4 types are supported)")
    rank, block = len(dims), int(ctx.attr("block_size", 0))
    axis = _axis(ctx, rank)
    out = ctx.dtype_attr("output_dtype") if ctx.has_attr("output_dtype") and int(ctx.attr("output_dtype")) else ctx.dtype(1)
    scale = _along(ctx, ctx.expr(1), rank, axis, block, dims)
    v = ctx.emit(ew.astype(x, "float32"))
    if ctx.has_input(2) and ctx.dtype(0) not in _QUANT_FLOATS:
        zp = _along(ctx, ctx.expr(2), rank, axis, block, dims)
        v = ctx.emit(ew.subtract(v, ctx.emit(ew.astype(zp, "float32"))))
    y = ctx.emit(ew.multiply(v, ctx.emit(ew.astype(scale, "float32"))))
    return ctx.emit(ew.astype(y, out)) if out != "float32" else y


@converter("QuantizeLinear", 10, 28)
def _quantize(ctx: NodeCtx) -> Result:
    x, dims = ctx.expr(0), ctx.known_shape(0)
    rank, block = len(dims), int(ctx.attr("block_size", 0))
    axis = _axis(ctx, rank)
    if ctx.has_input(2):
        dtype = ctx.dtype(2)
    elif ctx.has_attr("output_dtype") and int(ctx.attr("output_dtype")):
        dtype = ctx.dtype_attr("output_dtype")
    else:
        dtype = "uint8"
    if not is_int_dtype(dtype) and dtype not in _QUANT_FLOATS:
        raise ctx.unsupported(f"quantizing to {dtype} (integer, float8 and float4 types are supported)")
    scale = _along(ctx, ctx.expr(1), rank, axis, block, dims)
    zp = _along(ctx, ctx.expr(2), rank, axis, block, dims) if ctx.has_input(2) else None
    return quantize(ctx, x, scale, zp, dtype)


@converter("DynamicQuantizeLinear", 11, 28)
def _dynamic_quantize(ctx: NodeCtx) -> Result:
    """In float32 throughout, as the ONNX reference computes it."""
    x = ctx.emit(ew.astype(ctx.expr(0), "float32"))
    zero = scalar_const(0.0, "float32")
    lo = ctx.emit(ew.minimum(ctx.emit(reduce.min(x)), zero))
    hi = ctx.emit(ew.maximum(ctx.emit(reduce.max(x)), zero))
    scale = ctx.emit(ew.divide(ctx.emit(ew.subtract(hi, lo)), scalar_const(255.0, "float32")))
    zp_real = ctx.emit(ew.subtract(zero, ctx.emit(ew.divide(lo, scale))))
    zp = _saturate(ctx, ctx.emit(ew.astype(ctx.emit(ew.round(zp_real)), "float64")), "uint8")
    return [quantize(ctx, x, scale, zp, "uint8"), scale, zp]


def _scalar_param(ctx: NodeCtx, i: int) -> Expr:
    shape = ctx.known_shape(i)
    if any(d != 1 for d in shape):
        raise ctx.unsupported(f"operand {i} must be a single value (per-tensor quantization), got shape {shape}")
    e = ctx.expr(i)
    return e if not shape else ctx.emit(manipulate.reshape(e, ()))


def _centered(ctx: NodeCtx, q: int, zp: int | None, dtype: str) -> Expr:
    v = ctx.emit(ew.astype(ctx.expr(q), dtype))
    if zp is None or not ctx.has_input(zp):
        return v
    z = ctx.expr(zp)
    zshape = ctx.shape_of(z)
    if len(zshape) == 1 and zshape[0] != 1:  # per row of a, or per column of b
        z = ctx.emit(manipulate.reshape(z, (zshape[0], 1) if q == 0 else (zshape[0],)))
    elif zshape:
        z = ctx.emit(manipulate.reshape(z, ()))
    return ctx.emit(ew.subtract(v, ctx.emit(ew.astype(z, dtype))))


@converter("MatMulInteger", 10, 28)
def _matmul_integer(ctx: NodeCtx) -> Result:
    a = _centered(ctx, 0, 2, "int32")
    b = _centered(ctx, 1, 3, "int32")
    return ctx.emit(linalg.matmul(a, b))


@converter("QLinearMatMul", 10, 28)
def _qlinear_matmul(ctx: NodeCtx) -> Result:
    a = ctx.emit(ew.subtract(ctx.emit(ew.astype(ctx.expr(0), "float64")), ctx.emit(ew.astype(_scalar_param(ctx, 2), "float64"))))
    b = ctx.emit(ew.subtract(ctx.emit(ew.astype(ctx.expr(3), "float64")), ctx.emit(ew.astype(_scalar_param(ctx, 5), "float64"))))
    acc = ctx.emit(linalg.matmul(a, b))
    a_s, b_s, y_s = (_scalar_param(ctx, i) for i in (1, 4, 6))
    factor = ctx.emit(ew.divide(ctx.emit(ew.multiply(a_s, b_s)), y_s))
    y = ctx.emit(ew.round(ctx.emit(ew.multiply(acc, ctx.emit(ew.astype(factor, "float64"))))))
    y = ctx.emit(ew.add(y, ctx.emit(ew.astype(_scalar_param(ctx, 7), "float64"))))
    return _saturate(ctx, y, ctx.dtype(7))


def _conv_f64(ctx: NodeCtx, x: Expr, w: Expr, bias: Expr | None) -> Expr:
    shape, wshape = ctx.known_shape(0), ctx.known_shape(1 if ctx.op_type == "ConvInteger" else 3)
    n = len(shape) - 2
    if n not in (1, 2):
        raise ctx.unsupported(f"{n}-D convolution (1-D and 2-D are supported)")
    kernel = tuple(int(k) for k in ctx.attr("kernel_shape", wshape[2:]))
    strides = tuple(int(s) for s in ctx.attr("strides", (1,) * n))
    dil = tuple(int(d) for d in ctx.attr("dilations", (1,) * n))
    pads = _pads(ctx, shape[2:], kernel, strides, dil)
    fn = conv.conv1d if n == 1 else conv.conv2d
    return ctx.emit(fn(x, w, bias, strides, pads, dil, int(ctx.attr("group", 1))))


def _zp_center(ctx: NodeCtx, q: int, zp: int, channel_axis_of_weight: bool) -> Expr:
    v = ctx.emit(ew.astype(ctx.expr(q), "float64"))
    if not ctx.has_input(zp):
        return v
    z = ctx.emit(ew.astype(ctx.expr(zp), "float64"))
    zshape = ctx.shape_of(z)
    rank = len(ctx.known_shape(q))
    if len(zshape) == 1 and zshape[0] != 1 and channel_axis_of_weight:
        z = ctx.emit(manipulate.reshape(z, (zshape[0],) + (1,) * (rank - 1)))
    elif zshape:
        z = ctx.emit(manipulate.reshape(z, ()))
    return ctx.emit(ew.subtract(v, z))


@converter("ConvInteger", 10, 28)
def _conv_integer(ctx: NodeCtx) -> Result:
    if ctx.has_input(2) and any(d != 1 for d in ctx.known_shape(2)):
        raise ctx.unsupported("a per-channel input zero point")
    x = _zp_center(ctx, 0, 2, False)
    w = _zp_center(ctx, 1, 3, True)
    return ctx.emit(ew.astype(_conv_f64(ctx, x, w, None), "int32"))


@converter("QLinearConv", 10, 28)
def _qlinear_conv(ctx: NodeCtx) -> Result:
    x = ctx.emit(ew.subtract(ctx.emit(ew.astype(ctx.expr(0), "float64")), ctx.emit(ew.astype(_scalar_param(ctx, 2), "float64"))))
    w = _zp_center(ctx, 3, 5, True)
    bias = ctx.emit(ew.astype(ctx.expr(8), "float64")) if ctx.has_input(8) else None
    acc = _conv_f64(ctx, x, w, bias)
    x_s, y_s = (ctx.emit(ew.astype(_scalar_param(ctx, i), "float32")) for i in (1, 6))
    w_s = ctx.emit(ew.astype(ctx.expr(4), "float32"))
    wshape = ctx.shape_of(w_s)
    if len(wshape) == 1 and wshape[0] != 1:
        w_s = ctx.emit(manipulate.reshape(w_s, (wshape[0],) + (1,) * (len(ctx.known_shape(0)) - 2)))
    elif wshape:
        w_s = ctx.emit(manipulate.reshape(w_s, ()))
    factor = ctx.emit(ew.astype(ctx.emit(ew.divide(ctx.emit(ew.multiply(x_s, w_s)), y_s)), "float64"))
    y = ctx.emit(ew.round(ctx.emit(ew.multiply(acc, factor))))
    y = ctx.emit(ew.add(y, ctx.emit(ew.astype(_scalar_param(ctx, 7), "float64"))))
    return _saturate(ctx, y, ctx.dtype(7))


__all__ = ["quantize"]
