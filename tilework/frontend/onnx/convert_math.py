"""Converters of elementwise ONNX ops: unary math and activations, binary arithmetic,
comparisons and logic, the variadic ``Max``/``Min``/``Sum``/``Mean``, ``Where``, ``Clip``,
``Cast``/``CastLike`` and ``Identity``.

Operands whose contents are tracked symbolically (shape arithmetic) are folded instead of
emitted: ``Mul(Gather(Shape(x), 1), 64)`` is the dim ``s * 64``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.registry import Result, converter
from tilework.frontend.onnx.values import Value, binary_elems, where_elems
from tilework.ir.dtype import INT_DTYPES, LOWP_FLOAT_DTYPES, SUBBYTE_INT_DTYPES, int_range, is_lowp_dtype, max_finite, np_dtype
from tilework.ir.graph import Constant, Expr
from tilework.op import bitwise
from tilework.op import elementwise as ew
from tilework.op import math as op_math

# -- helpers -------------------------------------------------------------------------------------


def scalar_const(value: float | int | bool, dtype: str) -> Constant:
    """A 0-d constant of ``dtype``."""
    return Constant.of(np.asarray(value, dtype=np_dtype(dtype)))


def cast_to(ctx: NodeCtx, e: Expr, dtype: str) -> Expr:
    """``e`` converted to ``dtype`` (no binding when it already has it)."""
    if getattr(e.info, "dtype", None) == dtype:
        return e
    return ctx.emit(ew.astype(e, dtype))


def _fold(kind: str, ctx: NodeCtx, values: list[Value], dtype: str | None) -> Value | None:
    """``values[0] KIND values[1] ...`` on tracked contents (ranks 0 and 1), or None."""
    if not kind or any(v.elems is None or v.ndim not in (0, 1) for v in values):
        return None
    acc = values[0].elems
    for v in values[1:]:
        assert acc is not None and v.elems is not None
        acc = binary_elems(kind, acc, v.elems)
        if acc is None:
            return None
    assert acc is not None
    scalar = all(v.ndim == 0 for v in values)
    return Value.of_elems(acc, dtype or values[0].info.dtype or "int64", scalar)


# -- unary ---------------------------------------------------------------------------------------

_UNARY: dict[str, tuple[str, int, int]] = {
    "Abs": ("abs", 6, 13), "Neg": ("neg", 6, 13), "Exp": ("exp", 6, 13), "Log": ("log", 6, 13),
    "Sqrt": ("sqrt", 6, 13), "Tanh": ("tanh", 6, 13), "Sigmoid": ("sigmoid", 6, 13),
    "Relu": ("relu", 6, 14), "Erf": ("erf", 9, 13), "Sin": ("sin", 7, 22), "Cos": ("cos", 7, 22),
    "Floor": ("floor", 6, 13), "Ceil": ("ceil", 6, 13), "Round": ("round", 11, 22),
    "Not": ("logical_not", 1, 1),
}  # fmt: skip

_MISC_UNARY: dict[str, tuple[str, int, int, tuple[str, ...]]] = {
    "Tan": ("tan", 7, 22, ()), "Asin": ("asin", 7, 22, ()), "Acos": ("acos", 7, 22, ()),
    "Atan": ("atan", 7, 22, ()), "Sinh": ("sinh", 9, 22, ()), "Cosh": ("cosh", 9, 22, ()),
    "Asinh": ("asinh", 9, 22, ()), "Acosh": ("acosh", 9, 22, ()), "Atanh": ("atanh", 9, 22, ()),
    "Softplus": ("softplus", 1, 22, ()), "Softsign": ("softsign", 1, 22, ()),
    "Reciprocal": ("reciprocal", 6, 13, ()), "Sign": ("sign", 9, 13, ()),
    "Elu": ("elu", 6, 22, ("alpha",)), "Celu": ("celu", 12, 28, ("alpha",)),
    "Selu": ("selu", 6, 22, ("alpha", "gamma")), "LeakyRelu": ("leaky_relu", 6, 16, ("alpha",)),
    "ThresholdedRelu": ("thresholded_relu", 10, 22, ("alpha",)),
    "HardSigmoid": ("hard_sigmoid", 6, 22, ("alpha", "beta")), "HardSwish": ("hard_swish", 14, 22, ()),
    "Mish": ("mish", 18, 22, ()), "Shrink": ("shrink", 9, 9, ("bias", "lambd")),
}  # fmt: skip


def _unary(name: str) -> Callable[[NodeCtx], Result]:
    def conv(ctx: NodeCtx) -> Result:
        v = ctx.value(0)
        if name == "logical_not" and v.elems is not None and all(isinstance(e, bool) for e in v.elems):
            return Value.of_elems(tuple(not e for e in v.elems), "bool", v.ndim == 0)
        if name == "neg" and v.elems is not None and v.ndim in (0, 1):
            folded = _fold("sub", ctx, [Value.of_elems((0,) * len(v.elems), v.dtype or "int64", v.ndim == 0), v], v.dtype)
            if folded is not None:
                return folded
        return ctx.emit(ew.unary(name, ctx.expr(0)))

    return conv


def _math_unary(name: str, attr_names: tuple[str, ...]) -> Callable[[NodeCtx], Result]:
    def conv(ctx: NodeCtx) -> Result:
        attrs = {a: float(ctx.attr(a)) for a in attr_names if ctx.has_attr(a)}
        return ctx.emit(op_math.math(name, ctx.expr(0), **attrs))

    return conv


for _onnx, (_name, _lo, _hi) in _UNARY.items():
    converter(_onnx, _lo, _hi)(_unary(_name))
for _onnx, (_name, _lo, _hi, _attrs) in _MISC_UNARY.items():
    converter(_onnx, _lo, _hi)(_math_unary(_name, _attrs))


@converter("IsNaN", 9, 20)
def _isnan(ctx: NodeCtx) -> Result:
    return ctx.emit(op_math.isnan(ctx.expr(0)))


@converter("IsInf", 10, 20)
def _isinf(ctx: NodeCtx) -> Result:
    neg, pos = bool(ctx.attr("detect_negative", 1)), bool(ctx.attr("detect_positive", 1))
    return ctx.emit(op_math.isinf(ctx.expr(0), neg, pos))


@converter("Gelu", 20, 20)
def _gelu(ctx: NodeCtx) -> Result:
    approx = ctx.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        raise ctx.unsupported(f"approximate={approx!r} (expected 'none' or 'tanh')")
    return ctx.emit(ew.gelu_tanh(ctx.expr(0)) if approx == "tanh" else ew.gelu(ctx.expr(0)))


@converter("Swish", 24, 24)
def _swish(ctx: NodeCtx) -> Result:
    alpha = float(ctx.attr("alpha", 1.0))
    x = ctx.expr(0)
    if alpha == 1.0:
        return ctx.emit(ew.silu(x))
    scaled = ctx.emit(ew.multiply(x, scalar_const(alpha, ctx.dtype(0))))
    return ctx.emit(ew.multiply(x, ctx.emit(ew.sigmoid(scaled))))


@converter("PRelu", 7, 16)
def _prelu(ctx: NodeCtx) -> Result:
    x, slope = ctx.expr(0), ctx.expr(1)
    neg = ctx.emit(ew.less(x, scalar_const(0, ctx.dtype(0))))
    return ctx.emit(ew.where(neg, ctx.emit(ew.multiply(x, slope)), x))


@converter("Identity", 1, 25)
def _identity(ctx: NodeCtx) -> Result:
    return ctx.any_value(0)  # sequences and optionals too


# -- binary ---------------------------------------------------------------------------------------

_BINARY: dict[str, tuple[str, str, int, int]] = {
    "Add": ("add", "add", 7, 14), "Sub": ("subtract", "sub", 7, 14),
    "Mul": ("multiply", "mul", 7, 14), "Div": ("divide", "div", 7, 14),
    "Equal": ("equal", "eq", 7, 19), "Less": ("less", "lt", 7, 13),
    "Greater": ("greater", "gt", 7, 13), "LessOrEqual": ("less_equal", "le", 12, 16),
    "GreaterOrEqual": ("greater_equal", "ge", 12, 16), "And": ("logical_and", "and", 7, 7),
    "Or": ("logical_or", "or", 7, 7), "Xor": ("logical_xor", "xor", 7, 7),
}  # fmt: skip
_COMPARE = ("eq", "lt", "gt", "le", "ge", "and", "or", "xor")


def _binary(name: str, kind: str) -> Callable[[NodeCtx], Result]:
    def conv(ctx: NodeCtx) -> Result:
        a, b = ctx.value(0), ctx.value(1)
        folded = _fold(kind, ctx, [a, b], "bool" if kind in _COMPARE else a.dtype)
        if folded is not None:
            return folded
        return ctx.emit(ew.binary(name, ctx.expr(0), ctx.expr(1)))

    return conv


for _onnx, (_name, _kind, _lo, _hi) in _BINARY.items():
    converter(_onnx, _lo, _hi)(_binary(_name, _kind))


@converter("Pow", 7, 15)
def _pow(ctx: NodeCtx) -> Result:
    """The exponent may have another dtype than the base: it is cast to the base's."""
    base = ctx.expr(0)
    return ctx.emit(ew.power(base, cast_to(ctx, ctx.expr(1), ctx.dtype(0))))


