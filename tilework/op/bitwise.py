"""Bitwise ops on integer tensors: ``bitwise_and``, ``bitwise_or``, ``bitwise_xor`` (NumPy
broadcasting) and ``bitwise_not``, on the two's complement bits of the dtype; on bool tensors
they are the logical ops (NumPy's and torch's rule). ``bitcast`` reads each element's bytes as
another dtype of the same size (a reinterpretation, not a value conversion; a byte read as
bool is true when nonzero).

They legalize to the loop level's bitwise and ``bitcast`` intrinsics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilework import te
from tilework.ir.dtype import DTYPES, INT_DTYPES, itemsize
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo
from tilework.ir.loop import PExpr, Scalar
from tilework.op.base import InferCtx, Op, OpPattern, broadcast_shapes, make_call, register, tensor_arg, unify_dtype
from tilework.op.kernel import arg, bcast_index, op_name, out_tensor

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

BITWISE_BINARY = ("bitwise_and", "bitwise_or", "bitwise_xor")


def _require_int(dtype: str | None, ctx: InferCtx) -> None:
    if dtype is not None and dtype != "bool" and dtype not in INT_DTYPES:
        raise ctx.error(f"expects integer or bool tensors, got {dtype}")


def _infer_bitwise_binary(call: Call, ctx: InferCtx) -> StructInfo:
    a, b = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    dtype = unify_dtype([a.dtype, b.dtype], ctx)
    _require_int(dtype, ctx)
    if a.shape is None or b.shape is None:
        return TensorInfo(None, dtype, -1 if -1 in (a.ndim, b.ndim) else max(a.ndim, b.ndim))
    return TensorInfo(broadcast_shapes(a.shape, b.shape, ctx), dtype)


def _infer_bitwise_not(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    _require_int(x.dtype, ctx)
    return x


def _bits(name: str, a: PExpr, b: PExpr | None) -> Scalar:
    if a.dtype == "bool":
        if name == "bitwise_not":
            return te.logical_not(a)
        assert b is not None
        return {"bitwise_and": te.logical_and, "bitwise_or": te.logical_or, "bitwise_xor": te.ne}[name](a, b)
    if name == "bitwise_not":
        return te.bitwise_not(a)
    assert b is not None
    return {"bitwise_and": te.bitwise_and, "bitwise_or": te.bitwise_or, "bitwise_xor": te.bitwise_xor}[name](a, b)


def _legalize_bitwise(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = op_name(call)
    shape, dtype = out_tensor(call)
    if name == "bitwise_not":
        x = arg(call, 0, "x")
        out = te.compute(shape, lambda *i: _bits(name, x[i], None), name, dtype)
        return ctx.call_te(name, call.args, [x], [out], call.info)
    a, b = arg(call, 0, "a"), arg(call, 1, "b")

    def f(*i: Scalar) -> Scalar:
        return _bits(name, a[bcast_index(i, a.shape, shape)], b[bcast_index(i, b.shape, shape)])

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [a, b], [out], call.info)


def _infer_bitcast(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    to = str(call.attrs["dtype"])
    if to not in DTYPES:
        raise ctx.error(f"unknown dtype {to!r}; expected one of {', '.join(DTYPES)}")
    if x.dtype is not None and itemsize(x.dtype) != itemsize(to):
        raise ctx.error(f"cannot reinterpret {x.dtype} ({itemsize(x.dtype)} bytes) as {to} ({itemsize(to)} bytes): the sizes must be equal")
    return TensorInfo(x.shape, to, x.ndim)


def _legalize_bitcast(call: Call, ctx: "LegalizeCtx") -> Expr:
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    out = te.compute(shape, lambda *i: te.bitcast(x[i], dtype), "bitcast", dtype)
    return ctx.call_te("bitcast", call.args, [x], [out], call.info)


for _name in BITWISE_BINARY:
    register(Op(_name, _infer_bitwise_binary, OpPattern.BROADCAST, num_args=2, legalize=_legalize_bitwise))
register(Op("bitwise_not", _infer_bitwise_not, OpPattern.ELEMWISE, num_args=1, legalize=_legalize_bitwise))
register(Op("bitcast", _infer_bitcast, OpPattern.ELEMWISE, attrs={"dtype": "int32"}, num_args=1, legalize=_legalize_bitcast))


def bitwise_and(a: Expr, b: Expr) -> Call:
    """``a & b`` elementwise (integers: bits; bool: logical and), with broadcasting."""
    return make_call("bitwise_and", [a, b])


def bitwise_or(a: Expr, b: Expr) -> Call:
    """``a | b`` elementwise (integers: bits; bool: logical or), with broadcasting."""
    return make_call("bitwise_or", [a, b])


def bitwise_xor(a: Expr, b: Expr) -> Call:
    """``a ^ b`` elementwise (integers: bits; bool: logical xor), with broadcasting."""
    return make_call("bitwise_xor", [a, b])


def bitwise_not(x: Expr) -> Call:
    """``~x`` elementwise (integers: every bit flipped; bool: logical not)."""
    return make_call("bitwise_not", [x])


def bitcast(x: Expr, dtype: str) -> Call:
    """``x``'s elements with their bytes read as ``dtype`` (same size); the shape is kept."""
    return make_call("bitcast", [x], dtype=dtype)


__all__ = ["BITWISE_BINARY", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitcast"]
