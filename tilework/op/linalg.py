"""Linear algebra: ``matmul`` (NumPy ``matmul`` semantics, batched and broadcast) and ``linear``
(``x @ weight.T + bias`` with torch's ``[out_features, in_features]`` weight layout).

The contracted dims must be equal: a provable mismatch is an error, an unprovable one a run-time
check. Batch dims broadcast symbolically like elementwise ops.

Legalization accumulates in the result's dtype (float32 for float16/bfloat16 results).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilework import te
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, shape_str
from tilework.ir.loop import Scalar
from tilework.ir.sym import Dim
from tilework.op.base import (
    InferCtx,
    Op,
    OpPattern,
    broadcast_dims,
    dtype_attr,
    make_call,
    register,
    require_equal,
    tensor_arg,
    unify_dtype,
)
from tilework.op.kernel import arg, bcast_index, compute_dtype, out_tensor

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx


def _matmul_ndim(na: int, nb: int) -> int:
    if na == -1 or nb == -1:
        return -1
    if na == 1 and nb == 1:
        return 0
    if na == 1:
        return nb - 1
    if nb == 1:
        return na - 1
    return na if na > nb else nb


def matmul_shape(sa: tuple[Dim, ...], sb: tuple[Dim, ...], ctx: InferCtx) -> tuple[Dim, ...]:
    """The shape of ``a @ b``: a 1-D ``a`` is a row, a 1-D ``b`` a column (both dropped after)."""
    a2 = (1,) + sa if len(sa) == 1 else sa
    b2 = sb + (1,) if len(sb) == 1 else sb
    require_equal(a2[-1], b2[-2], ctx, f"contracted dims of {shape_str(sa)} and {shape_str(sb)} differ")
    ba, bb = a2[:-2], b2[:-2]
    n = len(ba) if len(ba) > len(bb) else len(bb)
    pa = (1,) * (n - len(ba)) + ba
    pb = (1,) * (n - len(bb)) + bb
    batch = tuple(broadcast_dims(x, y, ctx, sa, sb) for x, y in zip(pa, pb))
    rows = (a2[-2],) if len(sa) > 1 else ()
    cols = (b2[-1],) if len(sb) > 1 else ()
    return batch + rows + cols


def _infer_matmul(call: Call, ctx: InferCtx) -> StructInfo:
    a, b = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    out_dtype = dtype_attr(call, "out_dtype", ctx)
    dtype = unify_dtype([a.dtype, b.dtype], ctx)
    if out_dtype is not None:
        dtype = out_dtype
    if a.ndim == 0 or b.ndim == 0:
        raise ctx.shape_error(f"operands must have at least one dim, got shapes {shape_str(a.shape)} and {shape_str(b.shape)}")
    if a.shape is None or b.shape is None:
        return TensorInfo(None, dtype, _matmul_ndim(a.ndim, b.ndim))
    return TensorInfo(matmul_shape(a.shape, b.shape, ctx), dtype)


def _infer_linear(call: Call, ctx: InferCtx) -> StructInfo:
    if len(call.args) not in (2, 3):
        raise ctx.error(f"takes (x, weight) or (x, weight, bias), got {len(call.args)} argument(s)")
    x, w = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    bias = tensor_arg(call, 2, ctx) if len(call.args) == 3 else None
    dtype = unify_dtype([x.dtype, w.dtype] + ([bias.dtype] if bias else []), ctx)
    if x.ndim == 0:
        raise ctx.shape_error("input must have at least one dim, got shape ()")
    if w.ndim not in (-1, 2):
        raise ctx.shape_error(f"weight must be 2-D [out_features, in_features], got shape {shape_str(w.shape)}")
    if bias is not None and bias.ndim not in (-1, 1):
        raise ctx.shape_error(f"bias must be 1-D [out_features], got shape {shape_str(bias.shape)}")
    out_features: Dim | None = None
    if w.shape is not None:
        out_features = w.shape[0]
        if x.shape is not None:
            require_equal(x.shape[-1], w.shape[1], ctx, f"in_features of input {shape_str(x.shape)} and weight {shape_str(w.shape)} differ")
    if bias is not None and bias.shape is not None:
        if out_features is None:
            out_features = bias.shape[0]
        else:
            require_equal(out_features, bias.shape[0], ctx, f"out_features of weight {shape_str(w.shape)} and bias {shape_str(bias.shape)} differ")
    if x.shape is None or out_features is None:
        return TensorInfo(None, dtype, x.ndim)
    return TensorInfo(x.shape[:-1] + (out_features,), dtype)


# -- legalization ---------------------------------------------------------------------------


def _legalize_matmul(call: Call, ctx: "LegalizeCtx") -> Expr:
    a, b = arg(call, 0, "a"), arg(call, 1, "b")
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    nbatch = len(shape) - (0 if a_vec else 1) - (0 if b_vec else 1)
    batch_shape = shape[:nbatch]

    def f(*i: Scalar) -> Scalar:
        batch = i[:nbatch]
        row = () if a_vec else (i[nbatch],)
        col = () if b_vec else (i[-1],)
        k = te.reduce_axis(a.shape[-1], "k")
        ai = bcast_index(batch, a.shape[:-2], batch_shape) + row + (k,)
        bi = bcast_index(batch, b.shape[:-2], batch_shape) + (k,) + col
        return te.sum(te.cast(a[ai], acc) * te.cast(b[bi], acc), axis=k)

    out = te.compute(shape, f, "matmul", dtype)
    return ctx.call_te("matmul", call.args, [a, b], [out], call.info)


def _legalize_linear(call: Call, ctx: "LegalizeCtx") -> Expr:
    x, w = arg(call, 0, "x"), arg(call, 1, "weight")
    bias = arg(call, 2, "bias") if len(call.args) == 3 else None
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)

    def f(*i: Scalar) -> Scalar:
        k = te.reduce_axis(x.shape[-1], "k")
        total = te.sum(te.cast(x[i[:-1] + (k,)], acc) * te.cast(w[i[-1], k], acc), axis=k)
        return total if bias is None else total + te.cast(bias[i[-1]], acc)

    out = te.compute(shape, f, "linear", dtype)
    inputs = [x, w] if bias is None else [x, w, bias]
    return ctx.call_te("linear", call.args, inputs, [out], call.info)


register(Op("matmul", _infer_matmul, OpPattern.OUT_EWISE_FUSABLE, attrs={"out_dtype": None}, num_args=2, legalize=_legalize_matmul))
register(Op("linear", _infer_linear, OpPattern.OUT_EWISE_FUSABLE, legalize=_legalize_linear))


def matmul(a: Expr, b: Expr, out_dtype: str | None = None) -> Call:
    """``a @ b`` with NumPy semantics; ``out_dtype`` sets the result (accumulation) dtype."""
    return make_call("matmul", [a, b], out_dtype=out_dtype)


def linear(x: Expr, weight: Expr, bias: Expr | None = None) -> Call:
    """``x @ weight.T (+ bias)`` with ``weight`` laid out ``[out_features, in_features]``."""
    return make_call("linear", [x, weight] if bias is None else [x, weight, bias])