@converter("Mod", 10, 28)
def _mod(ctx: NodeCtx) -> Result:
    a, b = ctx.value(0), ctx.value(1)
    if int(ctx.attr("fmod", 0)):
        return ctx.emit(op_math.fmod(ctx.expr(0), ctx.expr(1)))
    folded = _fold("mod", ctx, [a, b], a.dtype)
    if folded is not None:
        return folded
    return ctx.emit(ew.mod(ctx.expr(0), ctx.expr(1)))


@converter("BitShift", 11, 28)
def _bitshift(ctx: NodeCtx) -> Result:
    direction = ctx.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.unsupported(f"direction={direction!r}")
    return ctx.emit(op_math.bitshift(ctx.expr(0), ctx.expr(1), direction.lower()))


_VARIADIC: dict[str, tuple[str, str]] = {"Max": ("maximum", "max"), "Min": ("minimum", "min"), "Sum": ("add", "add"), "Mean": ("add", "")}


def _variadic(onnx_name: str) -> Callable[[NodeCtx], Result]:
    name, kind = _VARIADIC[onnx_name]

    def conv(ctx: NodeCtx) -> Result:
        values = [ctx.value(i) for i in range(ctx.num_inputs)]
        folded = _fold(kind, ctx, values, values[0].dtype)
        if folded is not None:
            return folded
        acc = ctx.expr(0)
        for i in range(1, ctx.num_inputs):
            acc = ctx.emit(ew.binary(name, acc, ctx.expr(i)))
        if onnx_name == "Mean" and ctx.num_inputs > 1:
            acc = ctx.emit(ew.divide(acc, scalar_const(ctx.num_inputs, ctx.dtype(0))))
        return acc if ctx.num_inputs > 1 else ctx.value(0)

    return conv


