"""Elementwise math beyond the core set (``tilework.op.elementwise``): trigonometric and
hyperbolic functions, parameterized activations (``tan``, ``atan``, ``asinh``, ``softplus``,
``elu``, ``selu``, ``hard_swish``, ``shrink``, ``sign``, ...), ``log1p``, ``expm1``,
``log2``, ``exp2``, ``trunc``, ``isnan`` / ``isinf``, and the binaries ``fmod`` (C's truncating remainder),
``bitshift``, ``atan2`` and ``hypot`` (C's, special values included).

The unary ops take ONNX's attribute names and defaults (``alpha``, ``beta``, ``gamma``, ...).
Legalization computes in float32 for float16/bfloat16 (float64 for integer inputs of the ops
that accept them) and rounds once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilework import te
from tilework.ir.graph import Attrs, Call, Expr
from tilework.ir.info import StructInfo, TensorInfo
from tilework.ir.dtype import INT_DTYPES, is_float_dtype
from tilework.ir.loop import PExpr, Scalar
from tilework.op.base import (
    InferCtx,
    Op,
    OpPattern,
    broadcast_shapes,
    make_call,
    register,
    require_float,
    tensor_arg,
    unify_dtype,
)
from tilework.op.kernel import arg, bcast_index, compute_dtype, op_name, out_tensor, upcast

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

# -- unary math and activations ---------------------------------------------------------------


def _math(name: str, x: PExpr, a: Attrs) -> PExpr:
    """Op ``name`` of ``x`` (in its compute dtype) with the call's attributes ``a``."""
    alpha = float(a.get("alpha", 0.0))
    if name == "tan":
        return te.sin(x) / te.cos(x)
    if name == "atan":
        return te.atan(x)
    if name == "asin":
        return te.asin(x)
    if name == "acos":
        return te.acos(x)
    if name in ("sinh", "cosh"):
        e, m = te.exp(x), te.exp(-x)
        return (e - m) * 0.5 if name == "sinh" else (e + m) * 0.5
    if name == "asinh":
        ax = te.abs(x)
        r = te.log(ax + te.sqrt(ax * ax + 1.0))
        return te.if_then_else(te.lt(x, 0.0), -r, r)
    if name == "acosh":
        return te.log(x + te.sqrt(x * x - 1.0))
    if name == "atanh":
        return (te.log1p(x) - te.log1p(-x)) * 0.5
    if name == "log1p":
        return te.log1p(x)
    if name == "expm1":
        return te.expm1(x)
    if name == "log2":
        return te.log(x) * 1.4426950408889634
    if name == "exp2":
        return te.exp(x * 0.6931471805599453)
    if name == "trunc":
        return te.if_then_else(te.lt(x, 0.0), te.ceil(x), te.floor(x))
    if name == "softplus":
        ax = te.abs(x)
        return te.maximum(x, 0.0) + te.log1p(te.exp(-ax))
    if name == "softsign":
        return x / (te.abs(x) + 1.0)
    if name == "reciprocal":
        return 1.0 / x
    if name == "elu":
        return te.if_then_else(te.lt(x, 0.0), alpha * te.expm1(x), x)
    if name == "celu":
        return te.maximum(x, 0.0) + te.minimum(0.0, alpha * te.expm1(x / alpha))
    if name == "selu":
        gamma = float(a["gamma"])
        return gamma * te.if_then_else(te.le(x, 0.0), alpha * te.expm1(x), x)
    if name == "leaky_relu":
        return te.if_then_else(te.lt(x, 0.0), alpha * x, x)
    if name == "thresholded_relu":
        return te.if_then_else(te.gt(x, alpha), x, 0.0)
    if name == "hard_sigmoid":
        beta = float(a["beta"])
        return te.maximum(0.0, te.minimum(1.0, alpha * x + beta))
    if name == "hard_swish":
        return x * te.maximum(0.0, te.minimum(1.0, x * (1.0 / 6.0) + 0.5))
    if name == "mish":
        sp = te.maximum(x, 0.0) + te.log1p(te.exp(-te.abs(x)))
        return x * te.tanh(sp)
    if name == "shrink":
        bias, lambd = float(a["bias"]), float(a["lambd"])
        return te.if_then_else(te.lt(x, -lambd), x + bias, te.if_then_else(te.gt(x, lambd), x - bias, 0.0))
    raise ValueError(name)


