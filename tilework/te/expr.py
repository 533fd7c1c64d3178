"""Scalar helpers of the compute DSL: intrinsics, select, casts, constants, comparisons.

Arguments may be loop-level expressions, index values (ints and SymExprs, int64) or Python
numbers; binary helpers promote like the ``PExpr`` operators (``tilework.ir.loop.binary``).
Float-only intrinsics (exp, log, ...) refuse integer expressions (cast first) and compute a
weakly typed argument (a Python number or an index) in float32.
"""

from __future__ import annotations

from functools import reduce
from typing import Union

from tilework.ir.info import check_dtype
from tilework.ir.dtype import INT_DTYPES, is_float_dtype, itemsize
from tilework.ir.loop import (
    Cast,
    Const,
    Intrin,
    Operand,
    PExpr,
    Scalar,
    Select,
    Unary,
    binary,
    const,
    convert,
    dtype_of,
    operand_dtype,
)
from tilework.ir.sym import SymExpr
from tilework.te.tensor import identity_value

FLOAT_INTRINSICS = (
    "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "sin", "cos", "atan", "asin", "acos", "log1p", "expm1",
)
ANY_INTRINSICS = ("abs", "floor", "ceil", "round")
PREDICATES = ("isnan", "isinf")


def _scalar(x: Operand) -> Scalar:
    if isinstance(x, PExpr):
        return x
    if isinstance(x, bool):
        return const(x, "bool")
    if isinstance(x, float):
        return const(x, "float32")
    return convert(x, "int64")


def _intrin(name: str, x: Operand) -> PExpr:
    a = _scalar(x)
    dt = dtype_of(a)
    if name in FLOAT_INTRINSICS and not is_float_dtype(dt):
        if isinstance(x, PExpr):
            raise TypeError(f"{name} needs a floating-point argument, got {dt}; cast it first")
        a, dt = convert(a, "float32"), "float32"
    if name in PREDICATES:
        return Intrin(name, (a,), "bool")
    if dt == "bool":
        raise TypeError(f"{name} of a bool expression")
    return Intrin(name, (a,), dt)


def exp(x: Operand) -> PExpr:
    return _intrin("exp", x)


def log(x: Operand) -> PExpr:
    return _intrin("log", x)


def sqrt(x: Operand) -> PExpr:
    return _intrin("sqrt", x)


def rsqrt(x: Operand) -> PExpr:
    """``1 / sqrt(x)``."""
    return _intrin("rsqrt", x)


def tanh(x: Operand) -> PExpr:
    return _intrin("tanh", x)


def erf(x: Operand) -> PExpr:
    return _intrin("erf", x)


def sigmoid(x: Operand) -> PExpr:
    """``1 / (1 + exp(-x))``."""
    return _intrin("sigmoid", x)


def sin(x: Operand) -> PExpr:
    return _intrin("sin", x)


def cos(x: Operand) -> PExpr:
    return _intrin("cos", x)


def atan(x: Operand) -> PExpr:
    return _intrin("atan", x)


def asin(x: Operand) -> PExpr:
    """``arcsin``: NaN outside ``[-1, 1]``."""
    return _intrin("asin", x)


def acos(x: Operand) -> PExpr:
    """``arccos``: NaN outside ``[-1, 1]``."""
    return _intrin("acos", x)


def log1p(x: Operand) -> PExpr:
    return _intrin("log1p", x)


def expm1(x: Operand) -> PExpr:
    return _intrin("expm1", x)


def abs(x: Operand) -> PExpr:  # noqa: A001
    return _intrin("abs", x)


def floor(x: Operand) -> PExpr:
    return _intrin("floor", x)


def ceil(x: Operand) -> PExpr:
    return _intrin("ceil", x)


def round(x: Operand) -> PExpr:  # noqa: A001
    """Round half to even (NumPy's ``round``)."""
    return _intrin("round", x)


def isnan(x: Operand) -> PExpr:
    return _intrin("isnan", x)


def isinf(x: Operand) -> PExpr:
    return _intrin("isinf", x)


def check_nonzero(x: Operand) -> PExpr:
    """The integer divisor ``x`` unchanged; a zero makes the kernel raise
    ``IntegerDivisionByZero`` (torch's integer division semantics, docs/semantics.md)."""
    a = _scalar(x)
    if is_float_dtype(dtype_of(a)) or dtype_of(a) == "bool":
        raise TypeError(f"check_nonzero takes an integer divisor, got {dtype_of(a)}")
    return Intrin("check_nonzero", (a,), dtype_of(a))


def check_range(x: Operand, lo: Operand, hi: Operand) -> PExpr:
    """The integer index ``x`` unchanged; a value outside ``[lo, hi)`` makes the kernel raise
    ``IndexOutOfRange`` (where torch raises IndexError, docs/semantics.md)."""
    a = _scalar(x)
    if is_float_dtype(dtype_of(a)) or dtype_of(a) == "bool":
        raise TypeError(f"check_range takes an integer index, got {dtype_of(a)}")
    return Intrin("check_range", (a, cast(lo, "int64"), cast(hi, "int64")), dtype_of(a))


