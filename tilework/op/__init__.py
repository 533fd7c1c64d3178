"""Operators: one registry (``tilework.op.base``), one file per family.

Importing this package registers every op. The functions here build (unnormalized) calls;
``BlockBuilder.emit`` normalizes them and infers their struct info.
"""

from __future__ import annotations

from tilework.op import calls, create, elementwise, linalg, manipulate, nn, reduce
from tilework.op import conv, index, norm_extra
from tilework.op import conv_nhwc as _conv_nhwc  # noqa: F401  (registers im2col, max_pool2d_nhwc)
from tilework.op import winograd as _winograd  # noqa: F401  (registers the Winograd transforms)
from tilework.op import winograd_images as _winograd_images  # noqa: F401  (registers the per-image Winograd conv)
from tilework.op import grouped_conv as _grouped_conv  # noqa: F401  (registers grouped_conv2d_nhwc)
from tilework.op import bitwise, math, pad, search, shape  # the ONNX frontend's families
from tilework.op import vm  # ops of lowered programs (vm_*, assert_dims)
from tilework.op import paged_attention as _paged_attention  # noqa: F401  (registers the op)
from tilework.op import quant, rotary
from tilework.op import rnn as _rnn  # noqa: F401  (registers the op)
from tilework.op import detection as _detection  # noqa: F401  (registers the op)
from tilework.op.base import DimCheck, Op, OpPattern, all_ops, get, infer_with_checks, make_call, register
from tilework.op.calls import call_lib, call_packed, call_tensor
from tilework.op.create import arange, full, full_like, ones, ones_like, zeros, zeros_like
from tilework.op.elementwise import (
    neg, abs, exp, log, sqrt, rsqrt, tanh, erf, sigmoid, relu, gelu, gelu_tanh, silu, sin, cos,
    floor, ceil, round, square, logical_not, add, subtract, multiply, divide, floor_divide,
    mod, power, maximum, minimum, equal, not_equal, less, less_equal, greater, greater_equal,
    logical_and, logical_or, logical_xor,
    astype, where, check_nonzero,
)  # fmt: skip
from tilework.op.linalg import linear, matmul
from tilework.op.manipulate import (
    broadcast_to, concat, expand_dims, flatten, permute_dims, reshape, shape_of, split, squeeze,
    strided_slice, take,
)  # fmt: skip
from tilework.op.nn import attention, layer_norm, log_softmax, rms_norm, softmax
from tilework.op.reduce import argmax, argmin, max, mean, min, prod, sum
from tilework.op.conv import adaptive_avg_pool2d, avg_pool2d, conv1d, conv2d, max_pool2d, max_pool2d_indices
from tilework.op.index import check_index, cumsum, gather, index_tensor, scatter, tril, triu
from tilework.op.norm_extra import batch_norm, group_norm
from tilework.op.paged_attention import paged_attention, paged_rotary
from tilework.op.quant import expert_linear, quant_linear, quant_take
from tilework.op.rotary import rotary_embedding

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
    "check_nonzero",
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
    "conv", "index", "norm_extra",
    "bitwise", "math", "pad", "search", "shape",
    "adaptive_avg_pool2d", "avg_pool2d", "conv1d", "conv2d", "max_pool2d", "max_pool2d_indices",
    "check_index", "cumsum", "gather", "index_tensor", "scatter", "tril", "triu",
    "batch_norm", "group_norm",
    "expert_linear", "paged_attention", "paged_rotary", "quant", "quant_linear", "quant_take", "rotary", "rotary_embedding",
]  # fmt: skip