_MATH = (
    "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "softplus",
    "softsign", "reciprocal", "elu", "celu", "selu", "leaky_relu", "thresholded_relu",
    "hard_sigmoid", "hard_swish", "mish", "shrink", "log1p", "expm1", "log2", "exp2", "trunc",
)  # fmt: skip
_MATH_ATTRS: dict[str, dict[str, object]] = {
    "elu": {"alpha": 1.0},
    "celu": {"alpha": 1.0},
    "selu": {"alpha": 1.6732632423543772, "gamma": 1.0507009873554805},
    "leaky_relu": {"alpha": 0.01},
    "thresholded_relu": {"alpha": 1.0},
    "hard_sigmoid": {"alpha": 0.2, "beta": 0.5},
    "shrink": {"bias": 0.0, "lambd": 0.5},
}
_ANY_DTYPE = ("reciprocal", "shrink", "sign", "leaky_relu", "thresholded_relu")


def _infer_math(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if ctx.op_name not in _ANY_DTYPE:
        require_float(x, ctx)
    if x.dtype == "bool":
        raise ctx.error("expects a numeric tensor, got bool")
    return x


def _legalize_math(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = op_name(call)
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype) if is_float_dtype(dtype) else "float64"
    attrs = call.attrs

    def f(*i: Scalar) -> Scalar:
        v = te.cast(x[i], acc)
        if name == "sign":
            return te.if_then_else(te.gt(v, 0.0), 1.0, te.if_then_else(te.lt(v, 0.0), -1.0, v))
        return _math(name, v, attrs)

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [x], [out], call.info)


for _name in (*_MATH, "sign"):
    register(Op(_name, _infer_math, OpPattern.ELEMWISE, attrs=_MATH_ATTRS.get(_name, {}), num_args=1, legalize=_legalize_math))


def math(name: str, x: Expr, **attrs: float) -> Call:
    """Elementwise ``name`` (one of ``tan asin acos atan sinh cosh asinh acosh atanh softplus
    softsign reciprocal elu celu selu leaky_relu thresholded_relu hard_sigmoid hard_swish mish
    shrink sign log1p expm1 log2 exp2 trunc``) with ONNX's attribute names and defaults
    (``alpha``, ``beta``, ...)."""
    return make_call(name, [x], {k: float(v) for k, v in attrs.items()})


# -- isnan / isinf -----------------------------------------------------------------------------


