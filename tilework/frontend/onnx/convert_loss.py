"""Converters of the ONNX losses ``NegativeLogLikelihoodLoss`` and ``SoftmaxCrossEntropyLoss``.

Both pick, for every sample (and spatial position), the input at the target class along axis 1
(``gather``), weigh it by the class weight and reduce (``none``, ``sum`` or ``mean``, where the
mean divides by the total weight). A target equal to ``ignore_index`` weighs 0; it is replaced by
class 0 before the gather so that no out-of-range class is read.
"""

from __future__ import annotations

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_math import scalar_const
from tilework.frontend.onnx.registry import Result, converter
from tilework.ir.graph import Expr
from tilework.op import elementwise as ew
from tilework.op import index, manipulate, nn, reduce


def _nll(ctx: NodeCtx, logp: Expr, target: Expr, weight: Expr | None) -> Expr:
    """The reduced negative log-likelihood of ``logp`` (N, C, d...) at ``target`` (N, d...)."""
    dtype = ctx.dtype(0)
    reduction = ctx.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.unsupported(f"reduction={reduction!r}")
    ignore = ctx.attr("ignore_index", None)
    tdtype = ctx.dtype(1)
    valid: Expr | None = None
    if ignore is not None:
        valid = ctx.emit(ew.not_equal(target, scalar_const(int(ignore), tdtype)))
        target = ctx.emit(ew.where(valid, target, scalar_const(0, tdtype)))
    picked = ctx.emit(index.gather(logp, ctx.emit(manipulate.expand_dims(target, 1)), 1))
    loss = ctx.emit(ew.neg(ctx.emit(manipulate.squeeze(picked, 1))))
    w: Expr | None = None
    if weight is not None:
        w = ctx.emit(manipulate.take(weight, target, 0))
    if valid is not None:
        mask = ctx.emit(ew.astype(valid, dtype))
        w = mask if w is None else ctx.emit(ew.multiply(w, mask))
    if w is not None:
        loss = ctx.emit(ew.multiply(loss, w))
    if reduction == "none":
        return loss
    total = ctx.emit(reduce.sum(loss))
    if reduction == "sum":
        return total
    if w is None:
        return ctx.emit(reduce.mean(loss))
    return ctx.emit(ew.divide(total, ctx.emit(reduce.sum(w))))


@converter("NegativeLogLikelihoodLoss", 12, 22)
def _nll_loss(ctx: NodeCtx) -> Result:
    return _nll(ctx, ctx.expr(0), ctx.expr(1), ctx.expr(2) if ctx.has_input(2) else None)


@converter("SoftmaxCrossEntropyLoss", 12, 13)
def _softmax_ce(ctx: NodeCtx) -> Result:
    logp = ctx.emit(nn.log_softmax(ctx.expr(0), 1))
    loss = _nll(ctx, logp, ctx.expr(1), ctx.expr(2) if ctx.has_input(2) else None)
    return [loss, logp]
