"""Converters of ``LinearAttention`` and ``CausalConvWithState`` (schema version 27), the two
ops of gated-DeltaNet and Mamba style layers, built from graph ops.

``CausalConvWithState``: the carried state (zeros without one) is concatenated in front of the
input along the length axis, a depthwise ``conv1d`` without padding runs over the result, and
the new state is its last ``k - 1`` positions; ``silu``/``swish`` is applied in float32.

``LinearAttention`` keeps a state ``S`` (``d_k x d_v``) per KV head, updated each token and
read by ``o_t = scale * q_t^T S_t``. Query heads are grouped onto their KV head (head ``h``
reads KV head ``h // (q_num_heads / kv_num_heads)``) by an extra axis that the KV operands
broadcast along. Everything is computed in float32 and cast back (the state to ``past_state``'s
dtype, or the query's). Where the math gives a closed form, no loop is needed and the sequence
length may be symbolic:

- ``linear``: ``S_t = S_0 + sum_{s<=t} k_s v_s^T``, so ``O = scale * (tril(Q K^T) V + Q S_0)``.
- ``gated``: with ``G_t = sum_{s<=t} g_s`` (a cumsum of the log-space decay, per head or per key
  dim), ``S_t = exp(G_t) S_0 + sum_{s<=t} exp(G_t - G_s) k_s v_s^T``. The weights
  ``exp(G_t - G_s)`` are formed pairwise, masked to ``s <= t`` before the ``exp`` (no overflow of
  ``exp(-G_s)`` on long sequences); per key dim that is a ``T x T x d_k`` tensor per head.

The delta rules (``delta``, ``gated_delta``) make each step read the state it updates
(``v_t - S^T k_t``); they are unrolled over a sequence length known at conversion time
(``convert_control.MAX_UNROLL`` steps at most); a symbolic length is refused, naming the dim.
"""

from __future__ import annotations

import math

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_control import MAX_UNROLL
from tilework.frontend.onnx.convert_math import cast_to, scalar_const
from tilework.frontend.onnx.registry import Result, converter
from tilework.ir import sym
from tilework.ir.graph import Expr
from tilework.ir.sym import Dim
from tilework.op import conv, create, index, linalg, manipulate, reduce
from tilework.op import elementwise as ew

F32 = "float32"


# -- CausalConvWithState ----------------------------------------------------------------------


@converter("CausalConvWithState", 27, 27)
def _causal_conv(ctx: NodeCtx) -> Result:
    activation = ctx.attr("activation", "none")
    if activation not in ("none", "silu", "swish"):
        raise ctx.unsupported(f"activation={activation!r} (one of 'none', 'silu', 'swish')")
    if ctx.rank(0) != 3 or ctx.rank(1) != 3:
        raise ctx.unsupported(f"input and weight must be rank 3, got ranks {ctx.rank(0)} and {ctx.rank(1)}")
    batch, channels, _ = ctx.known_shape(0)
    wch, _, k = ctx.known_shape(1)
    groups = wch if isinstance(wch, int) else channels
    if not isinstance(groups, int):
        raise ctx.unsupported(f"the channel count (dim 0 of the weight, {wch}) must be known at conversion time: it is the depthwise conv's group count")
    if not isinstance(k, int) or k < 1:
        raise ctx.unsupported(f"the kernel size (dim 2 of the weight) must be a static positive int, got {k}")
    dtype = ctx.dtype(0)
    x = ctx.expr(0)
    past = ctx.expr(3) if ctx.has_input(3) else ctx.emit(create.zeros((batch, channels, k - 1), dtype))
    padded = ctx.emit(manipulate.concat([past, x], 2)) if k > 1 else x
    bias = ctx.expr(2) if ctx.has_input(2) else None
    out: Expr = ctx.emit(conv.conv1d(padded, ctx.expr(1), bias, 1, 0, 1, groups))
    if activation != "none":
        out = cast_to(ctx, ctx.emit(ew.silu(cast_to(ctx, out, F32))), dtype)
    total = ctx.shape_of(padded)[2]
    present = ctx.emit(manipulate.strided_slice(padded, (2,), (sym.sub(total, k - 1),), (total,)))
    return [out, present]


# -- LinearAttention --------------------------------------------------------------------------

_RULES = {"linear": (False, False), "gated": (True, False), "delta": (False, True), "gated_delta": (True, True)}


def _grouped(ctx: NodeCtx, e: Expr, heads: int, groups: int) -> Expr:
    """``[b, t, heads * groups * d]`` -> ``[b, heads, groups, t, d]`` in float32."""
    b, t, packed = ctx.shape_of(e)
    x = ctx.emit(manipulate.reshape(cast_to(ctx, e, F32), (b, t, heads, groups, sym.floordiv(packed, heads * groups))))
    return ctx.emit(manipulate.permute_dims(x, (0, 2, 3, 1, 4)))


