"""The tensor-expression DSL: describe a kernel by index expressions, get a ``TensorFunc``.

    n = tw.dim("n")
    A = te.placeholder((n, 4), "float32", "A")
    k = te.reduce_axis(4, "k")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), "B")
    f = te.create_func([A, B])          # params: A, B; one kernel for every n

Tensor indexing, arithmetic on expressions (``+ - * / // % **``, ``< <= > >=``, ``&``, ``|``,
``.eq``/``.ne``) and the helpers below build the compute bodies.
"""

from __future__ import annotations

from tilework.te.build import create_func
from tilework.te.expr import (
    abs,
    acos,
    all,
    any,
    asin,
    atan,
    bitcast,
    bitwise_and,
    bitwise_not,
    bitwise_or,
    bitwise_xor,
    cast,
    ceil,
    check_nonzero,
    check_range,
    constant,
    cos,
    eq,
    erf,
    exp,
    expm1,
    floor,
    ge,
    gt,
    if_then_else,
    isinf,
    isnan,
    le,
    log,
    log1p,
    logical_and,
    logical_not,
    logical_or,
    lt,
    max_value,
    maximum,
    min_value,
    minimum,
    ne,
    power,
    round,
    rsqrt,
    select,
    sigmoid,
    sin,
    sqrt,
    tanh,
    truncdiv,
)
from tilework.te.tensor import (
    Reduce,
    ReduceVar,
    Tensor,
    TensorLoad,
    argmax,
    argmin,
    compute,
    max,
    min,
    placeholder,
    prod,
    reduce_axis,
    sum,
)

__all__ = [
    "Reduce", "ReduceVar", "Tensor", "TensorLoad", "abs", "acos", "all", "any", "argmax", "argmin", "asin", "atan",
    "bitcast", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "cast", "ceil", "check_nonzero", "check_range", "compute", "constant", "cos", "create_func", "eq", "erf", "exp", "expm1",
    "floor", "ge", "gt", "if_then_else", "isinf", "isnan", "le", "log", "log1p", "logical_and",
    "logical_not", "logical_or", "lt", "max", "max_value", "maximum", "min", "min_value",
    "minimum", "ne", "placeholder", "power", "prod", "reduce_axis", "round", "rsqrt", "select",
    "sigmoid", "sin", "sqrt", "sum", "tanh", "truncdiv",
]  # fmt: skip