def _infer_isnan(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    require_float(x, ctx)
    return TensorInfo(x.shape, "bool", x.ndim)


def _legalize_isnan(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = op_name(call)
    x = arg(call, 0, "x")
    shape, _ = out_tensor(call)
    neg, pos = bool(call.attrs.get("detect_negative", True)), bool(call.attrs.get("detect_positive", True))

    def f(*i: Scalar) -> Scalar:
        v = upcast(x[i], x.dtype)
        if name == "isnan":
            return te.isnan(v)
        conds = [te.isinf(v)]
        if not neg:
            conds.append(te.gt(v, 0.0))
        if not pos:
            conds.append(te.lt(v, 0.0))
        return te.all(*conds)

    out = te.compute(shape, f, name, "bool")
    return ctx.call_te(name, call.args, [x], [out], call.info)


register(Op("isnan", _infer_isnan, OpPattern.ELEMWISE, num_args=1, legalize=_legalize_isnan))
register(Op("isinf", _infer_isnan, OpPattern.ELEMWISE, attrs={"detect_negative": True, "detect_positive": True}, num_args=1, legalize=_legalize_isnan))


def isnan(x: Expr) -> Call:
    """True where ``x`` is NaN."""
    return make_call("isnan", [x])


def isinf(x: Expr, detect_negative: bool = True, detect_positive: bool = True) -> Call:
    """True where ``x`` is an infinity of a detected sign."""
    return make_call("isinf", [x], detect_negative=detect_negative, detect_positive=detect_positive)


# -- fmod and bit shifts ---------------------------------------------------------------------


def _infer_int_binary(call: Call, ctx: InferCtx) -> StructInfo:
    a, b = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    dtype = unify_dtype([a.dtype, b.dtype], ctx)
    if dtype == "bool":
        raise ctx.error("expects numeric tensors, got bool")
    if ctx.op_name == "bitshift" and dtype is not None and dtype not in INT_DTYPES:
        raise ctx.error(f"expects integer tensors, got {dtype}")
    if a.shape is None or b.shape is None:
        return TensorInfo(None, dtype, -1 if -1 in (a.ndim, b.ndim) else max(a.ndim, b.ndim))
    return TensorInfo(broadcast_shapes(a.shape, b.shape, ctx), dtype)


def _legalize_int_binary(call: Call, ctx: "LegalizeCtx") -> Expr:
    """fmod: ``a - trunc(a / b) * b`` (the sign of ``a``; 0 for an integer ``b == 0``).
    bitshift: ``a * 2**b`` or ``a // 2**b`` (arithmetic) in int64, wrapped to the dtype; a
    shift outside ``[0, bits)`` leaves only the sign fill (-1 for a right shift of a negative
    ``a``, else 0)."""
    name = op_name(call)
    a, b = arg(call, 0, "a"), arg(call, 1, "b")
    shape, dtype = out_tensor(call)
    left = call.attrs.get("direction", "left") == "left"
    bits = {"int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int32": 32, "uint32": 32}.get(dtype, 64)

    def f(*i: Scalar) -> Scalar:
        va = upcast(a[bcast_index(i, a.shape, shape)], a.dtype)
        vb = upcast(b[bcast_index(i, b.shape, shape)], b.dtype)
        if name == "bitshift":
            wa, wb = te.cast(va, "int64"), te.cast(vb, "int64")
            # 2**63 is past int64: an int64 right shift by 63 is the sign fill, like larger ones
            inside = te.logical_and(te.ge(wb, 0), te.lt(wb, 63 if dtype == "int64" and not left else bits))
            p = te.cast(te.power(te.cast(2.0, "float64"), te.cast(te.if_then_else(inside, wb, 0), "float64")), "int64")
            r = wa * p if left else wa // p
            spill = 0 if left else te.if_then_else(te.lt(wa, 0), -1, 0)
            return te.if_then_else(inside, r, spill)
        if is_float_dtype(dtype):
            q = va / vb
            return va - te.if_then_else(te.lt(q, 0.0), te.ceil(q), te.floor(q)) * vb
        q = te.truncdiv(va, te.if_then_else(te.eq(vb, 0), 1, vb))
        return te.if_then_else(te.eq(vb, 0), 0, va - q * vb)

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [a, b], [out], call.info)


register(Op("fmod", _infer_int_binary, OpPattern.BROADCAST, num_args=2, legalize=_legalize_int_binary))
register(Op("bitshift", _infer_int_binary, OpPattern.BROADCAST, attrs={"direction": "left"}, num_args=2, legalize=_legalize_int_binary))


def fmod(a: Expr, b: Expr) -> Call:
    """C's ``fmod``: the remainder of truncating division, with the sign of ``a``."""
    return make_call("fmod", [a, b])


def bitshift(a: Expr, b: Expr, direction: str = "left") -> Call:
    """``a << b`` or ``a >> b`` (``direction`` ``"right"``) on integer tensors."""
    return make_call("bitshift", [a, b], direction=direction)


# -- atan2 and hypot ---------------------------------------------------------------------------


def _infer_float_binary(call: Call, ctx: InferCtx) -> StructInfo:
    a, b = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    dtype = unify_dtype([a.dtype, b.dtype], ctx)
    if dtype is not None and not is_float_dtype(dtype):
        raise ctx.error(f"expects floating-point tensors, got {dtype}")
    if a.shape is None or b.shape is None:
        return TensorInfo(None, dtype, -1 if -1 in (a.ndim, b.ndim) else max(a.ndim, b.ndim))
    return TensorInfo(broadcast_shapes(a.shape, b.shape, ctx), dtype)


def _signbit(v: PExpr) -> PExpr:
    """True for a negative ``v``, ``-0.0`` included (``1 / -0.0`` is ``-inf``)."""
    return te.logical_or(te.lt(v, 0.0), te.logical_and(te.eq(v, 0.0), te.lt(1.0 / v, 0.0)))


def _atan2(y: PExpr, x: PExpr) -> PExpr:
    """C's ``atan2(y, x)`` from ``atan(y / x)``: ``+-pi`` added where ``x`` is negative (or
    ``-0``); the two cases where ``y / x`` is NaN without a NaN operand (both zero, both
    infinite) by their limits (``y`` or ``+-pi``; ``+-pi/4`` or ``+-3pi/4``), signed as ``y``."""
    neg_x = _signbit(x)
    pi = te.constant(3.141592653589793, x.dtype)  # in the compute dtype (a bare float is float32)
    pi_y = te.if_then_else(_signbit(y), -pi, pi)
    q = te.atan(y / x)
    general = te.if_then_else(neg_x, q + pi_y, q)
    zeros = te.if_then_else(neg_x, pi_y, y)
    infs = te.if_then_else(neg_x, pi_y * 0.75, pi_y * 0.25)
    both_inf = te.logical_and(te.isinf(x), te.isinf(y))
    both_zero = te.logical_and(te.eq(x, 0.0), te.eq(y, 0.0))
    return te.if_then_else(both_zero, zeros, te.if_then_else(both_inf, infs, general))


def _hypot(a: PExpr, b: PExpr) -> PExpr:
    """C's ``hypot``: ``m * sqrt(1 + (n / m)^2)`` with ``m >= n`` the magnitudes (no overflow
    or underflow of the squares); an infinite operand gives ``inf`` even beside a NaN, a
    NaN otherwise gives NaN, two zeros 0."""
    aa, ab = te.abs(a), te.abs(b)
    big_a = te.gt(aa, ab)
    m = te.if_then_else(big_a, aa, ab)  # NaN when b is NaN or (a is NaN: the test is false)
    n = te.if_then_else(big_a, ab, aa)
    r = n / te.if_then_else(te.eq(m, 0.0), 1.0, m)
    scaled = m * te.sqrt(r * r + 1.0)
    return te.if_then_else(te.logical_or(te.isinf(aa), te.isinf(ab)), te.max_value(a.dtype), scaled)


def _legalize_float_binary(call: Call, ctx: "LegalizeCtx") -> Expr:
    """Computed in float64 for float32 inputs and float32 for 16-bit ones, rounded once."""
    name = op_name(call)
    a, b = arg(call, 0, "a"), arg(call, 1, "b")
    shape, dtype = out_tensor(call)
    acc = "float64" if dtype == "float32" else compute_dtype(dtype)

    def f(*i: Scalar) -> Scalar:
        va = te.cast(a[bcast_index(i, a.shape, shape)], acc)
        vb = te.cast(b[bcast_index(i, b.shape, shape)], acc)
        return _atan2(va, vb) if name == "atan2" else _hypot(va, vb)

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [a, b], [out], call.info)


register(Op("atan2", _infer_float_binary, OpPattern.BROADCAST, num_args=2, legalize=_legalize_float_binary))
register(Op("hypot", _infer_float_binary, OpPattern.BROADCAST, num_args=2, legalize=_legalize_float_binary))


def atan2(y: Expr, x: Expr) -> Call:
    """The angle of the point ``(x, y)`` in ``[-pi, pi]``, C's ``atan2(y, x)`` (signed zeros
    and infinities included)."""
    return make_call("atan2", [y, x])


def hypot(a: Expr, b: Expr) -> Call:
    """``sqrt(a^2 + b^2)`` without overflow or underflow of the squares (C's ``hypot``)."""
    return make_call("hypot", [a, b])