def _transpose(ctx: NodeCtx, e: Expr) -> Expr:
    """``e`` with its last two axes swapped."""
    n = len(ctx.shape_of(e))
    return ctx.emit(manipulate.permute_dims(e, (*range(n - 2), n - 1, n - 2)))


def _gate(ctx: NodeCtx, i: int, what: str, hkv: int, d_k: Dim, allowed: tuple[Dim, ...]) -> Expr:
    """Operand ``i`` (``[b, t, hkv * d_k]``, ``[b, t, hkv]`` or ``[b, t, 1]``) as
    ``[b, hkv | 1, 1, t, d_k | 1]``."""
    shape = ctx.known_shape(i)
    if len(shape) != 3 or shape[2] not in allowed:
        raise ctx.unsupported(f"{what} must be [batch, seq, n] with n in {list(allowed)}, got shape {shape}")
    heads = 1 if shape[2] == 1 else hkv
    per_dim = shape[2] == sym.mul(hkv, d_k) and shape[2] != hkv
    g = ctx.emit(manipulate.reshape(cast_to(ctx, ctx.expr(i), F32), (shape[0], shape[1], heads, 1, d_k if per_dim else 1)))
    return ctx.emit(manipulate.permute_dims(g, (0, 2, 3, 1, 4)))


def _causal_mask(ctx: NodeCtx, t: Dim) -> Expr:
    """``[t, t]``: true where the key position is at or before the query position."""
    rows = ctx.emit(manipulate.reshape(ctx.emit(create.arange(0, t)), (t, 1)))
    cols = ctx.emit(manipulate.reshape(ctx.emit(create.arange(0, t)), (1, t)))
    return ctx.emit(ew.greater_equal(rows, cols))


def _last(ctx: NodeCtx, e: Expr, axis: int) -> Expr:
    """The last position of ``e`` along ``axis`` (kept as an axis of length 1)."""
    n = ctx.shape_of(e)[axis]
    return ctx.emit(manipulate.strided_slice(e, (axis,), (sym.sub(n, 1),), (n,)))


def _closed_form(ctx: NodeCtx, q: Expr, k: Expr, v: Expr, s0: Expr | None, g: Expr | None) -> tuple[Expr, Expr]:
    """Outputs ``[b, hkv, groups, t, d_v]`` (unscaled) and the final state of the ``linear``
    (``g`` None) and ``gated`` rules, with matmuls over the whole sequence."""
    t = ctx.shape_of(q)[3]
    if g is None:
        scores = ctx.emit(index.tril(ctx.emit(linalg.matmul(q, _transpose(ctx, k)))))
        out = ctx.emit(linalg.matmul(scores, v))
        state = ctx.emit(linalg.matmul(_transpose(ctx, k), v))
        if s0 is not None:
            out = ctx.emit(ew.add(out, ctx.emit(linalg.matmul(q, s0))))
            state = ctx.emit(ew.add(state, s0))
        return out, state
    cum = ctx.emit(index.cumsum(g, axis=3))  # [b, h, 1, t, dk | 1]
    diff = ctx.emit(ew.subtract(ctx.emit(manipulate.expand_dims(cum, 4)), ctx.emit(manipulate.expand_dims(cum, 3))))
    mask = ctx.emit(manipulate.reshape(_causal_mask(ctx, t), (t, t, 1)))
    weights = ctx.emit(ew.exp(ctx.emit(ew.where(mask, diff, scalar_const(-math.inf, F32)))))  # [b, h, 1, t, t, dk | 1]
    pairs = ctx.emit(ew.multiply(ctx.emit(manipulate.expand_dims(q, 4)), ctx.emit(manipulate.expand_dims(k, 3))))
    scores = ctx.emit(reduce.sum(ctx.emit(ew.multiply(pairs, weights)), -1))  # [b, h, groups, t, t]
    out = ctx.emit(linalg.matmul(scores, v))
    final = _last(ctx, cum, 3)  # [b, h, 1, 1, dk | 1]
    to_end = ctx.emit(ew.exp(ctx.emit(ew.subtract(final, cum))))
    state = ctx.emit(linalg.matmul(_transpose(ctx, ctx.emit(ew.multiply(k, to_end))), v))
    if s0 is not None:
        out = ctx.emit(ew.add(out, ctx.emit(linalg.matmul(ctx.emit(ew.multiply(q, ctx.emit(ew.exp(cum)))), s0))))
        kept = ctx.emit(ew.multiply(s0, _transpose(ctx, ctx.emit(ew.exp(final)))))
        state = ctx.emit(ew.add(state, kept))
    return out, state


def _step(ctx: NodeCtx, e: Expr, i: int) -> Expr:
    """Position ``i`` of ``e`` along axis 3 (kept as an axis of length 1)."""
    return ctx.emit(manipulate.strided_slice(e, (3,), (i,), (i + 1,)))


