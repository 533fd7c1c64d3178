"""Converters of ``LSTM``, ``GRU`` and ``RNN``: each direction is one ``rnn`` op (a loop over the
possibly symbolic sequence length inside one kernel) after one matrix product that projects
every step's input at once.

ONNX orders the gates ``(i, o, f, c)`` (LSTM), ``(z, r, h)`` (GRU) and the peepholes
``(i, o, f)``; the weights are regrouped into the ``rnn`` op's order (torch's) by a constant
gather that constant folding evaluates. Only the default activations are converted
(``Relu`` is also accepted for RNN), and not ``input_forget``.
"""

from __future__ import annotations

import numpy as np

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.registry import Result, converter
from tilework.ir import sym
from tilework.ir.graph import Constant, Expr, TupleGetItem
from tilework.ir.sym import Dim
from tilework.op import create, linalg, manipulate, rnn
from tilework.op import elementwise as ew

_ORDER = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2), "RNN": (0,)}
_DEFAULT_ACTS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh"), "RNN": ("tanh",)}


def _cell(ctx: NodeCtx, directions: int) -> str:
    acts = tuple(a.lower() for a in ctx.attr("activations", ()))
    default = _DEFAULT_ACTS[ctx.op_type]
    if ctx.op_type == "RNN" and acts and all(a == "relu" for a in acts):
        return "rnn_relu"
    if acts and acts != default * directions:
        raise ctx.unsupported(f"activations {acts} (only the defaults {default} are supported)")
    if int(ctx.attr("input_forget", 0)):
        raise ctx.unsupported("input_forget=1")
    return {"LSTM": "lstm", "GRU": "gru", "RNN": "rnn_tanh"}[ctx.op_type]


def _pick(ctx: NodeCtx, x: Expr, d: int) -> Expr:
    """Direction ``d`` of a ``[D, ...]`` operand."""
    shape = ctx.shape_of(x)
    row = ctx.emit(manipulate.strided_slice(x, (0,), (d,), (d + 1,)))
    return ctx.emit(manipulate.reshape(row, shape[1:]))


def _regroup(ctx: NodeCtx, x: Expr, order: tuple[int, ...], hidden: Dim) -> Expr:
    """The gate blocks of ``x`` (``[G * H, ...]``) in the ``rnn`` op's order."""
    if order == tuple(range(len(order))):
        return x
    shape = ctx.shape_of(x)
    blocks = ctx.emit(manipulate.reshape(x, (len(order), hidden, *shape[1:])))
    picked = ctx.emit(manipulate.take(blocks, Constant.of(np.asarray(order, np.int64)), 0))
    return ctx.emit(manipulate.reshape(picked, shape))


def _convert(ctx: NodeCtx) -> Result:
    kind = ctx.op_type
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.unsupported(f"direction={direction!r}")
    dirs = 2 if direction == "bidirectional" else 1
    cell = _cell(ctx, dirs)
    order = _ORDER[kind]
    gates = len(order)
    layout = int(ctx.attr("layout", 0))
    x: Expr = ctx.expr(0)
    dtype = ctx.dtype(0)
    if layout:
        x = ctx.emit(manipulate.permute_dims(x, (1, 0, 2)))
    steps, batch, _ = ctx.shape_of(x)
    hidden: Dim = ctx.known_shape(2)[2]
    clip = float(ctx.attr("clip")) if ctx.has_attr("clip") else None
    lbr = bool(int(ctx.attr("linear_before_reset", 0))) if kind == "GRU" else True
    zeros_state = ctx.emit(create.zeros((batch, hidden), dtype))
    if ctx.has_input(4):
        lens = ctx.emit(ew.astype(ctx.expr(4), "int64"))
    else:
        lens = ctx.emit(create.full((batch,), 0, "int64"))
        lens = ctx.emit(ew.add(lens, _scalar(ctx, steps)))
    ys, hs, cs = [], [], []
    for d in range(dirs):
        w = _regroup(ctx, _pick(ctx, ctx.expr(1), d), order, hidden)
        r = _regroup(ctx, _pick(ctx, ctx.expr(2), d), order, hidden)
        xw = ctx.emit(linalg.matmul(x, ctx.emit(manipulate.permute_dims(w, (1, 0)))))
        rb: Expr
        if ctx.has_input(3):
            b = _pick(ctx, ctx.expr(3), d)
            wb = ctx.emit(manipulate.strided_slice(b, (0,), (0,), (sym.mul(gates, hidden),)))
            rb = ctx.emit(manipulate.strided_slice(b, (0,), (sym.mul(gates, hidden),), (sym.mul(2 * gates, hidden),)))
            xw = ctx.emit(ew.add(xw, _regroup(ctx, wb, order, hidden)))
            rb = _regroup(ctx, rb, order, hidden)
        else:
            rb = ctx.emit(create.zeros((sym.mul(gates, hidden),), dtype))
        h0 = _pick(ctx, ctx.expr(5), d) if ctx.has_input(5) else zeros_state
        c0: Expr | None = None
        peep: Expr | None = None
        if cell == "lstm":
            c0 = _pick(ctx, ctx.expr(6), d) if ctx.has_input(6) else zeros_state
            if ctx.has_input(7):
                peep = _regroup(ctx, _pick(ctx, ctx.expr(7), d), (0, 2, 1), hidden)
            else:
                peep = ctx.emit(create.zeros((sym.mul(3, hidden),), dtype))
        reverse = direction == "reverse" or d == 1
        out = ctx.emit(rnn.rnn(xw, r, rb, h0, lens, cell, c0=c0, peep=peep, reverse=reverse, linear_before_reset=lbr, clip=clip))
        ys.append(ctx.emit(manipulate.expand_dims(ctx.emit(TupleGetItem(out, 0)), 1)))
        hs.append(ctx.emit(manipulate.expand_dims(ctx.emit(TupleGetItem(out, 1)), 0)))
        if cell == "lstm":
            cs.append(ctx.emit(manipulate.expand_dims(ctx.emit(TupleGetItem(out, 2)), 0)))
    y: Expr = ys[0] if dirs == 1 else ctx.emit(manipulate.concat(ys, 1))  # [T, D, B, H]
    h: Expr = hs[0] if dirs == 1 else ctx.emit(manipulate.concat(hs, 0))  # [D, B, H]
    c: Expr | None = (cs[0] if dirs == 1 else ctx.emit(manipulate.concat(cs, 0))) if cs else None
    if layout:
        y = ctx.emit(manipulate.permute_dims(y, (2, 0, 1, 3)))
        h = ctx.emit(manipulate.permute_dims(h, (1, 0, 2)))
        c = ctx.emit(manipulate.permute_dims(c, (1, 0, 2))) if c is not None else None
    results: list[Expr | None] = [y, h, c]
    return results[: len(ctx.node.output)]


def _scalar(ctx: NodeCtx, d: Dim) -> Expr:
    """A 0-d int64 tensor holding the dim ``d``."""
    if isinstance(d, int):
        return Constant.of(np.asarray(d, np.int64))
    col = ctx.emit(create.arange(d, sym.add(d, 1), 1, dtype="int64"))
    return ctx.emit(manipulate.reshape(col, ()))


for _op in ("LSTM", "GRU", "RNN"):
    converter(_op, 7, 22)(_convert)
