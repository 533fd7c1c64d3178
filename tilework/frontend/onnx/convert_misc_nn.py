"""Converters of ``SwiGLU``, ``LRN`` and ``AffineGrid`` as compositions of graph ops.

- ``SwiGLU``: ``a * sigmoid(alpha * a) * b``.
- ``LRN``: the sum of squares over a window of channels ``[c - floor((size - 1) / 2),
  c + ceil((size - 1) / 2)]`` (zero-padded channel axis, one slice per window position), then
  ``x / (bias + alpha / size * sum) ** beta``.
- ``AffineGrid``: the normalized base grid of the requested (static) spatial size, points
  ``(x, y[, z], 1)`` with ``x`` along the last dim, times ``theta`` transposed.
"""

from __future__ import annotations

import itertools

import numpy as np

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_math import scalar_const
from tilework.frontend.onnx.registry import Result, converter
from tilework.ir import sym
from tilework.ir.graph import Constant
from tilework.op import linalg, manipulate, pad
from tilework.op import elementwise as ew


@converter("SwiGLU", 28, 28)
def _swiglu(ctx: NodeCtx) -> Result:
    a, b = ctx.expr(0), ctx.expr(1)
    dtype = ctx.dtype(0)
    alpha = float(ctx.attr("alpha", 1.0))
    scaled = a if alpha == 1.0 else ctx.emit(ew.multiply(a, scalar_const(alpha, dtype)))
    gate = ctx.emit(ew.multiply(a, ctx.emit(ew.sigmoid(scaled))))
    return ctx.emit(ew.multiply(gate, b))


@converter("LRN", 1, 13)
def _lrn(ctx: NodeCtx) -> Result:
    x, shape, dtype = ctx.expr(0), ctx.known_shape(0), ctx.dtype(0)
    size = int(ctx.attr("size"))
    if size < 1:
        raise ctx.unsupported(f"size={size}")
    alpha, beta, bias = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0))
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    rank = len(shape)
    pads = [0] * (2 * rank)
    pads[1], pads[rank + 1] = before, after
    sq = ctx.emit(ew.multiply(x, x))
    padded = ctx.emit(pad.pad(sq, scalar_const(0.0, dtype), tuple(pads)))
    total = None
    for k in range(size):
        part = ctx.emit(manipulate.strided_slice(padded, (1,), (k,), (sym.add(shape[1], k),)))
        total = part if total is None else ctx.emit(ew.add(total, part))
    assert total is not None
    base = ctx.emit(ew.add(ctx.emit(ew.multiply(total, scalar_const(alpha / size, dtype))), scalar_const(bias, dtype)))
    return ctx.emit(ew.divide(x, ctx.emit(ew.power(base, scalar_const(beta, dtype)))))


@converter("AffineGrid", 20, 28, static_inputs=(1,))
def _affine_grid(ctx: NodeCtx) -> Result:
    size = ctx.ints(1, "size")
    nsp = len(size) - 2
    if nsp not in (2, 3):
        raise ctx.unsupported(f"a size of {len(size)} entries (2-D and 3-D grids are supported)")
    align = bool(int(ctx.attr("align_corners", 0)))
    dtype = ctx.dtype(0)

    def axis(n: int) -> np.ndarray:
        if align:
            return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(n)
        return (np.arange(n) * 2.0 + 1.0) / n - 1.0

    spatial = size[2:]
    coords = [axis(n) for n in spatial]  # per spatial dim, first to last
    points = [tuple(p[::-1]) + (1.0,) for p in itertools.product(*coords)]  # (x, y[, z], 1)
    base = Constant.of(np.asarray(points, dtype=np.dtype(dtype)).reshape(len(points), nsp + 1))
    theta_t = ctx.emit(manipulate.permute_dims(ctx.expr(0), (0, 2, 1)))  # [N, nsp + 1, nsp]
    grid = ctx.emit(linalg.matmul(base, theta_t))  # [N, points, nsp]
    return ctx.emit(manipulate.reshape(grid, (ctx.known_shape(0)[0], *spatial, nsp)))