def _unrolled(ctx: NodeCtx, q: Expr, k: Expr, v: Expr, s0: Expr, g: Expr | None, beta: Expr) -> tuple[Expr, Expr]:
    """Outputs (unscaled) and the final state of the delta rules, one token at a time."""
    t = ctx.shape_of(q)[3]
    if not isinstance(t, int):
        raise ctx.unsupported(
            f"the sequence length (dim 1 of query) is the symbolic dim {t}: the {ctx.attr('update_rule', 'gated_delta')!r} "
            "update rule is unrolled over the tokens and needs it known at conversion time"
        )
    if t > MAX_UNROLL:
        raise ctx.unsupported(f"a sequence length of {t} with a delta update rule (at most {MAX_UNROLL} tokens are unrolled)")
    state, outs = s0, []
    for i in range(t):
        if g is not None:
            state = ctx.emit(ew.multiply(state, _transpose(ctx, ctx.emit(ew.exp(_step(ctx, g, i))))))
        k_t = _step(ctx, k, i)  # [b, h, 1, 1, dk]
        recalled = ctx.emit(linalg.matmul(k_t, state))  # [b, h, 1, 1, dv]
        update = ctx.emit(ew.multiply(_step(ctx, beta, i), ctx.emit(ew.subtract(_step(ctx, v, i), recalled))))
        state = ctx.emit(ew.add(state, ctx.emit(linalg.matmul(_transpose(ctx, k_t), update))))
        outs.append(ctx.emit(linalg.matmul(_step(ctx, q, i), state)))
    out = outs[0] if len(outs) == 1 else ctx.emit(manipulate.concat(outs, 3))
    return out, state


@converter("LinearAttention", 27, 27)
def _linear_attention(ctx: NodeCtx) -> Result:
    rule = ctx.attr("update_rule", "gated_delta")
    if rule not in _RULES:
        raise ctx.unsupported(f"update_rule={rule!r} (one of {', '.join(_RULES)})")
    gated, delta = _RULES[rule]
    hq, hkv = int(ctx.attr("q_num_heads")), int(ctx.attr("kv_num_heads"))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise ctx.unsupported(f"q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})")
    for i, what, needed in ((4, "decay", gated), (5, "beta", delta)):
        if ctx.has_input(i) != needed:
            raise ctx.unsupported(f"update_rule {rule!r} {'requires' if needed else 'takes no'} {what} input")
    if any(ctx.rank(i) != 3 for i in range(3)):
        raise ctx.unsupported(f"query, key and value must be rank 3, got ranks {[ctx.rank(i) for i in range(3)]}")
    b, t, q_packed = ctx.known_shape(0)
    d_k = sym.floordiv(q_packed, hq)
    q = _grouped(ctx, ctx.expr(0), hkv, hq // hkv)  # [b, hkv, groups, t, dk]
    k = _grouped(ctx, ctx.expr(1), hkv, 1)  # [b, hkv, 1, t, dk]
    v = _grouped(ctx, ctx.expr(2), hkv, 1)  # [b, hkv, 1, t, dv]
    d_v = ctx.shape_of(v)[4]
    s0: Expr | None = None
    if ctx.has_input(3):
        s0 = ctx.emit(manipulate.expand_dims(cast_to(ctx, ctx.expr(3), F32), 2))  # [b, hkv, 1, dk, dv]
    g = _gate(ctx, 4, "decay", hkv, d_k, (hkv, sym.mul(hkv, d_k))) if gated else None
    scale = float(ctx.attr("scale", 0.0))
    if scale == 0.0:
        if not isinstance(d_k, int) or d_k <= 0:
            raise ctx.unsupported(f"the default scale 1/sqrt(d_k) needs a static head size d_k, got {d_k}")
        scale = 1.0 / math.sqrt(d_k)
    if delta:
        beta = _gate(ctx, 5, "beta", hkv, d_k, (hkv, 1))
        start = s0 if s0 is not None else ctx.emit(create.zeros((b, hkv, 1, d_k, d_v), F32))
        out, state = _unrolled(ctx, q, k, v, start, g, beta)
    else:
        out, state = _closed_form(ctx, q, k, v, s0, g)
    out = ctx.emit(ew.multiply(out, scalar_const(scale, F32)))
    out = ctx.emit(manipulate.permute_dims(out, (0, 3, 1, 2, 4)))  # [b, t, hkv, groups, dv]
    out = cast_to(ctx, ctx.emit(manipulate.reshape(out, (b, t, sym.mul(hq, d_v)))), ctx.dtype(0))
    state = ctx.emit(manipulate.squeeze(state, 2))
    return [out, cast_to(ctx, state, ctx.dtype(3) if ctx.has_input(3) else ctx.dtype(0))]
