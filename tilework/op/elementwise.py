"""Elementwise ops: unary math and activations, binary arithmetic with NumPy broadcasting,
comparisons and logical ops, ``where`` and ``astype``.

Broadcasting is symbolic: ``(2, 3) + (2, n)`` is ``(2, 3)`` with a run-time check that ``n`` is
1 or 3; ``(n,) + (m,)`` is ``(max(n, m),)`` with the check that they broadcast.

Legalization computes float16/bfloat16 in float32 and rounds once; a kernel broadcasting a
dim that may be 1 or the full size indexes it with ``min(i, d - 1)``, right for both. Integer
``divide`` truncates toward zero (C and ONNX semantics); integer division and modulo by zero
give 0, as NumPy does, and ``INT_MIN / -1`` wraps: nothing traps (docs/semantics.md).
``check_nonzero(y)`` is ``y`` for a divisor whose framework raises on zero (torch): a zero
raises ``IntegerDivisionByZero`` at run time; it fuses into the division's kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from tilework import te
from tilework.errors import UnsupportedError
from tilework.ir.graph import Call, Constant, Expr
from tilework.ir.info import StructInfo, TensorInfo, check_dtype
from tilework.ir.loop import PExpr, Scalar, const, dtype_of
from tilework.ir.loop import binary as loop_binary
from tilework.ir.dtype import is_float_dtype as is_float
from tilework.op.base import (
    InferCtx,
    Op,
    OpPattern,
    broadcast_shapes,
    may_be_float,
    make_call,
    register,
    tensor_arg,
    unify_dtype,
)
from tilework.op.kernel import arg, bcast_index, op_name, out_tensor, upcast

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

FLOAT_ONLY = {"exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "gelu", "gelu_tanh", "silu", "sin", "cos"}
UNARY = (
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "relu", "gelu",
    "gelu_tanh", "silu", "sin", "cos", "floor", "ceil", "round", "square", "logical_not",
)  # fmt: skip
ARITH = ("add", "subtract", "multiply", "divide", "floor_divide", "mod", "power", "maximum", "minimum")
COMPARE = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
LOGICAL = ("logical_and", "logical_or", "logical_xor")


def _infer_unary(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if ctx.op_name in FLOAT_ONLY and not may_be_float(x.dtype):
        raise ctx.error(f"expects a floating-point tensor, got {x.dtype}")
    if ctx.op_name == "logical_not":
        return TensorInfo(x.shape, "bool", x.ndim)
    return x


def _binary_shape(call: Call, ctx: InferCtx) -> tuple[TensorInfo, TensorInfo, tuple | None, int]:
    a, b = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    if a.shape is not None and b.shape is not None:
        shape = broadcast_shapes(a.shape, b.shape, ctx)
        return a, b, shape, len(shape)
    ndim = max(a.ndim, b.ndim) if a.ndim != -1 and b.ndim != -1 else -1
    return a, b, None, ndim


def _infer_arith(call: Call, ctx: InferCtx) -> StructInfo:
    a, b, shape, ndim = _binary_shape(call, ctx)
    return TensorInfo(shape, unify_dtype([a.dtype, b.dtype], ctx), ndim)


def _infer_compare(call: Call, ctx: InferCtx) -> StructInfo:
    a, b, shape, ndim = _binary_shape(call, ctx)
    unify_dtype([a.dtype, b.dtype], ctx)
    return TensorInfo(shape, "bool", ndim)


def _infer_logical(call: Call, ctx: InferCtx) -> StructInfo:
    a, b, shape, ndim = _binary_shape(call, ctx)
    for t in (a, b):
        if t.dtype not in (None, "bool"):
            raise ctx.error(f"expects bool tensors, got {t.dtype}")
    return TensorInfo(shape, "bool", ndim)


def _infer_where(call: Call, ctx: InferCtx) -> StructInfo:
    c, a, b = (tensor_arg(call, i, ctx) for i in range(3))
    if c.dtype not in (None, "bool"):
        raise ctx.error(f"condition must be bool, got {c.dtype}")
    dtype = unify_dtype([a.dtype, b.dtype], ctx)
    if c.shape is not None and a.shape is not None and b.shape is not None:
        shape = broadcast_shapes(broadcast_shapes(c.shape, a.shape, ctx), b.shape, ctx)
        return TensorInfo(shape, dtype)
    ndims = (c.ndim, a.ndim, b.ndim)
    return TensorInfo(None, dtype, -1 if -1 in ndims else max(ndims))


def _infer_astype(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    return TensorInfo(x.shape, check_dtype(call.attrs["dtype"]), x.ndim)


# -- legalization ---------------------------------------------------------------------------

_SQRT1_2 = 0.7071067811865476
_SQRT_2_PI = 0.7978845608028654


def _unary_value(name: str, v: PExpr) -> PExpr:
    """Unary op ``name`` of a value ``v`` already in its compute dtype."""
    dt = dtype_of(v)
    if name == "logical_not":
        return te.logical_not(v) if dt == "bool" else te.eq(v, 0)
    if name in ("abs", "relu", "floor", "ceil", "round", "square") and dt == "bool":
        return v  # each maps False to False and True to True
    if dt == "bool":
        raise UnsupportedError(f"{name} of a bool tensor is undefined; cast it first")
    if name in ("floor", "ceil", "round") and not is_float(dt):
        return v
    simple: dict[str, Callable[[PExpr], PExpr]] = {
        "neg": lambda x: -x,
        "abs": te.abs, "exp": te.exp, "log": te.log, "sqrt": te.sqrt, "rsqrt": te.rsqrt,
        "tanh": te.tanh, "erf": te.erf, "sigmoid": te.sigmoid, "sin": te.sin, "cos": te.cos,
        "floor": te.floor, "ceil": te.ceil, "round": te.round,
        "relu": lambda x: te.maximum(x, 0),
        "square": lambda x: x * x,
        "silu": lambda x: x * te.sigmoid(x),
        "gelu": lambda x: 0.5 * x * (1.0 + te.erf(x * _SQRT1_2)),
        "gelu_tanh": lambda x: 0.5 * x * (1.0 + te.tanh(_SQRT_2_PI * (x + 0.044715 * x * x * x))),
    }  # fmt: skip
    return simple[name](v)


def _legalize_unary(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = op_name(call)
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    out = te.compute(shape, lambda *i: _unary_value(name, upcast(x[i], x.dtype)), name, dtype)
    return ctx.call_te(name, call.args, [x], [out], call.info)


def _int_guarded(op: Callable[[Scalar, Scalar], Scalar], a: Scalar, b: Scalar) -> Scalar:
    return te.if_then_else(te.eq(b, 0), 0, op(a, b))


def _binary_value(name: str, a: Scalar, b: Scalar) -> Scalar:
    """Binary op ``name`` of values in their common compute dtype."""
    is_int = not is_float(dtype_of(a))
    if name == "divide" and is_int:
        return _int_guarded(te.truncdiv, a, b)
    if name == "floor_divide" and is_int:
        return _int_guarded(lambda p, q: loop_binary("//", p, q), a, b)
    if name == "mod" and is_int:
        return _int_guarded(lambda p, q: loop_binary("%", p, q), a, b)
    ops: dict[str, Callable[[Scalar, Scalar], Scalar]] = {
        "add": lambda p, q: p + q,
        "subtract": lambda p, q: p - q,
        "multiply": lambda p, q: p * q,
        "divide": lambda p, q: loop_binary("/", p, q),
        "floor_divide": lambda p, q: loop_binary("//", p, q),
        "mod": lambda p, q: loop_binary("%", p, q),
        "power": te.power, "maximum": te.maximum, "minimum": te.minimum,
        "equal": te.eq, "not_equal": te.ne, "less": te.lt, "less_equal": te.le,
        "greater": te.gt, "greater_equal": te.ge,
        "logical_and": te.logical_and, "logical_or": te.logical_or, "logical_xor": te.ne,
    }  # fmt: skip
    return ops[name](a, b)


def _legalize_binary(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = op_name(call)
    a, b = arg(call, 0, "a"), arg(call, 1, "b")
    shape, dtype = out_tensor(call)

    def f(*i: Scalar) -> Scalar:
        va = upcast(a[bcast_index(i, a.shape, shape)], a.dtype)
        vb = upcast(b[bcast_index(i, b.shape, shape)], b.dtype)
        return _binary_value(name, va, vb)

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [a, b], [out], call.info)


# Constant integer exponents of ``power`` computed by multiplication (exponentiation by squaring)
# rather than by libm's ``pow``, which C compilers keep scalar: a vector loop of a few multiplies
# against one call per element (GPT-2's tanh GELU cubes its input): a [128, 3072] float32
# pow(x, n) kernel takes 0.10-0.20 ms for n in -3..8 against 3.5-3.9 ms through powf (1 thread).
# The bound keeps float64 products within about 7 ulp; float32 ones go through float64, whose
# range holds the power of any finite float32 to 8 (so overflow and underflow are float32's).
POW_MUL_MAX = 8
# The exponents torch's CPU ``pow`` itself computes by multiplication in the value's dtype:
# ``x * x``, ``x * x * x``, ``1 / x``, ``1 / (x * x)``. Matching them keeps results bitwise equal.
_POW_SAME_DTYPE = frozenset({-2, -1, 0, 1, 2, 3})


def mul_exponent(b: Expr, dtype: str) -> int | None:
    """The exponent ``n`` when ``power(x, b)`` of a ``dtype`` result is computed by
    multiplication: ``b`` a one-element constant holding an integer value, ``|n| <= POW_MUL_MAX``,
    and ``n >= 0`` for an integer ``dtype`` (a negative one keeps the ``pow`` path); else None."""
    if not isinstance(b, Constant) or b.data.size != 1 or dtype == "bool" or b.data.dtype.kind not in "iuf":
        return None
    v = b.data.reshape(()).item()
    if isinstance(v, float) and not v.is_integer():  # NaN and inf too
        return None
    n = int(v)
    if not -POW_MUL_MAX <= n <= POW_MUL_MAX or (n < 0 and not is_float(dtype)):
        return None
    return n


def int_power(x: PExpr, n: int) -> PExpr:
    """``x ** n`` for an integer ``n`` by multiplication (exponentiation by squaring), a
    negative ``n`` as ``1 / x ** -n``; ``x ** 0`` is 1 (NaN too, as C's ``pow``). Integers wrap.
    A float ``x`` with an ``n`` outside ``_POW_SAME_DTYPE`` is raised in float64 and rounded
    once: float32 results are then correctly rounded but for rare double rounding (libm ``powf``
    is within 1 ulp), float64 ones within about ``(|n| - 1) / 2`` ulp of exact."""
    dt = dtype_of(x)
    if n not in _POW_SAME_DTYPE and is_float(dt) and dt != "float64":
        return te.cast(int_power(te.cast(x, "float64"), n), dt)
    result: PExpr | None = None
    base, k = x, -n if n < 0 else n  # (this module defines its own abs)
    while k:
        if k & 1:
            result = base if result is None else result * base
        k >>= 1
        if k:
            base = base * base
    if result is None:
        return const(1, dt)
    return loop_binary("/", const(1, dt), result) if n < 0 else result


def _legalize_power(call: Call, ctx: "LegalizeCtx") -> Expr:
    """``power`` with a constant integer exponent (``mul_exponent``) by multiplication; other
    exponents through ``pow``."""
    shape, dtype = out_tensor(call)
    a = arg(call, 0, "a")
    n = mul_exponent(call.args[1], dtype)
    if n is None or a.dtype != dtype:
        return _legalize_binary(call, ctx)

    def f(*i: Scalar) -> Scalar:
        return int_power(upcast(a[bcast_index(i, a.shape, shape)], a.dtype), n)

    out = te.compute(shape, f, "power", dtype)
    return ctx.call_te("power", call.args[:1], [a], [out], call.info)


def _legalize_where(call: Call, ctx: "LegalizeCtx") -> Expr:
    c, a, b = arg(call, 0, "cond"), arg(call, 1, "a"), arg(call, 2, "b")
    shape, dtype = out_tensor(call)

    def f(*i: Scalar) -> Scalar:
        return te.if_then_else(c[bcast_index(i, c.shape, shape)], a[bcast_index(i, a.shape, shape)], b[bcast_index(i, b.shape, shape)])

    out = te.compute(shape, f, "where", dtype)
    return ctx.call_te("where", call.args, [c, a, b], [out], call.info)


def _infer_check_nonzero(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if x.dtype is not None and (is_float(x.dtype) or x.dtype == "bool"):
        raise ctx.error(f"expects an integer divisor, got {x.dtype}")
    return x


def _legalize_check_nonzero(call: Call, ctx: "LegalizeCtx") -> Expr:
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    out = te.compute(shape, lambda *i: te.check_nonzero(x[i]), "check_nonzero", dtype)
    return ctx.call_te("check_nonzero", call.args, [x], [out], call.info)


def _legalize_astype(call: Call, ctx: "LegalizeCtx") -> Expr:
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    if dtype == "bool":
        out = te.compute(shape, lambda *i: te.ne(x[i], 0) if x.dtype != "bool" else x[i], "astype")
    else:
        out = te.compute(shape, lambda *i: te.cast(x[i], dtype), "astype")
    return ctx.call_te("astype", call.args, [x], [out], call.info)


for _name in UNARY:
    register(Op(_name, _infer_unary, OpPattern.ELEMWISE, num_args=1, legalize=_legalize_unary))
for _name in ARITH:
    register(Op(_name, _infer_arith, OpPattern.BROADCAST, num_args=2, legalize=_legalize_power if _name == "power" else _legalize_binary))
for _name in COMPARE:
    register(Op(_name, _infer_compare, OpPattern.BROADCAST, num_args=2, legalize=_legalize_binary))
for _name in LOGICAL:
    register(Op(_name, _infer_logical, OpPattern.BROADCAST, num_args=2, legalize=_legalize_binary))
register(Op("where", _infer_where, OpPattern.BROADCAST, num_args=3, legalize=_legalize_where))
register(Op("check_nonzero", _infer_check_nonzero, OpPattern.ELEMWISE, num_args=1, legalize=_legalize_check_nonzero))
register(Op("astype", _infer_astype, OpPattern.ELEMWISE, attrs={"dtype": "float32"}, num_args=1, legalize=_legalize_astype))


def unary(name: str, x: Expr) -> Call:
    return make_call(name, [x])


def binary(name: str, a: Expr, b: Expr) -> Call:
    return make_call(name, [a, b])


def where(cond: Expr, a: Expr, b: Expr) -> Call:
    return make_call("where", [cond, a, b])


def astype(x: Expr, dtype: str) -> Call:
    return make_call("astype", [x], dtype=dtype)


def check_nonzero(y: Expr) -> Call:
    """The integer divisor ``y`` unchanged; a zero element raises ``IntegerDivisionByZero`` at
    run time (what torch does for an integer division by zero)."""
    return make_call("check_nonzero", [y])


# -- constructors (one per op, so that type checkers see them) ---------------------------


def neg(x: Expr) -> Call:
    """``-x``."""
    return make_call("neg", [x])


def abs(x: Expr) -> Call:
    """``|x|``."""
    return make_call("abs", [x])


def exp(x: Expr) -> Call:
    """``e ** x``."""
    return make_call("exp", [x])


def log(x: Expr) -> Call:
    """Natural logarithm."""
    return make_call("log", [x])


def sqrt(x: Expr) -> Call:
    """Square root."""
    return make_call("sqrt", [x])


def rsqrt(x: Expr) -> Call:
    """``1 / sqrt(x)``."""
    return make_call("rsqrt", [x])


def tanh(x: Expr) -> Call:
    """Hyperbolic tangent."""
    return make_call("tanh", [x])


def erf(x: Expr) -> Call:
    """The error function."""
    return make_call("erf", [x])


def sigmoid(x: Expr) -> Call:
    """``1 / (1 + exp(-x))``."""
    return make_call("sigmoid", [x])


def relu(x: Expr) -> Call:
    """``max(x, 0)``."""
    return make_call("relu", [x])


def gelu(x: Expr) -> Call:
    """GELU with the exact erf form."""
    return make_call("gelu", [x])


def gelu_tanh(x: Expr) -> Call:
    """GELU with the tanh approximation."""
    return make_call("gelu_tanh", [x])


def silu(x: Expr) -> Call:
    """``x * sigmoid(x)``."""
    return make_call("silu", [x])


def sin(x: Expr) -> Call:
    """Sine."""
    return make_call("sin", [x])


def cos(x: Expr) -> Call:
    """Cosine."""
    return make_call("cos", [x])


def floor(x: Expr) -> Call:
    """Round down."""
    return make_call("floor", [x])


def ceil(x: Expr) -> Call:
    """Round up."""
    return make_call("ceil", [x])


def round(x: Expr) -> Call:
    """Round half to even."""
    return make_call("round", [x])


def square(x: Expr) -> Call:
    """``x * x``."""
    return make_call("square", [x])


def logical_not(x: Expr) -> Call:
    """Boolean negation (bool result)."""
    return make_call("logical_not", [x])


def add(a: Expr, b: Expr) -> Call:
    """``a + b``, with NumPy broadcasting."""
    return make_call("add", [a, b])


def subtract(a: Expr, b: Expr) -> Call:
    """``a - b``, with NumPy broadcasting."""
    return make_call("subtract", [a, b])


def multiply(a: Expr, b: Expr) -> Call:
    """``a * b``, with NumPy broadcasting."""
    return make_call("multiply", [a, b])


def divide(a: Expr, b: Expr) -> Call:
    """``a / b``, with NumPy broadcasting."""
    return make_call("divide", [a, b])


def floor_divide(a: Expr, b: Expr) -> Call:
    """``a // b`` (floor), with NumPy broadcasting."""
    return make_call("floor_divide", [a, b])


def mod(a: Expr, b: Expr) -> Call:
    """``a % b`` (floor, sign of ``b``), with NumPy broadcasting."""
    return make_call("mod", [a, b])


def power(a: Expr, b: Expr) -> Call:
    """``a ** b``, with NumPy broadcasting. A one-element constant ``b`` holding a small integer
    is computed by multiplication (``int_power``: ``x ** 3`` is ``x * x * x``, as torch does)."""
    return make_call("power", [a, b])


def maximum(a: Expr, b: Expr) -> Call:
    """Elementwise maximum, with NumPy broadcasting."""
    return make_call("maximum", [a, b])


def minimum(a: Expr, b: Expr) -> Call:
    """Elementwise minimum, with NumPy broadcasting."""
    return make_call("minimum", [a, b])


def equal(a: Expr, b: Expr) -> Call:
    """``a == b`` (bool result), with NumPy broadcasting."""
    return make_call("equal", [a, b])


def not_equal(a: Expr, b: Expr) -> Call:
    """``a != b`` (bool result), with NumPy broadcasting."""
    return make_call("not_equal", [a, b])


def less(a: Expr, b: Expr) -> Call:
    """``a < b`` (bool result), with NumPy broadcasting."""
    return make_call("less", [a, b])


def less_equal(a: Expr, b: Expr) -> Call:
    """``a <= b`` (bool result), with NumPy broadcasting."""
    return make_call("less_equal", [a, b])


def greater(a: Expr, b: Expr) -> Call:
    """``a > b`` (bool result), with NumPy broadcasting."""
    return make_call("greater", [a, b])


def greater_equal(a: Expr, b: Expr) -> Call:
    """``a >= b`` (bool result), with NumPy broadcasting."""
    return make_call("greater_equal", [a, b])


def logical_and(a: Expr, b: Expr) -> Call:
    """Boolean and, with NumPy broadcasting."""
    return make_call("logical_and", [a, b])


def logical_or(a: Expr, b: Expr) -> Call:
    """Boolean or, with NumPy broadcasting."""
    return make_call("logical_or", [a, b])


def logical_xor(a: Expr, b: Expr) -> Call:
    """Boolean exclusive or, with NumPy broadcasting."""
    return make_call("logical_xor", [a, b])