for _onnx in _VARIADIC:
    converter(_onnx, 8, 13)(_variadic(_onnx))


@converter("Where", 9, 16)
def _where(ctx: NodeCtx) -> Result:
    c, a, b = ctx.value(0), ctx.value(1), ctx.value(2)
    if c.elems is not None and a.elems is not None and b.elems is not None and all(v.ndim in (0, 1) for v in (c, a, b)):
        out = where_elems(c.elems, a.elems, b.elems)
        if out is not None:
            return Value.of_elems(out, a.dtype or "int64", all(v.ndim == 0 for v in (c, a, b)))
    return ctx.emit(ew.where(ctx.expr(0), ctx.expr(1), ctx.expr(2)))


@converter("Clip", 6, 13)
def _clip(ctx: NodeCtx) -> Result:
    """``min(max(x, lo), hi)``; bounds are attributes before opset 11, optional inputs after."""
    x = ctx.expr(0)
    dtype = ctx.dtype(0)
    lo: Expr | None
    hi: Expr | None
    if ctx.version < 11:
        lo = scalar_const(float(ctx.attr("min")), dtype) if ctx.has_attr("min") else None
        hi = scalar_const(float(ctx.attr("max")), dtype) if ctx.has_attr("max") else None
    else:
        lo = ctx.expr(1) if ctx.has_input(1) else None
        hi = ctx.expr(2) if ctx.has_input(2) else None
    if lo is not None:
        x = ctx.emit(ew.maximum(x, lo))
    if hi is not None:
        x = ctx.emit(ew.minimum(x, hi))
    return x if x is not ctx.value(0).expr else ctx.value(0)


FLOAT8_DTYPES = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")  # what ``saturate`` acts on
_WIDE_INTS = tuple(d for d in INT_DTYPES if d not in SUBBYTE_INT_DTYPES)


