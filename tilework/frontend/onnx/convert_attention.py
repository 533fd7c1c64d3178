"""The converter of ONNX ``Attention`` (schema versions 23-25), built from graph ops:

    Q*sqrt(scale) @ (K*sqrt(scale))^T -> softcap -> + bias (mask, causal, padding) -> softmax -> @ V

3-D inputs (``[batch, seq, heads * head_size]``) are split into heads and joined back; grouped
KV heads are repeated to the query heads; ``past_key``/``past_value`` are concatenated in front
of ``K``/``V`` (the ``present`` outputs). The causal mask is aligned bottom-right: query ``i``
sees key ``j`` when ``j <= i + offset`` with ``offset`` the past length (or, with
``nonpad_kv_seqlen``, the valid length minus the query length, per batch); the sliding window of
version 25 keeps keys ``p - left <= j <= p + right`` around that absolute position ``p``. A query
that sees no key gets a zero row instead of NaN. ``qk_matmul_output`` follows
``qk_matmul_output_mode``.

``FlexAttention`` (domain ``ai.onnx.preview``, version 1) shares the grouped heads and the
scaled scores, and runs its ``score_mod``/``prob_mod`` subgraphs on the scores and the
probabilities (converted inline, their one input bound to the tensor), all in
``softmax_precision``: float32 for 16-bit inputs unless given, which is also the precision of
``probs @ V``; the result has ``V``'s type. Its softmax is ONNX's (a row of -inf scores gives
NaN, as the spec's function body does).
"""

from __future__ import annotations

import math

import numpy as np

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_math import cast_to, scalar_const
from tilework.frontend.onnx.registry import Result, converter
from tilework.frontend.onnx.values import Value
from tilework.ir import sym
from tilework.ir.graph import Constant, Expr
from tilework.ir.sym import Dim
from tilework.op import create, index, linalg, manipulate, nn, pad, reduce
from tilework.op import elementwise as ew


def _heads(ctx: NodeCtx, e: Expr, shape: tuple[Dim, ...], heads: int) -> Expr:
    """``[b, s, h * d]`` -> ``[b, h, s, d]``."""
    b, s, hidden = shape
    x = ctx.emit(manipulate.reshape(e, (b, s, heads, sym.floordiv(hidden, heads))))
    return ctx.emit(manipulate.permute_dims(x, (0, 2, 1, 3)))


def _safe_softmax(ctx: NodeCtx, s: Expr, dtype: str) -> Expr:
    """Softmax over the last axis that gives 0 on a row where every score is -inf."""
    m = ctx.emit(reduce.max(s, -1, keepdims=True))
    neg_inf = scalar_const(-math.inf, dtype)
    dead = ctx.emit(ew.equal(m, neg_inf))
    m = ctx.emit(ew.where(dead, scalar_const(0, dtype), m))
    e = ctx.emit(ew.exp(ctx.emit(ew.subtract(s, m))))
    total = ctx.emit(reduce.sum(e, -1, keepdims=True))
    empty = ctx.emit(ew.equal(total, scalar_const(0, dtype)))
    total = ctx.emit(ew.where(empty, scalar_const(1, dtype), total))
    return ctx.emit(ew.divide(e, total))


