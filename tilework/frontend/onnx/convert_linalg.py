"""Converter of ONNX's ``Det``: the determinant of ``[..., n, n]`` matrices by LU factorization
with partial pivoting, composed from graph ops and unrolled over the (static) matrix size.

Step ``k`` picks the row at or below ``k`` with the largest ``|a[i, k]|`` (the first one on a
tie, as LAPACK's ``getrf``), swaps it into row ``k`` (a gather along the rows; each real swap
flips the sign), multiplies the determinant by the pivot and eliminates column ``k`` below it.
A zero pivot makes the determinant 0 (the elimination then divides by 1 instead, so nothing
becomes NaN). Batch dims may be symbolic; the work is done in float64 and rounded once.
"""

from __future__ import annotations

import numpy as np

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_math import cast_to, scalar_const
from tilework.frontend.onnx.registry import Result, converter
from tilework.ir.dtype import is_float_dtype
from tilework.ir.graph import Constant, Expr
from tilework.op import create, index, manipulate, reduce
from tilework.op import elementwise as ew

# the unrolled factorization emits about 20 bindings per row
MAX_DET_SIZE = 64


@converter("Det", 11, 22)
def _det(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    dtype = ctx.dtype(0)
    if not is_float_dtype(dtype):
        raise ctx.unsupported(f"the input must be a float tensor, got {dtype}")
    if len(shape) < 2:
        raise ctx.unsupported(f"the input must be [..., n, n], got rank {len(shape)}")
    n, m = shape[-2], shape[-1]
    if not isinstance(n, int) or not isinstance(m, int):
        raise ctx.unsupported(f"the matrix size must be static (the factorization is unrolled over it), got {n} x {m}")
    if n != m:
        raise ctx.unsupported(f"the matrices must be square, got {n} x {m}")
    if n > MAX_DET_SIZE:
        raise ctx.unsupported(f"matrices larger than {MAX_DET_SIZE} x {MAX_DET_SIZE} are not supported (got {n} x {n})")
    batch = shape[:-2]
    if n == 0:
        return ctx.emit(create.full(batch, 1.0, dtype))
    f64 = "float64"
    a = cast_to(ctx, ctx.expr(0), f64)
    rows = Constant.of(np.arange(n, dtype=np.int64))  # [n]
    det: Expr = ctx.emit(create.full(batch, 1.0, f64))
    for k in range(n):
        col = ctx.emit(manipulate.squeeze(ctx.emit(manipulate.strided_slice(a, [-1], [k], [k + 1])), [-1]))  # [..., n]
        if k < n - 1:
            cand = ctx.emit(ew.where(ctx.emit(ew.greater_equal(rows, scalar_const(k, "int64"))), ctx.emit(ew.abs(col)), scalar_const(-1.0, f64)))
            p = ctx.emit(reduce.argmax(cand, axis=-1, keepdims=True))  # [..., 1]
            at_k = ctx.emit(ew.equal(rows, scalar_const(k, "int64")))
            at_p = ctx.emit(ew.equal(rows, p))
            src = ctx.emit(ew.where(at_k, p, ctx.emit(ew.where(at_p, scalar_const(k, "int64"), rows))))  # [..., n]
            src = ctx.emit(manipulate.broadcast_to(ctx.emit(manipulate.expand_dims(src, -1)), shape))
            a = ctx.emit(index.gather(a, src, axis=-2))
            swapped = ctx.emit(manipulate.squeeze(ctx.emit(ew.not_equal(p, scalar_const(k, "int64"))), [-1]))
            det = ctx.emit(ew.where(swapped, ctx.emit(ew.neg(det)), det))
            col = ctx.emit(manipulate.squeeze(ctx.emit(manipulate.strided_slice(a, [-1], [k], [k + 1])), [-1]))
        pivot = ctx.emit(manipulate.squeeze(ctx.emit(manipulate.strided_slice(col, [-1], [k], [k + 1])), [-1]))  # [...]
        det = ctx.emit(ew.multiply(det, pivot))
        if k == n - 1:
            break
        zero = ctx.emit(ew.equal(pivot, scalar_const(0.0, f64)))
        safe = ctx.emit(manipulate.expand_dims(ctx.emit(ew.where(zero, scalar_const(1.0, f64), pivot)), -1))  # [..., 1]
        below = ctx.emit(ew.greater(rows, scalar_const(k, "int64")))
        factor = ctx.emit(ew.where(below, ctx.emit(ew.divide(col, safe)), scalar_const(0.0, f64)))  # [..., n]
        row_k = ctx.emit(manipulate.strided_slice(a, [-2], [k], [k + 1]))  # [..., 1, n]
        a = ctx.emit(ew.subtract(a, ctx.emit(ew.multiply(ctx.emit(manipulate.expand_dims(factor, -1)), row_k))))
    return cast_to(ctx, det, dtype)