def saturate(ctx: NodeCtx, x: Expr, to: str) -> Expr:
    """``x`` clamped to +-the largest finite value of float8 dtype ``to`` (NaN stays NaN, inf
    becomes that value): converting the result is ONNX's ``saturate=1`` conversion, since a value
    within range never rounds past it. Unchanged when ``x``'s dtype cannot exceed the range."""
    src = getattr(x.info, "dtype", None)
    top = max_finite(to)
    if src is None or src == "bool" or (src in INT_DTYPES and max(-int_range(src)[0], int_range(src)[1]) <= top):
        return x
    if src in LOWP_FLOAT_DTYPES:  # in float32 (exact): the bound may not be a value of src
        x, src = cast_to(ctx, x, "float32"), "float32"
    x = ctx.emit(ew.maximum(x, scalar_const(-top, src)))
    return ctx.emit(ew.minimum(x, scalar_const(top, src)))


def lowp_cast(ctx: NodeCtx, x: Expr, to: str, sat: bool) -> Expr:
    """``x`` converted to low-precision ``to`` as ONNX ``Cast(saturate=sat)`` does (``saturate``
    concerns the float8 types; float4 has no inf or NaN and always saturates)."""
    if to in FLOAT8_DTYPES and sat:
        x = saturate(ctx, x, to)
    return cast_to(ctx, x, to)


def to_e8m0(ctx: NodeCtx, x: Expr, round_mode: str, sat: bool) -> Expr:
    """``x`` converted to float8_e8m0fnu as ONNX does it, on the bits of its float32 value: the
    exponent field, plus one when ``round_mode`` rounds the mantissa up (``up``: any mantissa
    bit; ``nearest``: the top one, with more below it or a normal value; ``down``: never); NaN
    and inf stay 0xff (NaN); saturating, 0xfe is not rounded up into NaN. (``astype`` alone
    is the ``up``, saturating case.)"""
    if round_mode not in ("up", "down", "nearest"):
        raise ctx.unsupported(f"round_mode {round_mode!r} (expected 'up', 'down' or 'nearest')")

    def bits(mask: int) -> Expr:
        return ctx.emit(ew.not_equal(ctx.emit(bitwise.bitwise_and(u, scalar_const(mask, "uint32"))), scalar_const(0, "uint32")))

    u = ctx.emit(bitwise.bitcast(cast_to(ctx, x, "float32"), "uint32"))
    e = ctx.emit(op_math.bitshift(u, scalar_const(23, "uint32"), "right"))
    e = ctx.emit(bitwise.bitwise_and(e, scalar_const(0xFF, "uint32")))
    if round_mode != "down":
        inc = bits(0x7FFFFF)
        if round_mode == "nearest":
            normal = ctx.emit(ew.greater(e, scalar_const(0, "uint32")))
            inc = ctx.emit(ew.logical_and(bits(0x400000), ctx.emit(ew.logical_or(bits(0x3FFFFF), normal))))
        for stop in (0xFF, 0xFE) if sat else (0xFF,):
            inc = ctx.emit(ew.logical_and(inc, ctx.emit(ew.not_equal(e, scalar_const(stop, "uint32")))))
        e = ctx.emit(ew.add(e, ctx.emit(ew.astype(inc, "uint32"))))
    return ctx.emit(bitwise.bitcast(ctx.emit(ew.astype(e, "uint8")), "float8_e8m0fnu"))


def _cast(ctx: NodeCtx, to: str) -> Result:
    v = ctx.value(0)
    if v.dtype == to:
        return v
    mode, sat = str(ctx.attr("round_mode", "up")), bool(int(ctx.attr("saturate", 1)))
    if to == "float8_e8m0fnu" and (mode != "up" or not sat):
        return to_e8m0(ctx, ctx.expr(0), mode, sat)
    if is_lowp_dtype(to):
        return lowp_cast(ctx, ctx.expr(0), to, sat)
    if v.elems is not None and to in _WIDE_INTS and v.dtype in _WIDE_INTS and v.ndim in (0, 1):
        return Value.of_elems(v.elems, to, v.ndim == 0)
    if v.const is not None and v.const.size <= 64 and v.dtype in _WIDE_INTS + ("bool",) and to in _WIDE_INTS + ("bool", "float32", "float64"):
        return Value.of_const(v.const.astype(np.bool_ if to == "bool" else to))
    return ctx.emit(ew.astype(ctx.expr(0), to))


@converter("Cast", 6, 28)
def _cast_op(ctx: NodeCtx) -> Result:
    return _cast(ctx, ctx.dtype_attr("to"))


@converter("CastLike", 15, 25)
def _cast_like(ctx: NodeCtx) -> Result:
    return _cast(ctx, ctx.dtype(1))