def _group_heads(ctx: NodeCtx, k: Expr, v: Expr, heads: Dim) -> tuple[Expr, Expr]:
    """``k`` and ``v`` (``[b, kv_heads, s, d]``) with each kv head repeated for its contiguous
    group of query heads: query head ``h`` uses kv head ``h // (heads // kv_heads)``."""
    kv_heads = ctx.shape_of(k)[1]
    if sym.prove_eq(kv_heads, heads):
        return k, v
    if not (isinstance(heads, int) and isinstance(kv_heads, int)):
        raise ctx.unsupported("grouped KV heads need static head counts")
    if kv_heads <= 0 or heads % kv_heads:
        raise ctx.unsupported(f"{heads} query heads are not a multiple of {kv_heads} kv heads")
    idx = Constant.of(np.arange(heads, dtype=np.int64) // (heads // kv_heads))
    return ctx.emit(manipulate.take(k, idx, 1)), ctx.emit(manipulate.take(v, idx, 1))


def _scaled_scores(ctx: NodeCtx, q: Expr, k: Expr, dtype: str) -> Expr:
    """``(q * sqrt(scale)) @ (k * sqrt(scale))^T`` with the ``scale`` attribute (default
    ``1 / sqrt(head_size)``); scaling both sides keeps 16-bit products in range."""
    if ctx.has_attr("scale"):
        scale = float(ctx.attr("scale"))
    else:
        e = ctx.shape_of(q)[-1]
        if not isinstance(e, int):
            raise ctx.unsupported("a symbolic head size without a scale attribute")
        scale = 1.0 / math.sqrt(e)
    root = scalar_const(math.sqrt(scale), dtype)
    kt = ctx.emit(manipulate.permute_dims(ctx.emit(ew.multiply(k, root)), (0, 1, 3, 2)))
    return ctx.emit(linalg.matmul(ctx.emit(ew.multiply(q, root)), kt))


def _positions(ctx: NodeCtx, n: Dim, shape: tuple[Dim, ...]) -> Expr:
    return ctx.emit(manipulate.reshape(ctx.emit(create.arange(0, n)), shape))


@converter("Attention", 23, 25)
def _attention(ctx: NodeCtx) -> Result:
    qs, ks, vs = ctx.known_shape(0), ctx.known_shape(1), ctx.known_shape(2)
    dtype = ctx.dtype(0)
    q: Expr = ctx.expr(0)
    k: Expr = ctx.expr(1)
    v: Expr = ctx.expr(2)
    three_d = len(qs) == 3
    if three_d:
        hq, hkv = int(ctx.attr("q_num_heads")), int(ctx.attr("kv_num_heads"))
        q, k, v = _heads(ctx, q, qs, hq), _heads(ctx, k, ks, hkv), _heads(ctx, v, vs, hkv)
    b, heads, sq, _ = ctx.shape_of(q)
    if ctx.has_input(4) != ctx.has_input(5):
        raise ctx.unsupported("past_key and past_value must be given together")
    past: Dim = 0
    if ctx.has_input(4):
        past = ctx.known_shape(4)[2]
        k = ctx.emit(manipulate.concat([ctx.expr(4), k], 2))
        v = ctx.emit(manipulate.concat([ctx.expr(5), v], 2))
    present_k, present_v = k, v
    total = ctx.shape_of(k)[2]
    k, v = _group_heads(ctx, k, v, heads)
    qk = _scaled_scores(ctx, q, k, dtype)
    mode = int(ctx.attr("qk_matmul_output_mode", 0))
    debug: list[Expr] = [qk]
    s: Expr = qk
    softcap = float(ctx.attr("softcap", 0.0))
    if softcap > 0:
        cap = scalar_const(softcap, dtype)
        s = ctx.emit(ew.multiply(ctx.emit(ew.tanh(ctx.emit(ew.divide(s, cap)))), cap))
    debug.append(s)
    s = _add_bias(ctx, s, (b, heads, sq, total), past, dtype)
    debug.append(s)
    prec = ctx.attr("softmax_precision", None)
    work = ctx.dtype_attr("softmax_precision") if prec is not None else dtype
    p = cast_to(ctx, _safe_softmax(ctx, cast_to(ctx, s, work), work), dtype)
    debug.append(p)
    y = ctx.emit(linalg.matmul(p, v))
    if three_d:
        y = ctx.emit(manipulate.permute_dims(y, (0, 2, 1, 3)))
        ys = ctx.shape_of(y)
        y = ctx.emit(manipulate.reshape(y, (ys[0], ys[1], sym.mul(ys[2], ys[3]))))
    if not 0 <= mode <= 3:
        raise ctx.unsupported(f"qk_matmul_output_mode={mode}")
    return [y, present_k, present_v, debug[mode]]


def _add_bias(ctx: NodeCtx, s: Expr, full: tuple[Dim, ...], past: Dim, dtype: str) -> Expr:
    """Scores plus the mask, the causal frontier and the padding of ``nonpad_kv_seqlen``."""
    b, _, sq, total = full
    neg_inf = scalar_const(-math.inf, dtype)
    zero = scalar_const(0, dtype)
    if ctx.has_input(3):
        mask = ctx.expr(3)
        mshape = ctx.known_shape(3)
        if not sym.prove_eq(mshape[-1], total) and mshape[-1] != 1:
            fill = scalar_const(False, "bool") if ctx.dtype(3) == "bool" else neg_inf
            pads: list[Dim] = [0] * (2 * len(mshape))
            pads[-1] = sym.sub(total, mshape[-1])
            mask = ctx.emit(pad.pad(mask, fill, pads))
        if ctx.dtype(3) == "bool":
            mask = ctx.emit(ew.where(mask, zero, neg_inf))
        s = ctx.emit(ew.add(s, mask))
    keys = _positions(ctx, total, (1, 1, 1, total))
    nonpad = ctx.expr(6) if ctx.has_input(6) else None
    if nonpad is not None:
        lens = ctx.emit(manipulate.reshape(cast_to(ctx, nonpad, "int64"), (b, 1, 1, 1)))
        s = ctx.emit(ew.where(ctx.emit(ew.less(keys, lens)), s, neg_inf))
    causal = bool(int(ctx.attr("is_causal", 0)))
    left, right = int(ctx.attr("left_window_size", -1)), int(ctx.attr("right_window_size", -1))
    if not causal and left < 0 and right < 0:
        return s
    queries = _positions(ctx, sq, (1, 1, sq, 1))
    if nonpad is not None:
        offset: Expr = ctx.emit(ew.subtract(lens, ctx.imp.materialize(_dim_value(sq))))
    else:
        offset = ctx.imp.materialize(_dim_value(past))
    position = ctx.emit(ew.add(queries, offset))  # the query's absolute position
    bounds: list[tuple[str, int]] = [("le", 0)] if causal else []
    if left >= 0:
        bounds.append(("ge", -left))
    if right >= 0:
        bounds.append(("le", right))
    for kind, shift in bounds:
        edge = ctx.emit(ew.add(position, scalar_const(shift, "int64"))) if shift else position
        keep = ctx.emit(ew.less_equal(keys, edge) if kind == "le" else ew.greater_equal(keys, edge))
        s = ctx.emit(ew.where(keep, s, neg_inf))
    return s


def _dim_value(d: Dim) -> Value:
    return Value.of_elems((d,), "int64", scalar=True)


_SOFTMAX_PRECISIONS = ("float16", "bfloat16", "float32", "float64")


def _modified(ctx: NodeCtx, name: str, x: Expr, dtype: str) -> Expr:
    """``x`` through the subgraph attribute ``name`` when the node has one, in ``dtype``."""
    graph = ctx.attr(name, None)
    if graph is None:
        return x
    outs = ctx.imp.convert_subgraph(graph, [Value.of_expr(x)], ctx)
    if len(outs) != 1:
        raise ctx.unsupported(f"{name} must have exactly one output, got {len(outs)}")
    return cast_to(ctx, ctx.imp.materialize(outs[0]), dtype)


@converter("FlexAttention", 1, 1, domain="ai.onnx.preview")
def _flex_attention(ctx: NodeCtx) -> Result:
    if any(ctx.rank(i) != 4 for i in range(3)):
        raise ctx.unsupported(f"Q, K and V must be rank-4, got shapes {[ctx.known_shape(i) for i in range(3)]}")
    dtype = ctx.dtype(0)
    work = ctx.dtype_attr("softmax_precision") if ctx.has_attr("softmax_precision") else "float32" if dtype in ("float16", "bfloat16") else dtype
    if work not in _SOFTMAX_PRECISIONS:
        raise ctx.unsupported(f"softmax_precision {work} (a float type is required)")
    heads = ctx.known_shape(0)[1]
    k, v = _group_heads(ctx, ctx.expr(1), ctx.expr(2), heads)
    scores = _modified(ctx, "score_mod", cast_to(ctx, _scaled_scores(ctx, ctx.expr(0), k, dtype), work), work)
    probs = _modified(ctx, "prob_mod", ctx.emit(nn.softmax(scores, -1)), work)
    return cast_to(ctx, ctx.emit(linalg.matmul(probs, cast_to(ctx, v, work))), ctx.dtype(2))


@converter("TensorScatter", 24, 24)
def _tensor_scatter(ctx: NodeCtx) -> Result:
    """The cache with ``update`` written along ``axis`` from each batch entry's write index on
    (wrapping around in ``circular`` mode; writes past the end are dropped in ``linear``
    mode): each cache position takes the update row it falls on, or keeps its value."""
    shape, ushape = ctx.known_shape(0), ctx.known_shape(1)
    rank = len(shape)
    axis = int(ctx.attr("axis", -2))
    if not -rank <= axis < rank or axis % rank == 0:
        raise ctx.unsupported(f"axis {axis} for a cache of rank {rank} (the batch axis 0 cannot be the sequence axis)")
    axis %= rank
    mode = ctx.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ctx.unsupported(f"mode={mode!r}")
    if len(ushape) != rank:
        raise ctx.unsupported(f"update {ushape} must have the cache's rank {rank}")
    cache, length, seq = ctx.expr(0), shape[axis], ushape[axis]
    if isinstance(seq, int) and seq == 0:
        return cache
    if not sym.prove_ge(seq, 1):
        raise ctx.unsupported(f"an update length {seq} that may be 0")
    rel = _positions(ctx, length, tuple(length if d == axis else 1 for d in range(rank)))
    if ctx.has_input(2):
        start = ctx.emit(manipulate.reshape(cast_to(ctx, ctx.expr(2), "int64"), (shape[0],) + (1,) * (rank - 1)))
        rel = ctx.emit(ew.subtract(rel, start))
        if mode == "circular":
            rel = ctx.emit(ew.mod(rel, ctx.imp.materialize(_dim_value(length))))
    zero, last = scalar_const(0, "int64"), ctx.imp.materialize(_dim_value(sym.sub(seq, 1)))
    hit = ctx.emit(ew.logical_and(ctx.emit(ew.greater_equal(rel, zero)), ctx.emit(ew.less_equal(rel, last))))
    row = ctx.emit(manipulate.broadcast_to(ctx.emit(ew.minimum(ctx.emit(ew.maximum(rel, zero)), last)), shape))
    return ctx.emit(ew.where(hit, ctx.emit(index.gather(ctx.expr(1), row, axis)), cache))


@converter("RotaryEmbedding", 23, 23)
def _rotary(ctx: NodeCtx) -> Result:
    """Rotate the first ``rotary_embedding_dim`` features of each head by the angles whose
    cosines and sines the caches hold (gathered at ``position_ids`` when given); the pairs are
    the two halves of those features, or neighbours with ``interleaved``."""
    shape = ctx.known_shape(0)
    x = ctx.expr(0)
    four_d = len(shape) == 4
    if four_d:  # (B, H, S, D) -> (B, S, H, D)
        x = ctx.emit(manipulate.permute_dims(x, (0, 2, 1, 3)))
    else:
        heads = int(ctx.attr("num_heads", 0))
        if heads <= 0:
            raise ctx.unsupported("a 3-D input needs num_heads")
        b, s, hidden = shape
        x = ctx.emit(manipulate.reshape(x, (b, s, heads, sym.floordiv(hidden, heads))))
    b, s, h, d = ctx.shape_of(x)
    rd = int(ctx.attr("rotary_embedding_dim", 0)) or d
    if not isinstance(rd, int) or rd % 2:
        raise ctx.unsupported("the rotary dim must be a static even number")
    cos, sin = ctx.expr(1), ctx.expr(2)
    if ctx.has_input(3):
        pos = ctx.expr(3)
        cos, sin = ctx.emit(manipulate.take(cos, pos, 0)), ctx.emit(manipulate.take(sin, pos, 0))
    cos = ctx.emit(manipulate.expand_dims(ctx.emit(manipulate.strided_slice(cos, [2], [0], [rd // 2])), 2))
    sin = ctx.emit(manipulate.expand_dims(ctx.emit(manipulate.strided_slice(sin, [2], [0], [rd // 2])), 2))
    interleaved = bool(int(ctx.attr("interleaved", 0)))
    if interleaved:
        x1 = ctx.emit(manipulate.strided_slice(x, [3], [0], [rd], [2]))
        x2 = ctx.emit(manipulate.strided_slice(x, [3], [1], [rd], [2]))
    else:
        x1 = ctx.emit(manipulate.strided_slice(x, [3], [0], [rd // 2]))
        x2 = ctx.emit(manipulate.strided_slice(x, [3], [rd // 2], [rd]))
    r1 = ctx.emit(ew.subtract(ctx.emit(ew.multiply(x1, cos)), ctx.emit(ew.multiply(x2, sin))))
    r2 = ctx.emit(ew.add(ctx.emit(ew.multiply(x2, cos)), ctx.emit(ew.multiply(x1, sin))))
    if interleaved:
        pairs = ctx.emit(manipulate.concat([ctx.emit(manipulate.expand_dims(r1, 4)), ctx.emit(manipulate.expand_dims(r2, 4))], 4))
        rotated = ctx.emit(manipulate.reshape(pairs, (b, s, h, rd)))
    else:
        rotated = ctx.emit(manipulate.concat([r1, r2], 3))
    if not sym.prove_eq(rd, d):
        rotated = ctx.emit(manipulate.concat([rotated, ctx.emit(manipulate.strided_slice(x, [3], [rd], [None]))], 3))
    if four_d:
        return ctx.emit(manipulate.permute_dims(rotated, (0, 2, 1, 3)))
    return ctx.emit(manipulate.reshape(rotated, shape))
