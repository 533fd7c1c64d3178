"""Operators: one registry (``tilework.op.base``), one file per family.

Importing this package registers every op. The functions here build (unnormalized) calls;
``BlockBuilder.emit`` normalizes them and infers their struct info.
"""

from __future__ import annotations

from tilework.op import calls, create, elementwise, linalg, manipulate, nn, reduce
from tilework.op.base import DimCheck, Op, OpPattern, all_ops, get, infer_with_checks, make_call, register
from tilework.op.calls import call_lib, call_packed, call_tensor
from tilework.op.create import arange, full, full_like, ones, ones_like, zeros, zeros_like
from tilework.op.elementwise import (
    neg, abs, exp, log, sqrt, rsqrt, tanh, erf, sigmoid, relu, gelu, gelu_tanh, silu, sin, cos,
    floor, ceil, round, square, logical_not, add, subtract, multiply, divide, floor_divide,
    mod, power, maximum, minimum, equal, not_equal, less, less_equal, greater, greater_equal,
    logical_and, logical_or, logical_xor,
    astype, where,
)  # fmt: skip
from tilework.op.linalg import linear, matmul
from tilework.op.manipulate import (
    broadcast_to, concat, expand_dims, flatten, permute_dims, reshape, shape_of, split, squeeze,
    strided_slice, take,
)  # fmt: skip
from tilework.op.nn import attention, layer_norm, log_softmax, rms_norm, softmax
from tilework.op.reduce import argmax, argmin, max, mean, min, prod, sum

__all__ = [
    "DimCheck",
    "Op",
    "OpPattern",
    "all_ops",
    "get",
    "infer_with_checks",
    "make_call",
    "register",
    "calls",
    "create",
    "elementwise",
    "linalg",
    "manipulate",
    "nn",
    "reduce",
    "call_lib",
    "call_packed",
    "call_tensor",
    "astype",
    "where",
    *elementwise.UNARY,
    *elementwise.ARITH,
    *elementwise.COMPARE,
    *elementwise.LOGICAL,
    "arange", "full", "full_like", "ones", "ones_like", "zeros", "zeros_like",
    "linear", "matmul",
    "broadcast_to", "concat", "expand_dims", "flatten", "permute_dims", "reshape", "shape_of",
    "split", "squeeze", "strided_slice", "take",
    "attention", "layer_norm", "log_softmax", "rms_norm", "softmax",
    "argmax", "argmin", "max", "mean", "min", "prod", "sum",
]  # fmt: skip
