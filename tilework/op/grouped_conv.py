"""``grouped_conv2d_nhwc``: a grouped 2-D convolution (``G`` groups of ``Cg > 1`` input
channels each; neither dense nor depthwise: RegNet's group width 8, ResNeXt's 32x4d) over
channel-last data, computed directly: no column matrix, no transpose.

``grouped_conv2d_nhwc(x, weight, bias, groups, kernel, strides, padding, dilation)`` takes
``x: [N, H, W, G * Cg]`` and ``weight: [KH * KW * Cg, G * Og]`` (torch's ``[G * Og, Cg, KH,
KW]`` as ``tilework.transform.conv_gemm.direct_weight_matrix`` lays it out: ``weight[(i * KW
+ j) * Cg + c, g * Og + o]`` is ``w[g * Og + o, c, i, j]``) and gives ``[N, OH, OW, G, Og]``:
``y[n, oh, ow, g, o] = bias[g * Og + o] + sum over i, j, c of x[n, oh * sh - top + i * dh, ow
* sw - left + j * dw, g * Cg + c] * weight[(i * KW + j) * Cg + c, g * Og + o]`` (zero where
the tap falls in the padding). Viewed as ``[N, OH, OW, G * Og]`` that is the conv's
channel-last result. ``padding`` is ``(top, left, bottom, right)``.

Legalization: one sum of the ``KH * KW * Cg`` products per output, the products of each
tap a chain of its own, the chains added pairwise (9 independent chains of FMAs for a 3x3
kernel, where one chain a kernel row left the FMA latency exposed: RegNet-Y's 14 x 14 and
7 x 7 layers of group width 8 ran 10-20% slower), vectorized along a group's
output channels (the innermost dim): each input value is one scalar broadcast to all of
them, each tap and input channel's weights a contiguous row. With padding the input is
first copied into a zero-padded buffer, so that no tap is clamped or masked (clamped and
masked taps, as ``depthwise_conv2d_nhwc`` reads them, ran RegNet-Y's stride-1 layers 1.3-1.7x
slower at batch 8, copy included; only the 56 x 56 stride-2 one was no slower). The op is
``out_ewise_fusable``: an elementwise epilogue of its 5-D result fuses into the sum, a
producer is not inlined (it would be computed once per tap). Behind ``conv_gemm``'s 4-D view
(a ``vm_view`` after ``rewrite_reshape_to_view``, a barrier to fusion) a ReLU is a kernel of
its own, or fuses into a transpose back to channel-first (RegNet-Y-400MF, 1 thread: its 16
ReLUs 0.09 ms of 12.5 at batch 1, 0.47 of 91 at batch 8).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Sequence

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, shape_str
from tilework.ir.loop import Scalar
from tilework.op.base import InferCtx, int_attr, Op, OpPattern, make_call, register, require_equal, tensor_arg
from tilework.op.conv import _call_gather
from tilework.op.conv_nhwc import _conv_args, _out_spatial, _padded_nhwc
from tilework.op.kernel import arg, compute_dtype, out_tensor

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx


def _infer_grouped_nhwc(call: Call, ctx: InferCtx) -> StructInfo:
    x, w, window = _conv_args(call, ctx)
    kernel = window[0]
    g = int_attr(call, "groups", ctx)
    if g < 1:
        raise ctx.error(f"groups must be >= 1, got {g}")
    if x.ndim not in (-1, 4) or w.ndim not in (-1, 2):
        raise ctx.shape_error(f"takes x [batch, height, width, channels] and weight [taps * group channels, out channels], got shapes {shape_str(x.shape)} and {shape_str(w.shape)}")
    if x.shape is None or w.shape is None:
        return TensorInfo(None, x.dtype, 5)
    red, o = w.shape
    taps = kernel[0] * kernel[1]
    if not (isinstance(red, int) and isinstance(o, int)) or red % taps or o % g:
        raise ctx.shape_error(f"weight {shape_str(w.shape)} must be static, {taps} taps of each group's channels by {g} group(s) of output channels")
    require_equal(x.shape[3], g * (red // taps), ctx, f"input channels of {shape_str(x.shape)} must be {g} group(s) of {red // taps} (weight {shape_str(w.shape)})")
    if len(call.args) == 3:
        b = tensor_arg(call, 2, ctx)
        if b.ndim not in (-1, 1) or (b.shape is not None and not (isinstance(b.shape[0], int) and b.shape[0] == o)):
            raise ctx.shape_error(f"bias must be [{o}], got shape {shape_str(b.shape)}")
    return TensorInfo((x.shape[0], *_out_spatial(x.shape, window, ctx), g, o // g), x.dtype)


def _legalize_grouped_nhwc(call: Call, ctx: "LegalizeCtx") -> Expr:
    x, w = arg(call, 0, "x"), arg(call, 1, "weight")
    bias = arg(call, 2, "bias") if len(call.args) == 3 else None
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    (kh, kw), strides, padding, dilation = (tuple(call.attrs[a]) for a in ("kernel", "strides", "padding", "dilation"))
    og, red = shape[4], w.shape[0]
    assert isinstance(red, int) and isinstance(og, int)  # (_infer_grouped_nhwc)
    cg = red // (kh * kw)
    x_in, x = _padded_nhwc(ctx, call.args[0], x, padding, 0.0, "grouped_conv_pad")

    def f(nn: Scalar, oh: Scalar, ow: Scalar, g: Scalar, o: Scalar) -> Scalar:
        chains: list[Scalar] = []  # one partial sum per tap: independent chains of FMAs
        for i, j in itertools.product(range(kh), range(kw)):
            h = sym.add(sym.mul(oh, strides[0]), i * dilation[0])  # type: ignore[arg-type]
            wi = sym.add(sym.mul(ow, strides[1]), j * dilation[1])  # type: ignore[arg-type]
            part: Scalar | None = None
            for c in range(cg):
                v = te.cast(x[nn, h, wi, g * cg + c], acc) * te.cast(w[(i * kw + j) * cg + c, g * og + o], acc)
                part = v if part is None else part + v
            assert part is not None
            chains.append(part)
        while len(chains) > 1:  # added pairwise: a tree, not another chain
            chains = [chains[k] + chains[k + 1] if k + 1 < len(chains) else chains[k] for k in range(0, len(chains), 2)]
        total = chains[0]
        return te.cast(total if bias is None else te.cast(bias[g * og + o], acc) + total, dtype)

    out = te.compute(tuple(shape), f, "grouped_conv_nhwc", dtype)
    inputs = [x, w] if bias is None else [x, w, bias]
    return _call_gather(ctx, "grouped_conv_nhwc", [x_in, *call.args[1:]], inputs, [out], call.info)


register(Op("grouped_conv2d_nhwc", _infer_grouped_nhwc, OpPattern.OUT_EWISE_FUSABLE, attrs={"groups": None, "kernel": None, "strides": None, "padding": None, "dilation": None}, legalize=_legalize_grouped_nhwc))


def grouped_conv2d_nhwc(x: Expr, weight: Expr, bias: Expr | None, groups: int, kernel: Sequence[int], strides: Sequence[int] = (1, 1), padding: Sequence[int] = (0, 0, 0, 0), dilation: Sequence[int] = (1, 1)) -> Call:
    """A conv of ``groups`` groups of ``x: [N, H, W, G * Cg]`` with ``weight: [KH * KW * Cg, G
    * Og]``: ``[N, OH, OW, G, Og]`` (see the module docstring)."""
    args = [x, weight] if bias is None else [x, weight, bias]
    return make_call("grouped_conv2d_nhwc", args, groups=int(groups), kernel=tuple(kernel), strides=tuple(strides), padding=tuple(padding), dilation=tuple(dilation))


__all__ = ["grouped_conv2d_nhwc"]
