"""Functional ops on ``nn.Tensor``s: each emits one op of ``tilework.op`` in the current trace
and returns its result as a Tensor. Semantics are the ops' (see ``tilework.op``); where an op
takes a second tensor, a Python number is accepted and takes the first tensor's dtype."""

from __future__ import annotations

from typing import Sequence

from tilework import op
from tilework.ir.sym import Dim
from tilework.nn.core import Tensor, as_expr, emit, emit_tuple


def _unary(name: str, x: Tensor) -> Tensor:
    return emit(op.elementwise.unary(name, x.expr))


def relu(x: Tensor) -> Tensor:
    return _unary("relu", x)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """Exact GELU; ``approximate="tanh"`` the tanh form."""
    return _unary("gelu_tanh" if approximate == "tanh" else "gelu", x)


def silu(x: Tensor) -> Tensor:
    return _unary("silu", x)


def sigmoid(x: Tensor) -> Tensor:
    return _unary("sigmoid", x)


def tanh(x: Tensor) -> Tensor:
    return _unary("tanh", x)


def exp(x: Tensor) -> Tensor:
    return _unary("exp", x)


def log(x: Tensor) -> Tensor:
    return _unary("log", x)


def sqrt(x: Tensor) -> Tensor:
    return _unary("sqrt", x)


def rsqrt(x: Tensor) -> Tensor:
    return _unary("rsqrt", x)


def maximum(a: Tensor, b: Tensor | float) -> Tensor:
    return emit(op.maximum(a.expr, as_expr(b, a)))


def minimum(a: Tensor, b: Tensor | float) -> Tensor:
    return emit(op.minimum(a.expr, as_expr(b, a)))


def where(cond: Tensor, a: Tensor, b: Tensor | float) -> Tensor:
    return emit(op.where(cond.expr, a.expr, as_expr(b, a)))


def matmul(a: Tensor, b: Tensor) -> Tensor:
    return emit(op.matmul(a.expr, b.expr))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T (+ bias)``, ``weight`` laid out ``[out_features, in_features]``."""
    return emit(op.linear(x.expr, weight.expr, None if bias is None else bias.expr))


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    return emit(op.softmax(x.expr, axis))


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    return emit(op.log_softmax(x.expr, axis))


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    return emit(op.rms_norm(x.expr, weight.expr, eps=eps))


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    return emit(op.layer_norm(x.expr, weight.expr, bias.expr, eps=eps))


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False, scale: float | None = None) -> Tensor:
    """Scaled dot-product attention over ``[batch, seq, heads, head_dim]`` (grouped KV heads)."""
    return emit(op.attention(q.expr, k.expr, v.expr, None if mask is None else mask.expr, causal, scale))


def rotary_embedding(x: Tensor, positions: Tensor, theta: float = 10000.0, rotary_dim: int | None = None, factor: float = 1.0) -> Tensor:
    """``x`` ``[batch, seq, heads, head_dim]`` rotated by the angles of ``positions`` (divided by
    ``factor``: linear rotary scaling)."""
    return emit(op.rotary_embedding(x.expr, positions.expr, theta, rotary_dim, factor))


def arange(start: Dim, end: Dim, step: int = 1, dtype: str = "int64") -> Tensor:
    """``[start, end)`` by ``step``; bounds may be symbolic dims (``arange(0, seq)``)."""
    return emit(op.arange(start, end, step, dtype=dtype))


def take(x: Tensor, indices: Tensor, axis: int = 0) -> Tensor:
    return emit(op.take(x.expr, indices.expr, axis))


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    return emit(op.concat([t.expr for t in tensors], axis))


def reshape(x: Tensor, shape: Sequence[Dim]) -> Tensor:
    return x.reshape(tuple(shape))


def permute_dims(x: Tensor, axes: Sequence[int]) -> Tensor:
    return x.permute(tuple(axes))


def squeeze(x: Tensor, axis: int | Sequence[int]) -> Tensor:
    return emit(op.squeeze(x.expr, axis))


def expand_dims(x: Tensor, axis: int | Sequence[int]) -> Tensor:
    return emit(op.expand_dims(x.expr, axis))


def broadcast_to(x: Tensor, shape: Sequence[Dim]) -> Tensor:
    return emit(op.broadcast_to(x.expr, tuple(shape)))


def astype(x: Tensor, dtype: str) -> Tensor:
    return x.astype(dtype)


def sum(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return emit(op.sum(x.expr, axis, keepdims))


def mean(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    return emit(op.mean(x.expr, axis, keepdims))


def topk(x: Tensor, k: Dim, axis: int = -1, largest: bool = True) -> tuple[Tensor, Tensor]:
    """``(values, indices)`` of the ``k`` largest (smallest) elements along ``axis``, in order;
    the indices int64 (``tilework.op.search.topk``)."""
    values, indices = emit_tuple(op.search.topk(x.expr, k, axis, largest), 2)
    return values, indices


def argmax(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    return emit(op.argmax(x.expr, axis, keepdims))


__all__ = [
    "relu", "gelu", "silu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "maximum", "minimum",
    "where", "matmul", "linear", "softmax", "log_softmax", "rms_norm", "layer_norm", "attention",
    "rotary_embedding", "arange", "take", "concat", "reshape", "permute_dims", "squeeze",
    "expand_dims", "broadcast_to", "astype", "sum", "mean", "argmax", "topk",
]  # fmt: skip
