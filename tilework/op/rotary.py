"""Rotary position embedding (RoPE): ``rotary_embedding(x, positions, theta, rotary_dim, factor)``.

``x`` is ``[batch, seq, heads, head_dim]`` (the layout of ``attention``); ``positions`` is an
integer tensor ``[seq]`` or ``[batch, seq]`` (broadcast over heads; a leading 1 broadcasts over
the batch) giving the absolute position of every token, so the same op serves prefill
(``arange(0, seq)``) and decoding after a cache of ``n`` tokens (``n + arange(0, seq)``).

The first ``rotary_dim`` (default: all of ``head_dim``; must be even) channels are rotated in
the "rotate half" arrangement used by Llama, GPT-NeoX and most Hugging Face models: with
``half = rotary_dim // 2``, channel ``j < half`` pairs with channel ``j + half``, both turning by
the angle ``p * theta ** (-2 j / rotary_dim)`` at position ``p``::

    out[..., j]        = x[..., j] * cos(a_j) - x[..., j + half] * sin(a_j)
    out[..., j + half] = x[..., j + half] * cos(a_j) + x[..., j] * sin(a_j)

Channels from ``rotary_dim`` on pass through unchanged. The result has ``x``'s shape and dtype.
``factor`` (default 1) divides every angle: transformers' ``linear`` rotary scaling (its
inverse frequencies divided by ``factor``: position ``p`` turns as ``p / factor`` would).

Legalization: one injective kernel; the angle, its sine and cosine and the rotation are
computed in float64 and rounded once to ``x``'s dtype (so the frequencies are exact even at
long positions).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, shape_str
from tilework.ir.loop import Scalar
from tilework.ir.sym import Dim
from tilework.ir.dtype import INT_DTYPES
from tilework.op.base import (
    InferCtx,
    Op,
    OpPattern,
    make_call,
    register,
    require_equal,
    require_expands,
    require_float,
    tensor_arg,
)
from tilework.op.kernel import arg, bcast_index, out_tensor

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx



def _theta(call: Call, ctx: InferCtx) -> float:
    v = call.attrs["theta"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ctx.error(f"attribute theta must be a positive number, got {v!r}")
    return float(v)


def _factor(call: Call, ctx: InferCtx) -> float:
    v = call.attrs["factor"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ctx.error(f"attribute factor must be a positive number, got {v!r}")
    return float(v)


def _rotary_dim(call: Call, head_dim: Dim | None, ctx: InferCtx) -> Dim | None:
    """The number of rotated channels: the attribute, or ``head_dim`` when it is None."""
    v = call.attrs["rotary_dim"]
    if v is None:
        return head_dim
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % 2:
        raise ctx.error(f"attribute rotary_dim must be a positive even int or None, got {v!r}")
    if head_dim is not None and sym.prove_le(head_dim, v - 1):
        raise ctx.shape_error(f"rotary_dim {v} exceeds head_dim {sym.to_str(head_dim)}")
    if head_dim is not None and not sym.prove_ge(head_dim, v):
        ctx.require("ge", (head_dim, v), f"head_dim {sym.to_str(head_dim)} must be >= rotary_dim {v}")
    return v


def _infer_rotary(call: Call, ctx: InferCtx) -> StructInfo:
    x, pos = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    require_float(x, ctx, "x")
    _theta(call, ctx)
    _factor(call, ctx)
    if x.ndim not in (-1, 4):
        raise ctx.shape_error(f"x must be 4-D [batch, seq, heads, head_dim], got shape {shape_str(x.shape)}")
    if pos.dtype is not None and pos.dtype not in INT_DTYPES:
        raise ctx.error(f"positions must be an integer tensor, got {pos.dtype}")
    if pos.ndim not in (-1, 1, 2):
        raise ctx.shape_error(f"positions must be [seq] or [batch, seq], got shape {shape_str(pos.shape)}")
    head_dim = x.shape[3] if x.shape is not None else None
    rd = _rotary_dim(call, head_dim, ctx)
    if rd is not None and not isinstance(rd, int):
        parity = sym.floormod(rd, 2)
        if parity != 0:
            ctx.require("divides", (rd, 2), f"head_dim {sym.to_str(rd)} must be even to be rotated")
    elif isinstance(rd, int) and rd % 2:
        raise ctx.shape_error(f"head_dim {rd} must be even to be rotated (or set an even rotary_dim)")
    if x.shape is not None and pos.shape is not None:
        if pos.ndim == 1:
            require_equal(pos.shape[0], x.shape[1], ctx, f"positions {shape_str(pos.shape)} and the seq dim of x {shape_str(x.shape)}")
        else:
            require_expands(pos.shape, x.shape[:2], ctx, "positions")
    return TensorInfo(x.shape, x.dtype, x.ndim)


def _legalize_rotary(call: Call, ctx: "LegalizeCtx") -> Expr:
    """See the module docstring; only the selected partner channel is loaded."""
    x, pos = arg(call, 0, "x"), arg(call, 1, "positions")
    shape, dtype = out_tensor(call)
    nb, sq = shape[0], shape[1]
    rd = call.attrs["rotary_dim"]
    rd = shape[3] if rd is None else int(rd)
    half = sym.floordiv(rd, 2)
    theta, factor = float(call.attrs["theta"]), float(call.attrs["factor"])
    f64 = "float64"
    # a_j = p * exp(-2 j / rd * ln(theta)); the scale is folded when rd is static
    scale: Scalar = te.constant(-2.0 * math.log(theta) / rd, f64) if isinstance(rd, int) else te.constant(-2.0 * math.log(theta), f64) / te.cast(rd, f64)

    def f(b: Scalar, s: Scalar, h: Scalar, d: Scalar) -> Scalar:
        lower = te.lt(d, half)
        j = te.if_then_else(lower, d, d - half)
        p = te.cast(pos[bcast_index((b, s), pos.shape, (nb, sq))], f64)
        angle = p * te.exp(te.cast(j, f64) * scale)
        if factor != 1.0:  # linear scaling (no extra operation otherwise: the same bits as before)
            angle = angle / te.constant(factor, f64)
        mine = te.cast(x[b, s, h, d], f64)
        partner = te.if_then_else(lower, -te.cast(x[b, s, h, d + half], f64), te.cast(x[b, s, h, d - half], f64))
        rotated = te.cast(mine * te.cos(angle) + partner * te.sin(angle), dtype)
        if rd is shape[3]:
            return rotated
        return te.if_then_else(te.lt(d, rd), rotated, x[b, s, h, d])

    out = te.compute(shape, f, "rotary_embedding", dtype)
    return ctx.call_te("rotary_embedding", call.args, [x, pos], [out], call.info)


register(
    Op(
        "rotary_embedding",
        _infer_rotary,
        OpPattern.INJECTIVE,
        attrs={"theta": 10000.0, "rotary_dim": None, "factor": 1.0},
        num_args=2,
        legalize=_legalize_rotary,
    )
)


def rotary_embedding(x: Expr, positions: Expr, theta: float = 10000.0, rotary_dim: int | None = None, factor: float = 1.0) -> Call:
    """``x`` ``[batch, seq, heads, head_dim]`` rotated by the angles of ``positions`` (divided
    by ``factor``: linear scaling; see the module docstring)."""
    return make_call("rotary_embedding", [x, positions], theta=float(theta), rotary_dim=rotary_dim, factor=float(factor))


__all__ = ["rotary_embedding"]
