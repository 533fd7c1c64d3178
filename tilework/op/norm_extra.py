"""Normalizations over channels: ``batch_norm`` (inference mode) and ``group_norm``.
(``layer_norm`` and ``rms_norm`` live in ``tilework.op.nn``.)

- ``batch_norm(x, mean, var, gamma, beta, axis, eps)``: the running statistics of inference
  mode, ``(x - mean) / sqrt(var + eps) * gamma + beta`` with every parameter of shape
  ``[C]`` broadcast along ``axis`` (the channel dim, 1 by default).
- ``group_norm(x, gamma, beta, num_groups, eps)`` over ``x: [N, C, *spatial]``: the ``C``
  channels split into ``num_groups`` consecutive groups; each (sample, group) is normalized by
  its mean and (biased) variance over its channels and every spatial position, then scaled and
  shifted per channel by ``gamma``/``beta`` (``[C]``).

Legalization computes statistics in float32 for float16/bfloat16 and takes the variance
about the mean (two passes), like ``layer_norm``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, shape_str
from tilework.ir.loop import Scalar
from tilework.op.base import (
    InferCtx,
    Op,
    OpPattern,
    int_attr,
    make_call,
    normalize_axis,
    register,
    require_equal,
    require_float,
    tensor_arg,
    unify_dtype,
)
from tilework.op.kernel import Index, arg, compute_dtype, out_tensor

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

_BN_PARAMS = ("mean", "var", "gamma", "beta")


def _eps(call: Call, ctx: InferCtx) -> None:
    v = call.attrs["eps"]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ctx.error(f"attribute eps must be a number, got {v!r}")


def _per_channel(x: TensorInfo, params: list[tuple[str, TensorInfo]], axis: int, ctx: InferCtx) -> None:
    for name, p in params:
        if p.ndim not in (-1, 1):
            raise ctx.shape_error(f"{name} must be 1-D [channels], got shape {shape_str(p.shape)}")
        if x.shape is not None and p.shape is not None:
            require_equal(x.shape[axis], p.shape[0], ctx, f"{name} {shape_str(p.shape)} does not match the channels of input {shape_str(x.shape)}")


def _infer_batch_norm(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    params = [(n, tensor_arg(call, i + 1, ctx)) for i, n in enumerate(_BN_PARAMS)]
    require_float(x, ctx)
    _eps(call, ctx)
    dtype = unify_dtype([x.dtype] + [p.dtype for _, p in params], ctx)
    axis = int_attr(call, "axis", ctx)
    if x.ndim != -1:
        axis = normalize_axis(axis, x.ndim, ctx)
        _per_channel(x, params, axis, ctx)
    return TensorInfo(x.shape, dtype, x.ndim)


def _infer_group_norm(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    params = [("gamma", tensor_arg(call, 1, ctx)), ("beta", tensor_arg(call, 2, ctx))]
    require_float(x, ctx)
    _eps(call, ctx)
    dtype = unify_dtype([x.dtype] + [p.dtype for _, p in params], ctx)
    groups = int_attr(call, "num_groups", ctx)
    if groups < 1:
        raise ctx.error(f"num_groups must be >= 1, got {groups}")
    if x.ndim not in (-1,) and x.ndim < 2:
        raise ctx.shape_error(f"input must be [batch, channels, *spatial], got shape {shape_str(x.shape)}")
    if x.ndim != -1:
        _per_channel(x, params, 1, ctx)
    if x.shape is not None:
        c = x.shape[1]
        rem = sym.floormod(c, groups)
        if isinstance(rem, int) and rem != 0:
            raise ctx.shape_error(f"channels {c} of input {shape_str(x.shape)} do not split into {groups} groups")
        if rem != 0:
            ctx.require("divides", (c, groups), f"channels {sym.to_str(c)} of input {shape_str(x.shape)} must split into {groups} groups")
    return TensorInfo(x.shape, dtype, x.ndim)


# -- legalization ---------------------------------------------------------------------------


def _legalize_batch_norm(call: Call, ctx: "LegalizeCtx") -> Expr:
    x = arg(call, 0, "x")
    mean, var, gamma, beta = (arg(call, i + 1, n) for i, n in enumerate(_BN_PARAMS))
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    axis = normalize_axis(int(call.attrs["axis"]), x.ndim, InferCtx("batch_norm"))
    eps = float(call.attrs["eps"])

    # the per-channel scale once per call, its own stage (an rsqrt is not inlined where it
    # would be recomputed: channel-last data would take one per element)
    scale = te.compute((x.shape[axis],), lambda c: te.rsqrt(te.cast(var[c], acc) + eps) * te.cast(gamma[c], acc), "batch_norm_scale", acc)

    def f(*i: Scalar) -> Scalar:
        c = (i[axis],)
        return (te.cast(x[i], acc) - te.cast(mean[c], acc)) * scale[c] + te.cast(beta[c], acc)

    out = te.compute(shape, f, "batch_norm", dtype)
    return ctx.call_te("batch_norm", call.args, [x, mean, var, gamma, beta], [out], call.info)


def _legalize_group_norm(call: Call, ctx: "LegalizeCtx") -> Expr:
    x, gamma, beta = arg(call, 0, "x"), arg(call, 1, "gamma"), arg(call, 2, "beta")
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    groups = int(call.attrs["num_groups"])
    eps = float(call.attrs["eps"])
    per = sym.floordiv(x.shape[1], groups)
    spatial = x.shape[2:]
    count = te.cast(sym.mul(per, sym.product(spatial)), acc)

    def v(idx: Index) -> Scalar:
        return te.cast(x[idx], acc)

    def element(n: Scalar, g: Scalar) -> tuple[list[te.ReduceVar], Index]:
        c = te.reduce_axis(per, "c")
        ks = [te.reduce_axis(d, f"k{k}") for k, d in enumerate(spatial)]
        return [c, *ks], (n, g * per + c, *ks)

    def group_mean(n: Scalar, g: Scalar) -> Scalar:
        axes, idx = element(n, g)
        return te.sum(v(idx), axis=axes) / count

    mean = te.compute((x.shape[0], groups), group_mean, "mean")

    def group_var(n: Scalar, g: Scalar) -> Scalar:
        axes, idx = element(n, g)
        dev = v(idx) - mean[n, g]
        return te.sum(dev * dev, axis=axes) / count

    var = te.compute((x.shape[0], groups), group_var, "var")

    def f(n: Scalar, c: Scalar, *sp: Scalar) -> Scalar:
        g = c // per
        y = (v((n, c, *sp)) - mean[n, g]) * te.rsqrt(var[n, g] + eps)
        return y * te.cast(gamma[c], acc) + te.cast(beta[c], acc)

    out = te.compute(shape, f, "group_norm", dtype)
    return ctx.call_te("group_norm", call.args, [x, gamma, beta], [out], call.info)


register(Op("batch_norm", _infer_batch_norm, OpPattern.BROADCAST, attrs={"axis": 1, "eps": 1e-5}, num_args=5, legalize=_legalize_batch_norm))
register(Op("group_norm", _infer_group_norm, OpPattern.REDUCTION, attrs={"num_groups": 1, "eps": 1e-5}, num_args=3, legalize=_legalize_group_norm))


def batch_norm(x: Expr, mean: Expr, var: Expr, gamma: Expr, beta: Expr, axis: int = 1, eps: float = 1e-5) -> Call:
    """Inference-mode batch normalization with running ``mean``/``var`` over channel ``axis``."""
    return make_call("batch_norm", [x, mean, var, gamma, beta], axis=axis, eps=float(eps))


def group_norm(x: Expr, gamma: Expr, beta: Expr, num_groups: int, eps: float = 1e-5) -> Call:
    """Group normalization of ``x: [N, C, *spatial]`` in ``num_groups`` channel groups."""
    return make_call("group_norm", [x, gamma, beta], num_groups=num_groups, eps=float(eps))


__all__ = ["batch_norm", "group_norm"]
