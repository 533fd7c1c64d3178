"""Converters of ``SwiGLU``, ``LRN``, ``AffineGrid``, ``Col2Im`` and ``MaxUnpool`` as
compositions of graph ops.

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
from tilework.op import conv, create, index, linalg, manipulate, pad
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


@converter("Col2Im", 18, 28, static_inputs=(1, 2))
def _col2im(ctx: NodeCtx) -> Result:
    """Columns ``[N, C * prod(block), L]`` summed back into an image: a transposed convolution,
    grouped per channel, whose one-hot weights send column row ``k`` to kernel tap ``k``."""
    image, block = ctx.ints(1, "image_shape"), ctx.ints(2, "block_shape")
    n = len(image)
    if n not in (1, 2, 3) or len(block) != n:
        raise ctx.unsupported(f"image_shape {image} and block_shape {block} (1 to 3 spatial dims of the same count)")
    strides = tuple(int(s) for s in ctx.attr("strides", (1,) * n))
    dil = tuple(int(d) for d in ctx.attr("dilations", (1,) * n))
    pads = tuple(int(p) for p in ctx.attr("pads", (0,) * (2 * n)))
    shape = ctx.known_shape(0)
    taps = int(np.prod(block))
    if not isinstance(shape[1], int) or shape[1] % taps:
        raise ctx.unsupported(f"the column rows {shape[1]} must be a static multiple of the block size {taps}")
    channels = shape[1] // taps
    blocks = [(image[i] + pads[i] + pads[n + i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(n)]
    if int(np.prod(blocks)) != shape[2]:
        raise ctx.unsupported(f"{shape[2]} columns, but the geometry gives {int(np.prod(blocks))} blocks")
    cols = ctx.emit(manipulate.reshape(ctx.expr(0), (shape[0], shape[1], *blocks)))
    weight = np.zeros((channels * taps, 1, *block), dtype=np.dtype(ctx.dtype(0)))
    for c in range(channels):
        for k, tap in enumerate(itertools.product(*(range(b) for b in block))):
            weight[(c * taps + k, 0, *tap)] = 1
    natural = [(blocks[i] - 1) * strides[i] - pads[i] - pads[n + i] + dil[i] * (block[i] - 1) + 1 for i in range(n)]
    extra = tuple(image[i] - natural[i] for i in range(n))
    call = conv.conv_transpose(cols, Constant.of(weight), None, strides, pads, extra, dil, channels, ndim=n)
    return ctx.emit(call)


@converter("MaxUnpool", 9, 28, static_inputs=(2,))
def _max_unpool(ctx: NodeCtx) -> Result:
    """The values written into zeros at their flat indices (those ``MaxPool`` gives) within the
    unpooled shape; a larger ``output_shape`` pads that with zeros at the end of each dim (as
    the ONNX reference does)."""
    shape = ctx.known_shape(0)
    n = len(shape) - 2
    kernel = ctx.attr("kernel_shape")
    strides = tuple(int(s) for s in ctx.attr("strides", (1,) * n))
    pads = tuple(int(p) for p in ctx.attr("pads", (0,) * (2 * n)))
    spatial = [sym.sub(sym.add(sym.mul(sym.sub(shape[2 + i], 1), strides[i]), int(kernel[i])), pads[i] + pads[n + i]) for i in range(n)]
    natural = (shape[0], shape[1], *spatial)
    flat_x = ctx.emit(manipulate.reshape(ctx.expr(0), (sym.product(shape),)))
    flat_i = ctx.emit(manipulate.reshape(ctx.emit(ew.astype(ctx.expr(1), "int64")), (sym.product(shape),)))
    zeros = ctx.emit(create.zeros((sym.product(natural),), ctx.dtype(0)))
    y = ctx.emit(manipulate.reshape(ctx.emit(index.scatter(zeros, flat_i, flat_x, 0)), natural))
    if not ctx.has_input(2):
        return y
    out = ctx.ints(2, "output_shape")
    grow = [g for g in (sym.sub(o, d) for o, d in zip(out, natural)) if isinstance(g, int) and g >= 0]
    if len(out) != len(natural) or len(grow) != len(out):
        raise ctx.unsupported(f"output_shape {out} must be at least the unpooled shape {natural}")
    return ctx.emit(pad.pad(y, scalar_const(0, ctx.dtype(0)), (0,) * len(out) + tuple(grow)))