def _int_operands(name: str, *xs: Operand) -> tuple[tuple[Scalar, ...], str]:
    """``xs`` in their common integer dtype (a Python int takes the typed operand's)."""
    if [x for x in xs if isinstance(x, (bool, float))]:  # (this module's ``any`` is the loop-level one)
        raise TypeError(f"{name} takes integer operands, got {[type(x).__name__ for x in xs]}")
    dt = dtype_of(_scalar(xs[0])) if len(xs) == 1 else operand_dtype(name, xs[0], xs[1])
    if dt not in INT_DTYPES:
        raise TypeError(f"{name} takes integer operands, got {dt}")
    return tuple(convert(x, dt) for x in xs), dt


def bitwise_and(a: Operand, b: Operand) -> PExpr:
    """``a & b`` on the two's complement bits of integers."""
    args, dt = _int_operands("bitwise_and", a, b)
    return Intrin("bitwise_and", args, dt)


def bitwise_or(a: Operand, b: Operand) -> PExpr:
    """``a | b`` on the two's complement bits of integers."""
    args, dt = _int_operands("bitwise_or", a, b)
    return Intrin("bitwise_or", args, dt)


def bitwise_xor(a: Operand, b: Operand) -> PExpr:
    """``a ^ b`` on the two's complement bits of integers."""
    args, dt = _int_operands("bitwise_xor", a, b)
    return Intrin("bitwise_xor", args, dt)


def bitwise_not(a: Operand) -> PExpr:
    """``~a``: every bit of an integer flipped."""
    args, dt = _int_operands("bitwise_not", a)
    return Intrin("bitwise_not", args, dt)


def bitcast(x: Operand, dtype: str) -> PExpr:
    """The bits of ``x`` read as ``dtype``, which must have the same size (bool is one byte
    holding 0 or 1; a byte read as bool is true when nonzero)."""
    a = _scalar(x)
    src = dtype_of(a)
    check_dtype(dtype)
    if itemsize(src) != itemsize(dtype):
        raise TypeError(f"bitcast from {src} ({itemsize(src)} bytes) to {dtype} ({itemsize(dtype)} bytes): the sizes differ")
    return a if isinstance(a, PExpr) and src == dtype else Intrin("bitcast", (a,), dtype)


def power(a: Operand, b: Operand) -> PExpr:
    return binary("pow", a, b)


def maximum(a: Operand, b: Operand) -> PExpr:
    """The larger of two values (NaN propagates)."""
    return binary("max", a, b)


def minimum(a: Operand, b: Operand) -> PExpr:
    """The smaller of two values (NaN propagates)."""
    return binary("min", a, b)


def truncdiv(a: Operand, b: Operand) -> PExpr:
    """Integer division rounding toward zero (true division for floats)."""
    return binary("/", a, b)


def lt(a: Operand, b: Operand) -> PExpr:
    return binary("<", a, b)


def le(a: Operand, b: Operand) -> PExpr:
    return binary("<=", a, b)


def gt(a: Operand, b: Operand) -> PExpr:
    return binary(">", a, b)


def ge(a: Operand, b: Operand) -> PExpr:
    return binary(">=", a, b)


def eq(a: Operand, b: Operand) -> PExpr:
    return binary("==", a, b)


def ne(a: Operand, b: Operand) -> PExpr:
    return binary("!=", a, b)


def logical_and(a: Operand, b: Operand) -> PExpr:
    return binary("and", a, b)


def logical_or(a: Operand, b: Operand) -> PExpr:
    return binary("or", a, b)


def logical_not(x: Operand) -> PExpr:
    a = convert(x, "bool") if not isinstance(x, PExpr) else x
    if dtype_of(a) != "bool":
        raise TypeError(f"logical_not needs a bool expression, got {dtype_of(a)}")
    return Unary("not", a, "bool")


def all(*conds: Operand) -> Scalar:  # noqa: A001
    """The conjunction of bool conditions (True when none are given)."""
    if not conds:
        return const(True, "bool")
    return reduce(logical_and, conds[1:], convert(conds[0], "bool"))


def any(*conds: Operand) -> Scalar:  # noqa: A001
    """The disjunction of bool conditions (False when none are given)."""
    if not conds:
        return const(False, "bool")
    return reduce(logical_or, conds[1:], convert(conds[0], "bool"))


def if_then_else(cond: Operand, a: Operand, b: Operand) -> PExpr:
    """``a`` where ``cond`` holds, else ``b``; only the chosen side is evaluated, so a side may
    load out of range when the condition excludes it."""
    c = convert(cond, "bool")
    dt = operand_dtype("select", a, b)
    return Select(c, convert(a, dt), convert(b, dt), dt)


select = if_then_else


def cast(x: Operand, dtype: str) -> PExpr:
    """``x`` converted to ``dtype`` (C conversion semantics: floats truncate toward zero)."""
    check_dtype(dtype)
    if isinstance(x, PExpr):
        return x if x.dtype == dtype else Cast(dtype, x)
    if isinstance(x, (bool, int, float)) and not isinstance(x, SymExpr):
        return const(x, dtype)
    out = convert(x, dtype)
    return out if isinstance(out, PExpr) else Cast(dtype, out)


def constant(value: Union[int, float, bool], dtype: str) -> Const:
    """A constant of ``dtype``."""
    return const(value, check_dtype(dtype))


def max_value(dtype: str) -> Const:
    """The largest value of ``dtype`` (+inf for floats)."""
    return const(identity_value("min", dtype), check_dtype(dtype))


def min_value(dtype: str) -> Const:
    """The smallest value of ``dtype`` (-inf for floats)."""
    return const(identity_value("max", dtype), check_dtype(dtype))
