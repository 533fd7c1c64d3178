"""Converters of ``ConvTranspose`` and ``GridSample``.

``ConvTranspose``'s ``output_shape`` (or ``auto_pad``) fixes the total padding of each spatial
dim as ``stride * (d - 1) + output_padding + (k - 1) * dilation + 1 - output_shape``, split
between the two ends as the spec says; an output longer than the natural one becomes extra
``output_padding`` at the end.
"""

from __future__ import annotations

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.registry import Result, converter
from tilework.op import conv, pad


@converter("ConvTranspose", 1, 22)
def _conv_transpose(ctx: NodeCtx) -> Result:
    shape, wshape = ctx.known_shape(0), ctx.known_shape(1)
    n = len(shape) - 2
    if n not in (1, 2, 3):
        raise ctx.unsupported(f"{n}-D transposed convolution (1-D to 3-D are supported)")
    kernel = tuple(ctx.attr("kernel_shape", wshape[2:]))
    strides = tuple(int(s) for s in ctx.attr("strides", (1,) * n))
    dil = tuple(int(d) for d in ctx.attr("dilations", (1,) * n))
    out_pad = [int(p) for p in ctx.attr("output_padding", (0,) * n)]
    pads = [int(p) for p in ctx.attr("pads", (0,) * (2 * n))]
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto not in ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ctx.unsupported(f"auto_pad={auto!r}")
    target = ctx.attr("output_shape", None)
    if target is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        target = tuple(d * s if isinstance(d, int) else None for d, s in zip(shape[2:], strides))
    if auto == "VALID":
        pads = [0] * (2 * n)
    if target is not None:
        target = tuple(target)[-n:]
        for i in range(n):
            d, k = shape[2 + i], kernel[i]
            if not isinstance(d, int) or not isinstance(k, int) or target[i] is None:
                raise ctx.unsupported("output_shape or auto_pad with a symbolic spatial dim")
            total = strides[i] * (d - 1) + out_pad[i] + (k - 1) * dil[i] + 1 - int(target[i])
            small, big = total // 2, total - total // 2
            pads[i], pads[n + i] = (small, big) if auto == "SAME_UPPER" else (big, small)
    for i in range(n):
        if pads[i] < 0:
            raise ctx.unsupported(f"an output_shape that needs negative padding before dim {i}")
        if pads[n + i] < 0:
            out_pad[i] -= pads[n + i]
            pads[n + i] = 0
    bias = ctx.expr(2) if ctx.has_input(2) else None
    call = conv.conv_transpose(ctx.expr(0), ctx.expr(1), bias, strides, tuple(pads), tuple(out_pad), dil, int(ctx.attr("group", 1)), ndim=n)
    return ctx.emit(call)


_GRID_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic", "cubic": "cubic"}


@converter("GridSample", 16, 22)
def _grid_sample(ctx: NodeCtx) -> Result:
    mode = ctx.attr("mode", "bilinear" if ctx.version < 20 else "linear")
    if mode not in _GRID_MODES:
        raise ctx.unsupported(f"mode={mode!r}")
    padding = ctx.attr("padding_mode", "zeros")
    if padding not in pad.GRID_PADDINGS:
        raise ctx.unsupported(f"padding_mode={padding!r}")
    return ctx.emit(pad.grid_sample(ctx.expr(0), ctx.expr(1), _GRID_MODES[mode], padding, bool(ctx.attr("align_corners", 0))))
