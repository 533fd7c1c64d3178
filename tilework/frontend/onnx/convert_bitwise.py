"""Converters of ONNX's bitwise ops: ``BitwiseAnd``/``Or``/``Xor``/``Not`` on integer tensors
(two's complement bits, NumPy broadcasting) and ``BitCast`` (each element's bytes read as
another type of the same size)."""

from __future__ import annotations

from typing import Callable

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.registry import Result, converter
from tilework.ir.dtype import INT_DTYPES, itemsize
from tilework.ir.graph import Expr
from tilework.op import bitwise as op_bitwise

_BINARY: dict[str, Callable[[Expr, Expr], Expr]] = {
    "BitwiseAnd": op_bitwise.bitwise_and,
    "BitwiseOr": op_bitwise.bitwise_or,
    "BitwiseXor": op_bitwise.bitwise_xor,
}


def _require_int(ctx: NodeCtx, i: int) -> None:
    dt = ctx.dtype(i)
    if dt not in INT_DTYPES:
        raise ctx.unsupported(f"operand {i} must be an integer tensor, got {dt}")


def _bitwise(fn: Callable[[Expr, Expr], Expr]) -> Callable[[NodeCtx], Result]:
    def conv(ctx: NodeCtx) -> Result:
        _require_int(ctx, 0)
        _require_int(ctx, 1)
        return ctx.emit(fn(ctx.expr(0), ctx.expr(1)))

    return conv


for _onnx, _fn in _BINARY.items():
    converter(_onnx, 18, 18)(_bitwise(_fn))


@converter("BitwiseNot", 18, 18)
def _bitwise_not(ctx: NodeCtx) -> Result:
    _require_int(ctx, 0)
    return ctx.emit(op_bitwise.bitwise_not(ctx.expr(0)))


@converter("BitCast", 26, 26)
def _bitcast(ctx: NodeCtx) -> Result:
    src, to = ctx.dtype(0), ctx.dtype_attr("to")
    if itemsize(src) != itemsize(to):
        raise ctx.unsupported(f"cannot reinterpret {src} ({8 * itemsize(src)} bits) as {to} ({8 * itemsize(to)} bits): the widths must be equal")
    if src == to:
        return ctx.value(0)
    return ctx.emit(op_bitwise.bitcast(ctx.expr(0), to))
