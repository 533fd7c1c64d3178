"""conv_gemm: 2-D convolutions with compile-time weights run as matmuls over channel-last data.

``conv2d(x, w, b)`` (one group, float32 or float64, a static ``[O, C, KH, KW]`` weight that is
a constant or a weight param of ``main`` read only as such a weight) becomes
``permute_dims(linear(col, w2, b), (0, 3, 1, 2))``: ``col`` is ``im2col`` of the channel-last
input ``permute_dims(x, (0, 2, 3, 1))`` (that input itself for a 1x1 conv of stride 1 without
padding) and ``w2`` the weight as ``[O, KH * KW * C]`` (``conv_weight_matrix``), laid out at
compile time: a constant is replaced, a weight param retyped and listed in ``main``'s attr
``conv_weights`` (whoever passes the weights converts them: ``layout_weights.pack_weights``).
``layout_weights`` then packs ``w2`` for the matmul kernels like any linear weight. A depthwise
conv (``[C, 1, KH, KW]`` weight, ``C`` groups) becomes ``depthwise_conv2d_nhwc`` of the
channel-last input, its weight as ``[KH * KW, C]`` (``depthwise_weight_matrix``; a weight
param listed in ``depthwise_weights``). A 3x3 conv of stride 1 without dilation, with static
spatial dims and at least ``WINOGRAD_MIN_CHANNELS`` channels in and out, runs as Winograd's
F(2, 3) instead (``tilework.op.winograd``: 4 multiplies per output and channel pair instead of
9): ``winograd_output_nhwc(batch_linear_io(winograd_input_nhwc(x), u), b)``, its weight
transformed and packed at compile time (``winograd_weight``; a weight param listed in
``winograd_weights``). ResNet-18 at batch 8 runs 1.2x faster than through im2col. Where an
image's transformed input is large (``_per_image``: at least ``WINOGRAD_IMAGE_MIN_BYTES``, and
larger than the transformed weight) the three steps are one op, ``winograd_conv_nhwc``, whose
kernel runs them one image at a time, so that the transformed data stays in cache at any
batch (``tilework.op.winograd_images``). A conv of
at most ``DIRECT_MAX_CHANNELS`` input channels (a network's stem, reading an image) and
``DIRECT_MAX_OUT`` output channels becomes
``direct_conv2d_nhwc``: one sum of products per output, reading the channel-first input as it
is, its weight as ``[KH * KW * C, O]`` (``direct_weight_matrix``; a weight param listed in
``direct_conv_weights``): no transpose of the input, no column matrix. A grouped conv of
more than one input channel a group (neither dense nor depthwise: RegNet's group width 8,
ResNeXt's 32x4d) becomes ``grouped_conv2d_nhwc`` of the channel-last input (one sum of products
per output, vectorized along a group's output channels, no column matrix: 2-4x faster than
im2col and per-group products at batch 8), ``[N, OH, OW, G, Og]`` viewed as ``[N, OH, OW,
O]``, its weight as ``direct_weight_matrix`` lays it out (a weight param listed in
``direct_conv_weights`` too); one of more than ``GROUPED_MAX_TERMS`` products an output stays
a ``conv2d``.

Then the transposes sink towards the consumers and cancel: through elementwise ops (whose
other operands are transposed alike, 0-d, or transposed to follow), through a global
average pool (``adaptive_avg_pool2d`` to 1 x 1, or ONNX's ``mean``/``max`` over the spatial
dims: ``global_avg_pool_nhwc``/``max`` of the channel-last data) and a max pool (``max_pool2d_nhwc``;
with ``ceil_mode`` the windows it adds become bottom/right padding, given static spatial dims),
through a batch norm along the channels (a pre-activation norm: axis 3 of the channel-last
data), a concat along the channels (axis 3; pieces that are not channel-last follow,
transposed) and an average pool without padding of a few taps (the sum of a strided slice a
tap, divided by the count), and a transpose of a transpose composes. Before all that, an
average pool without padding of a pointwise conv's output moves before the conv (both linear:
the conv then multiplies a quarter of the pixels under a 2x2 pool). So the data stays
channel-last from one convolution to the next (DenseNet-121's from the stem to the
classifier), and a transpose remains only where channel-first data is read (the output). A
1x1 conv of stride 1 without padding of channel-first data is left as it is (that data is its
own column matrix: a transpose would only cost).

Requires a well-formed module; guarantees a well-formed module computing the same values
(given the converted weights), up to float reassociation.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from tilework.ir.graph import Call, Constant, Expr, GraphFunc, OpRef, Tuple, Var, bindings_of, used_vars
from tilework.ir import sym
from tilework.ir.info import TensorInfo
from tilework.ir.sym import Dim
from tilework.ir.module import IRModule
from tilework.ir.opdef import get as get_op
from tilework.op.base import OpPattern, make_call
from tilework.op.conv_nhwc import depthwise_conv2d_nhwc, direct_conv2d_nhwc, global_avg_pool_nhwc, im2col, max_pool2d_nhwc
from tilework.op.grouped_conv import grouped_conv2d_nhwc
from tilework.op.linalg import batch_linear_io, linear
from tilework.op.elementwise import add, divide
from tilework.op.manipulate import concat, permute_dims, reshape, strided_slice
from tilework.op.winograd import ALPHA, TAPS, tiles, transformed_kernel, winograd_input_nhwc, winograd_output_nhwc
from tilework.op.winograd_images import winograd_conv_nhwc
from tilework.pattern.core import Match, op_call
from tilework.transform.base import Pass
from tilework.transform.dead_code_elimination import DeadCodeElimination
from tilework.transform.layout_rules import PERMUTE_OF_PERMUTE, RESHAPE_OF_RESHAPE, call_of, shape_of
from tilework.transform.panels import PANEL, lay_out, packed_shape
from tilework.transform.rewrite_driver import Rule, apply_rules
from tilework.transform.weight_params import retype_weight_params, weight_params

ATTR = "conv_weights"  # params of main given as [O, C, KH, KW], taken as [O, KH * KW * C]
DEPTHWISE = "depthwise_weights"  # params of main given as [C, 1, KH, KW], taken as [KH * KW, C]
WINOGRAD = "winograd_weights"  # params of main given as [O, C, 3, 3], taken as winograd_weight's
WINOGRAD_MIN_CHANNELS = 32  # fewer input or output channels: im2col (the 16 small products would not pay)
WINOGRAD_IMAGE_MIN_BYTES = 1 << 20  # an image's transformed input at least this: one image at a time
DIRECT = "direct_conv_weights"  # params of main given as [O, C, KH, KW], taken as [KH * KW * C, O]
DIRECT_MAX_CHANNELS = 4  # input channels up to this (an image's) ...
DIRECT_MAX_OUT = 16  # ... and output channels up to this: direct_conv2d_nhwc, no column matrix
GROUPED_MAX_TERMS = 72  # a grouped conv's KH * KW * Cg up to this (a 3x3 of 8 channels a group): grouped_conv2d_nhwc
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
_DTYPES = ("float32", "float64")


def conv_weight_matrix(w: np.ndarray) -> np.ndarray:
    """A ``[O, C, KH, KW]`` conv weight as the ``[O, KH * KW * C]`` matrix ``im2col``'s columns
    multiply (tap-major, channel-minor)."""
    return np.ascontiguousarray(np.asarray(w).transpose(0, 2, 3, 1).reshape(w.shape[0], -1))


def depthwise_weight_matrix(w: np.ndarray) -> np.ndarray:
    """A ``[C, 1, KH, KW]`` depthwise conv weight as the ``[KH * KW, C]`` taps
    ``depthwise_conv2d_nhwc`` reads (tap-major, a contiguous row of channels per tap)."""
    return np.ascontiguousarray(np.asarray(w).reshape(w.shape[0], -1).T)


def direct_weight_matrix(w: np.ndarray) -> np.ndarray:
    """A ``[O, C, KH, KW]`` conv weight as the ``[KH * KW * C, O]`` rows ``direct_conv2d_nhwc``
    reads (``conv_weight_matrix`` transposed: a contiguous row of output channels per tap and
    input channel)."""
    return np.ascontiguousarray(conv_weight_matrix(w).T)


def winograd_weight(w: np.ndarray, panel: int = PANEL) -> np.ndarray:
    """A ``[O, C, 3, 3]`` conv weight as the F(2, 3) convolution multiplies it
    (``tilework.op.winograd``): ``G g GT`` per tap pair, each ``[O, C]`` packed in column panels
    (``lay_out``): ``[16, ceil(O / panel), C, panel]``."""
    u = transformed_kernel(np.asarray(w))
    o, c = u.shape[2:]
    return np.ascontiguousarray(np.stack([lay_out(m, panel) for m in u.reshape(ALPHA * ALPHA, o, c)]))


def _op_name(e: Expr) -> str | None:
    return e.callee.name if isinstance(e, Call) and isinstance(e.callee, OpRef) else None


def _static_weight(info: object) -> tuple[int, int, int, int] | None:
    if not (isinstance(info, TensorInfo) and info.dtype in _DTYPES and info.shape is not None and len(info.shape) == 4):
        return None
    if not all(isinstance(d, int) for d in info.shape):
        return None
    return info.shape  # type: ignore[return-value]


def _operands_ok(call: Call) -> bool:
    """``(x, weight[, bias])`` of a conv2d: a static weight, a 4-D ``x``, one dtype throughout."""
    if len(call.args) not in (2, 3):
        return False
    x, out, w = call.args[0].info, call.info, call.args[1].info
    return (
        _static_weight(w) is not None and isinstance(w, TensorInfo)
        and isinstance(x, TensorInfo) and x.shape is not None and len(x.shape) == 4 and x.dtype == w.dtype
        and isinstance(out, TensorInfo) and out.dtype == x.dtype
    )  # fmt: skip


def _convertible(call: Call) -> bool:
    """A conv2d this pass rewrites, whatever its weight's origin."""
    return _op_name(call) == "conv2d" and int(call.attrs.get("groups", 1)) == 1 and _operands_ok(call)


def _winograd(call: Call) -> bool:
    """A conv ``_convertible`` accepts that runs as F(2, 3) (``tilework.op.winograd``): a 3x3
    kernel of stride 1 without dilation, static spatial dims, and at least
    ``WINOGRAD_MIN_CHANNELS`` channels in and out."""
    if not _convertible(call):
        return False
    w, x = _static_weight(call.args[1].info), call.args[0].info
    assert w is not None and isinstance(x, TensorInfo) and x.shape is not None
    return (
        w[2:] == (TAPS, TAPS) and min(w[:2]) >= WINOGRAD_MIN_CHANNELS
        and tuple(int(i) for i in call.attrs["strides"]) == (1, 1) and tuple(int(i) for i in call.attrs["dilation"]) == (1, 1)
        and all(isinstance(d, int) for d in x.shape[2:])
    )  # fmt: skip


def _w_dtype(call: Call) -> str:
    info = call.args[1].info
    assert isinstance(info, TensorInfo) and info.dtype is not None
    return info.dtype


def _per_image(tiles_per_image: int, c: int, o: int, dtype: str) -> bool:
    """Whether a Winograd conv runs one image at a time (``winograd_conv_nhwc``): where an
    image's transformed input (``16 x tiles x C``) is at least ``WINOGRAD_IMAGE_MIN_BYTES``
    and larger than the transformed weight (``16 x C x O``, read again for every image)."""
    size = np.dtype(dtype).itemsize * ALPHA * ALPHA
    return size * tiles_per_image * c >= WINOGRAD_IMAGE_MIN_BYTES and tiles_per_image >= o


def _pointwise(call: Call) -> bool:
    """A 1x1 conv of stride 1 without padding (its channel-last input is its column matrix)."""
    w = _static_weight(call.args[1].info)
    return w is not None and w[2:] == (1, 1) and tuple(int(i) for i in call.attrs["strides"]) == (1, 1) and not any(int(i) for i in call.attrs["padding"])


def _direct(call: Call) -> bool:
    """A conv ``_convertible`` accepts of at most ``DIRECT_MAX_CHANNELS`` input channels (an
    image's: a network's stem) and ``DIRECT_MAX_OUT`` output channels that is not a pointwise one
    of stride 1 without padding: it runs as ``direct_conv2d_nhwc``. Its column matrix would hold
    ``KH * KW * C`` values a pixel, more than the output's, written and read again, around a
    product the memory traffic bounds (MobileNetV3-Small's stem, 3 -> 16 channels 3x3 / 2, at
    batch 8: im2col and the product 0.66 ms, directly 0.44). With more output channels the
    product's register tiles win (ResNet-18's stem, 3 -> 64 7x7 / 2: 7.7 ms through im2col,
    11.5-13.5 directly, with masked taps or a padded copy)."""
    if not _convertible(call) or _winograd(call):
        return False
    w = _static_weight(call.args[1].info)
    assert w is not None
    return w[1] <= DIRECT_MAX_CHANNELS and w[0] <= DIRECT_MAX_OUT and not _pointwise(call)


def _grouped(call: Call) -> bool:
    """A conv2d of ``groups > 1`` groups of more than one input channel each (neither dense nor
    depthwise) of at most ``GROUPED_MAX_TERMS`` products an output whose other operands are
    as ``_convertible`` wants: it runs as ``grouped_conv2d_nhwc`` of the channel-last input (no
    column matrix). A longer sum is left to im2col and the per-group matmul kernels, which then
    win: 3x3 convs + BN + ReLU at batch 8, 1 thread, im2col -> direct: 4 channels a group (36
    products, 128 channels at 56 x 56) 54 -> 18 ms, 8 (RegNet's) 2-4x faster, but 16 (512
    channels at 14 x 14) 18 -> 29 ms and 32 (1024 at 7 x 7) 10.5 -> 67 ms: the unrolled sum's
    invariant input values no longer fit the registers."""
    groups = int(call.attrs.get("groups", 1)) if _op_name(call) == "conv2d" else 1
    if groups == 1 or not _operands_ok(call):
        return False
    x, ws = call.args[0].info, _static_weight(call.args[1].info)
    assert isinstance(x, TensorInfo) and x.shape is not None and ws is not None  # (_operands_ok)
    return 1 < ws[1] and ws[1] * ws[2] * ws[3] <= GROUPED_MAX_TERMS and ws[0] % groups == 0 and _same(x.shape[1], ws[1] * groups)


def _depthwise(call: Call) -> bool:
    """A conv2d with one input channel per output channel (``[C, 1, KH, KW]`` weight, ``C``
    groups) whose other operands are as ``_convertible`` wants."""
    if _op_name(call) != "conv2d" or len(call.args) not in (2, 3):
        return False
    x, out, w = call.args[0].info, call.info, call.args[1].info
    ws = _static_weight(w)
    return (
        ws is not None and ws[1] == 1 and int(call.attrs.get("groups", 1)) == ws[0] and isinstance(w, TensorInfo)
        and isinstance(x, TensorInfo) and x.shape is not None and len(x.shape) == 4 and _same(x.shape[1], ws[0]) and x.dtype == w.dtype
        and isinstance(out, TensorInfo) and out.dtype == x.dtype
    )  # fmt: skip


def _conv_params(f: GraphFunc) -> list[int]:
    return weight_params(f, lambda p: _static_weight(p.info) is not None, _convertible)


def _winograd_params(f: GraphFunc) -> list[int]:
    return weight_params(f, lambda p: _static_weight(p.info) is not None, _winograd)


def _direct_params(f: GraphFunc) -> list[int]:
    """Weights taken as ``direct_weight_matrix``: those of direct and of grouped convs."""
    return weight_params(f, lambda p: _static_weight(p.info) is not None, lambda c: _direct(c) or _grouped(c))


def _depthwise_params(f: GraphFunc) -> list[int]:
    return weight_params(f, lambda p: _static_weight(p.info) is not None, _depthwise)


def _taps_info(info: TensorInfo) -> TensorInfo:
    assert info.shape is not None
    c, _, kh, kw = (int(d) for d in info.shape)  # type: ignore[arg-type]
    return TensorInfo((kh * kw, c), info.dtype)


def _winograd_info(info: TensorInfo) -> TensorInfo:
    assert info.shape is not None
    o, c = (int(d) for d in info.shape[:2])  # type: ignore[arg-type]
    panels, _, width = packed_shape(o, c)
    return TensorInfo((ALPHA * ALPHA, panels, c, width), info.dtype)


def _direct_info(info: TensorInfo) -> TensorInfo:
    """``_matrix_info`` transposed, as ``direct_weight_matrix`` is ``conv_weight_matrix``'s."""
    o, taps = _matrix_info(info).shape or ()
    return TensorInfo((taps, o), info.dtype)


def _matrix_info(info: TensorInfo) -> TensorInfo:
    assert info.shape is not None
    o, c, kh, kw = (int(d) for d in info.shape)  # type: ignore[arg-type]
    return TensorInfo((o, c * kh * kw), info.dtype)


def _permuted(e: Expr, m: Match, axes: Sequence[int]) -> Expr | None:
    """``y`` when ``e`` is (bound to) ``permute_dims(y, axes)``."""
    v = call_of(e, m, "permute_dims")
    if v is None:
        return None
    a = v.attrs.get("axes")
    return v.args[0] if a is not None and tuple(int(i) for i in a) == tuple(axes) else None


def _same(a: Dim, b: Dim) -> bool:
    return a is b or (isinstance(a, int) and isinstance(b, int) and a == b)


def _rows(e: Expr, m: Match) -> Expr | None:
    """``y`` (``[N, P, C]``) when ``e`` (``[N, H, W, C]``) is (bound to) ``reshape(y, ...)``."""
    v = call_of(e, m, "reshape")
    if v is None:
        return None
    src, dst = shape_of(v.args[0]), shape_of(v)
    if src is None or dst is None or len(src) != 3 or len(dst) != 4:
        return None
    return v.args[0] if _same(src[0], dst[0]) and _same(src[2], dst[3]) else None


def _channels_last(e: Expr, m: Match) -> tuple[Expr, bool] | None:
    """What a channel-first ``e`` is a layout change of: ``y`` with ``e = permute_dims(y,
    TO_NCHW)`` (then False), or ``y`` (``[N, H * W, C]``) with ``e = permute_dims(reshape(y,
    [N, H, W, C]), TO_NCHW)`` (then True)."""
    y = _permuted(e, m, TO_NCHW)
    if y is None:
        return None
    rows = _rows(y, m)
    return (y, False) if rows is None else (rows, True)


class _Convs:
    """The rewrite of the convs of one module: each constant weight is converted once."""

    def __init__(self, params: dict[Var, Var]) -> None:
        self.params = params
        self.constants: dict[tuple[int, object], Constant] = {}
        self.changed = 0  # convs rewritten

    def matrix(self, w: Expr, m: Match, convert: Callable[[np.ndarray], np.ndarray] = conv_weight_matrix) -> Expr | None:
        if isinstance(w, Var) and w in self.params:
            return self.params[w]
        c = m.ctx.resolve(w) if isinstance(w, Var) else w
        if not isinstance(c, Constant):
            return None
        done = self.constants.get((id(c), convert))
        if done is None:
            done = Constant.of(convert(c.data), name=f"{c.name}.hwc" if c.name else "")
            self.constants[(id(c), convert)] = done
        return done

    def depthwise(self, value: Call, m: Match) -> Expr | None:
        """A depthwise conv: ``depthwise_conv2d_nhwc`` of the channel-last input."""
        x, xs, out, w = value.args[0], shape_of(value.args[0]), shape_of(value), _static_weight(value.args[1].info)
        assert xs is not None and out is not None and w is not None
        w2 = self.matrix(value.args[1], m, depthwise_weight_matrix)
        if w2 is None:
            return None
        xt = self.channels_last(x, m)
        self.changed += 1
        attrs = (tuple(int(i) for i in value.attrs[a]) for a in ("strides", "padding", "dilation"))
        return permute_dims(depthwise_conv2d_nhwc(xt, w2, value.args[2] if len(value.args) == 3 else None, w[2:], *attrs), TO_NCHW)

    def direct(self, value: Call, m: Match) -> Expr | None:
        """A conv of few input channels: ``direct_conv2d_nhwc`` of its input, channel-last
        data where the input is a layout change of some, else the channel-first input itself."""
        w2 = self.matrix(value.args[1], m, direct_weight_matrix)
        w = _static_weight(value.args[1].info)
        if w2 is None or w is None:
            return None
        x = value.args[0]
        found = _channels_last(x, m)
        xin, layout = (x, "NCHW") if found is None else (self.channels_last(x, m), "NHWC")
        self.changed += 1
        strides, padding, dilation = (tuple(int(i) for i in value.attrs[a]) for a in ("strides", "padding", "dilation"))
        y = direct_conv2d_nhwc(xin, w2, value.args[2] if len(value.args) == 3 else None, w[2:], strides, padding, dilation, layout)
        return permute_dims(y, TO_NCHW)

    def grouped(self, value: Call, m: Match) -> Expr | None:
        """A grouped conv: ``grouped_conv2d_nhwc`` of the channel-last input (``[N, OH, OW,
        G, Og]``), viewed as ``[N, OH, OW, O]``."""
        w2 = self.matrix(value.args[1], m, direct_weight_matrix)
        w, out = _static_weight(value.args[1].info), shape_of(value)
        if w2 is None or w is None or out is None:
            return None
        n, o, oh, ow = out
        strides, padding, dilation = (tuple(int(i) for i in value.attrs[a]) for a in ("strides", "padding", "dilation"))
        groups = int(value.attrs["groups"])
        y = grouped_conv2d_nhwc(self.channels_last(value.args[0], m), w2, value.args[2] if len(value.args) == 3 else None, groups, w[2:], strides, padding, dilation)
        self.changed += 1
        return permute_dims(reshape(y, (n, oh, ow, o)), TO_NCHW)

    def channels_last(self, x: Expr, m: Match) -> Expr:
        """The ``[N, H, W, C]`` data of the channel-first conv input ``x``."""
        xs = shape_of(x)
        assert xs is not None
        found = _channels_last(x, m)
        return permute_dims(x, TO_NHWC) if found is None else (reshape(found[0], (xs[0], xs[2], xs[3], xs[1])) if found[1] else found[0])

    def winograd(self, value: Call, m: Match) -> Expr | None:
        """A 3x3 conv of stride 1 as F(2, 3): input transform, 16 packed products, output
        transform (with the bias) of the channel-last input."""
        u = self.matrix(value.args[1], m, winograd_weight)
        out, w = shape_of(value), _static_weight(value.args[1].info)
        if u is None or out is None or w is None:
            return None
        (n, _, oh, ow), (o, c) = out, w[:2]
        assert isinstance(oh, int) and isinstance(ow, int)  # static spatial dims (_winograd)
        padding = tuple(int(i) for i in value.attrs["padding"])
        bias = value.args[2] if len(value.args) == 3 else None
        th, tw = tiles(oh), tiles(ow)
        self.changed += 1
        if _per_image(th * tw, c, o, _w_dtype(value)):
            return permute_dims(winograd_conv_nhwc(self.channels_last(value.args[0], m), u, bias, padding, o), TO_NCHW)
        v = winograd_input_nhwc(self.channels_last(value.args[0], m), padding)
        rows = sym.mul(n, th * tw)
        prod = batch_linear_io(reshape(v, (ALPHA * ALPHA, rows, c)), u, o)
        y = winograd_output_nhwc(reshape(prod, (ALPHA, ALPHA, n, th, tw, o)), bias, oh, ow)
        return permute_dims(y, TO_NCHW)

    def rewrite(self, value: Expr, m: Match) -> Expr | None:
        assert isinstance(value, Call)
        if _depthwise(value):
            return self.depthwise(value, m)
        if _winograd(value):
            return self.winograd(value, m)
        if _direct(value):
            return self.direct(value, m)
        if _grouped(value):
            return self.grouped(value, m)
        if not _convertible(value):
            return None
        x = value.args[0]
        xs, out = shape_of(x), shape_of(value)
        w = _static_weight(value.args[1].info)
        assert w is not None and xs is not None and out is not None
        n, o, oh, ow = out
        strides, padding, dilation = (tuple(int(i) for i in value.attrs[a]) for a in ("strides", "padding", "dilation"))
        pointwise = _pointwise(value)
        found = _channels_last(x, m)
        if pointwise and found is None:  # channel-first data is its own column matrix: a transpose would only cost
            wv = value.args[1]
            if not (isinstance(wv, Var) and wv in self.params):
                return None
            self.changed += 1
            return make_call("conv2d", [x, reshape(self.params[wv], w), *value.args[2:]], **dict(value.attrs))  # the retyped weight, viewed as it was
        if pointwise and found is not None and found[1]:
            rows = found[0]  # a pointwise conv of a conv's result: its rows as they are
        else:
            xt = self.channels_last(x, m)
            col = xt if pointwise else im2col(xt, w[2:], strides, padding, dilation)
            rows = reshape(col, (n, sym.mul(oh, ow), w[1] * w[2] * w[3]))
        w2 = self.matrix(value.args[1], m)
        if w2 is None:
            return None
        self.changed += 1
        y = linear(rows, w2, value.args[2] if len(value.args) == 3 else None)
        return permute_dims(reshape(y, (n, oh, ow, o)), TO_NCHW)


def _rank(info: object) -> int:
    return info.ndim if isinstance(info, TensorInfo) else -1


def _spatial_ok(a: Expr, out: Sequence[Dim]) -> bool:
    """A channel-first operand of an op with result shape ``out`` whose rows (``[N, H * W,
    C]``) broadcast like it: its spatial dims are ``out``'s, or both 1."""
    sh = shape_of(a)
    if sh is None or len(sh) != 4:
        return False
    if _same(sh[2], out[2]) and _same(sh[3], out[3]):
        return True
    return isinstance(sh[2], int) and sh[2] == 1 and isinstance(sh[3], int) and sh[3] == 1


def _follow(a: Expr, rows: bool) -> Expr:
    """A channel-first operand ``a`` of an op whose other operands sink: channel-last, as rows
    when the others are rows."""
    t = permute_dims(a, TO_NHWC)
    if not rows:
        return t
    sh = shape_of(a)
    assert sh is not None
    return reshape(t, (sh[0], sym.mul(sh[2], sh[3]), sh[1]))


def _sink(value: Expr, m: Match) -> Expr | None:
    """``op(permute_dims(x, TO_NCHW), ...)`` -> ``permute_dims(op(x, ...), TO_NCHW)`` for an
    elementwise or broadcast op, through the reshape of rows to spatial dims too (``op`` then
    runs on the rows). Its other 4-D operands follow (``_follow``: transposed, one copy each,
    so that the data stays channel-last for the convs after), the 0-d ones stay."""
    assert isinstance(value, Call)
    name = _op_name(value)
    out = shape_of(value)
    if name is None or get_op(name).pattern not in (OpPattern.ELEMWISE, OpPattern.BROADCAST) or out is None or len(out) != 4:
        return None
    found = [(a, _channels_last(a, m)) for a in value.args]
    kinds = {f[1] for _, f in found if f is not None}
    if not kinds:
        return None
    rows = True in kinds  # channel-last operands of both kinds meet as rows
    args: list[Expr] = []
    for a, f in found:
        if rows and _rank(a.info) == 4 and not _spatial_ok(a, out):
            return None
        if f is not None and rows and not f[1]:
            sh = shape_of(a)
            assert sh is not None
            args.append(reshape(f[0], (sh[0], sym.mul(sh[2], sh[3]), sh[1])))
        elif f is not None:
            args.append(f[0])
        elif _rank(a.info) == 0:
            args.append(a)
        elif _rank(a.info) == 4:
            args.append(_follow(a, rows))
        else:
            return None
    y = make_call(name, args, **dict(value.attrs))
    n, c, h, w = out
    return permute_dims(reshape(y, (n, h, w, c)) if rows else y, TO_NCHW)


def _pooled(y: Expr, rows: bool, xs: Sequence[Dim]) -> Expr:
    """``global_avg_pool_nhwc`` (``[N, 1, 1, C]``) of the channel-last ``y`` of the
    channel-first shape ``xs``, given as rows (``[N, H * W, C]``) or not."""
    return global_avg_pool_nhwc(reshape(y, (xs[0], xs[2], xs[3], xs[1])) if rows else y)


def _sink_global_pool(value: Expr, m: Match) -> Expr | None:
    """``adaptive_avg_pool2d(permute_dims(x, TO_NCHW), 1)`` -> the spatial mean of ``x``
    (``global_avg_pool_nhwc``), transposed."""
    assert isinstance(value, Call)
    if tuple(value.attrs.get("output_size") or ()) != (1, 1):
        return None
    found, xs = _channels_last(value.args[0], m), shape_of(value.args[0])
    if found is None or xs is None:
        return None
    return permute_dims(_pooled(*found, xs), TO_NCHW)


def _sink_spatial_reduce(value: Expr, m: Match) -> Expr | None:
    """``mean(permute_dims(x, TO_NCHW), axis=(2, 3))`` (or ``max``: ONNX's GlobalAveragePool
    and GlobalMaxPool) -> the same reduction of ``x`` over its spatial dims (a mean as
    ``global_avg_pool_nhwc``), transposed when the dims are kept (without them it is already
    ``[N, C]``)."""
    assert isinstance(value, Call)
    axis = value.attrs.get("axis")
    out, xs = shape_of(value), shape_of(value.args[0])
    if axis is None or out is None or xs is None or len(out) not in (2, 4) or sorted(int(a) % 4 for a in axis) != [2, 3]:
        return None
    found = _channels_last(value.args[0], m)
    if found is None:
        return None
    y, rows = found
    name, keep = _op_name(value), bool(value.attrs.get("keepdims"))
    if name == "mean":
        pooled = _pooled(y, rows, xs)
        return permute_dims(pooled, TO_NCHW) if keep else reshape(pooled, (out[0], out[1]))
    assert name is not None
    if rows:
        r = make_call(name, [y], axis=(1,), keepdims=keep)
        return permute_dims(reshape(r, (out[0], 1, 1, out[1])), TO_NCHW) if keep else r
    r = make_call(name, [y], axis=(1, 2), keepdims=keep)
    return permute_dims(r, TO_NCHW) if keep else r


def _sink_max_pool(value: Expr, m: Match) -> Expr | None:
    """``max_pool2d(permute_dims(x, TO_NCHW))`` (float, without ``ceil_mode``) -> the
    channel-last pool of ``x``, transposed."""
    assert isinstance(value, Call)
    found, xs = _channels_last(value.args[0], m), shape_of(value.args[0])
    info = value.info
    if found is None or xs is None or value.attrs.get("ceil_mode") or not (isinstance(info, TensorInfo) and info.dtype in _DTYPES):
        return None
    y, rows = found
    y4 = reshape(y, (xs[0], xs[2], xs[3], xs[1])) if rows else y
    pool = max_pool2d_nhwc(y4, *(tuple(int(i) for i in value.attrs[a]) for a in ("pool_size", "strides", "padding", "dilation")))
    return permute_dims(pool, TO_NCHW)


def _sink_ceil_max_pool(value: Expr, m: Match) -> Expr | None:
    """``max_pool2d(permute_dims(x, TO_NCHW), ceil_mode=True)`` (float, static spatial dims) ->
    the channel-last pool of ``x`` with the bottom and right padding grown to cover the windows
    that ``ceil_mode`` adds, transposed. Those windows start inside the input or its top/left
    padding (torch's rule), so each holds an input element and the grown padding (shorter than
    the window) never decides a maximum: GoogLeNet's pools stay channel-last."""
    assert isinstance(value, Call)
    out, xs, info = shape_of(value), shape_of(value.args[0]), value.info
    if not value.attrs.get("ceil_mode") or out is None or xs is None or not (isinstance(info, TensorInfo) and info.dtype in _DTYPES):
        return None
    if not all(isinstance(d, int) for d in (*xs[2:], *out[2:])):
        return None
    size, strides, padding, dilation = (tuple(int(i) for i in value.attrs[a]) for a in ("pool_size", "strides", "padding", "dilation"))
    grown = list(padding)
    for i in range(2):
        o, d = out[2 + i], xs[2 + i]
        assert isinstance(o, int) and isinstance(d, int)
        need = (o - 1) * strides[i] + dilation[i] * (size[i] - 1) + 1 - d - padding[i]
        grown[2 + i] = max(padding[2 + i], need)
    y = _nhwc(value.args[0], m)
    if y is None:
        return None
    return permute_dims(max_pool2d_nhwc(y, size, strides, grown, dilation), TO_NCHW)


def _nhwc(x: Expr, m: Match) -> Expr | None:
    """The ``[N, H, W, C]`` data of the channel-first ``x`` where ``x`` is a layout change of
    some (``_channels_last``), else None."""
    found, xs = _channels_last(x, m), shape_of(x)
    if found is None or xs is None:
        return None
    y, rows = found
    return reshape(y, (xs[0], xs[2], xs[3], xs[1])) if rows else y


def _sink_batch_norm(value: Expr, m: Match) -> Expr | None:
    """``batch_norm(permute_dims(x, TO_NCHW), ..., axis=1)`` -> the batch norm of ``x`` along
    its channel axis (3), transposed: a pre-activation norm (DenseNet's, a ResNet-v2's) keeps
    the data channel-last for the conv after it."""
    assert isinstance(value, Call)
    out = shape_of(value)
    if out is None or len(out) != 4 or int(value.attrs.get("axis", 1)) not in (1, -3):
        return None
    y = _nhwc(value.args[0], m)
    if y is None:
        return None
    attrs = {**dict(value.attrs), "axis": 3}
    return permute_dims(make_call("batch_norm", [y, *value.args[1:]], **attrs), TO_NCHW)


def _sink_concat(value: Expr, m: Match) -> Expr | None:
    """``concat((permute_dims(x, TO_NCHW), ...), axis=1)`` -> the concat of the channel-last
    data along its channel axis (3), transposed, when half the pieces at least are channel-last
    (the others follow: transposed, one copy each). DenseNet's concat of every earlier layer's
    features stays channel-last, so its 1x1 convs run as linears over rows."""
    assert isinstance(value, Call)
    out = shape_of(value)
    tup = m.ctx.resolve(value.args[0]) if isinstance(value.args[0], Var) else value.args[0]
    if out is None or len(out) != 4 or int(value.attrs.get("axis", 0)) not in (1, -3) or not isinstance(tup, Tuple):
        return None
    pieces = [(f, _nhwc(f, m)) for f in tup.fields]
    if 2 * sum(y is not None for _, y in pieces) < len(pieces) or any(_rank(f.info) != 4 for f, _ in pieces):
        return None  # (at most as many transposed copies as pieces that need none)
    nhwc = [y if y is not None else permute_dims(f, TO_NHWC) for f, y in pieces]
    return permute_dims(concat(nhwc, axis=3), TO_NCHW)


AVG_POOL_MAX_TAPS = 9  # an avg pool of at most this many taps sinks as a sum of strided slices


def _sink_avg_pool(value: Expr, m: Match) -> Expr | None:
    """``avg_pool2d(permute_dims(x, TO_NCHW))`` without padding, dilation or ``ceil_mode``, of
    at most ``AVG_POOL_MAX_TAPS`` taps (float) -> the sum of the strided slices of ``x`` that
    each tap reads, divided by the tap count (the legalized pool's order of operations),
    transposed: a DenseNet transition's 2x2 pool keeps the next block channel-last."""
    assert isinstance(value, Call)
    out, info = shape_of(value), value.info
    if out is None or len(out) != 4 or not (isinstance(info, TensorInfo) and info.dtype in _DTYPES):
        return None
    size, strides, padding, dilation = (tuple(int(i) for i in value.attrs[a]) for a in ("pool_size", "strides", "padding", "dilation"))
    if value.attrs.get("ceil_mode") or any(padding) or any(d != 1 for d in dilation) or size[0] * size[1] > AVG_POOL_MAX_TAPS:
        return None
    y = _nhwc(value.args[0], m)
    if y is None:
        return None
    oh, ow = out[2], out[3]
    total: Expr | None = None
    for i in range(size[0]):
        for j in range(size[1]):
            ends = (sym.add(i + 1, sym.mul(strides[0], sym.sub(oh, 1))), sym.add(j + 1, sym.mul(strides[1], sym.sub(ow, 1))))
            tap = strided_slice(y, (1, 2), (i, j), ends, strides)
            total = tap if total is None else add(total, tap)
    assert total is not None
    return permute_dims(divide(total, Constant.of(np.array(size[0] * size[1], dtype=info.dtype))), TO_NCHW)


def _sole_readers(mod: IRModule) -> set[Var]:
    """The vars of the bindings whose first operand is a var that nothing else in the function
    reads (once)."""
    found: set[Var] = set()
    for _, f in mod.graph_funcs():
        bindings = list(bindings_of(f))
        reads = Counter(v for b in bindings for v in used_vars(b.value))
        reads.update(used_vars(f.body.body))
        for b in bindings:
            if isinstance(b.value, Call) and b.value.args and isinstance(b.value.args[0], Var) and reads[b.value.args[0]] == 1:
                found.add(b.var)
    return found


def _pool_first(sole: set[Var]) -> Callable[[Expr, Match], Expr | None]:
    """The rule ``avg_pool2d(conv2d(x, w, b))`` of a pointwise conv (1x1, stride 1, no padding)
    and a strided pool without padding or ``ceil_mode`` -> ``conv2d(avg_pool2d(x), w, b)``:
    both are linear and every window holds all its taps, so they commute, and the conv runs on
    the pooled pixels (a DenseNet transition's 2x2 pool: a quarter of the products). Only for
    the pools in ``sole`` (``_sole_readers``): a conv read elsewhere too would run twice."""

    def rewrite(value: Expr, m: Match) -> Expr | None:
        return _pooled_conv(value, m) if m.ctx.var in sole else None

    return rewrite


def _pooled_conv(value: Expr, m: Match) -> Expr | None:
    assert isinstance(value, Call)
    conv = call_of(value.args[0], m, "conv2d")
    if conv is None or int(conv.attrs.get("groups", 1)) != 1 or not _operands_ok(conv) or not _pointwise(conv):
        return None
    if value.attrs.get("ceil_mode") or any(int(i) for i in value.attrs["padding"]) or all(int(i) == 1 for i in value.attrs["strides"]):
        return None
    pooled = make_call("avg_pool2d", [conv.args[0]], **dict(value.attrs))
    return make_call("conv2d", [pooled, *conv.args[1:]], **dict(conv.attrs))


SINK_RULES = [
    PERMUTE_OF_PERMUTE,
    RESHAPE_OF_RESHAPE,
    Rule("sink_permute", op_call(None), _sink),
    Rule("sink_permute_global_pool", op_call("adaptive_avg_pool2d"), _sink_global_pool),
    Rule("sink_permute_max_pool", op_call("max_pool2d"), _sink_max_pool),
    Rule("sink_permute_ceil_max_pool", op_call("max_pool2d"), _sink_ceil_max_pool),
    Rule("sink_permute_mean", op_call("mean"), _sink_spatial_reduce),
    Rule("sink_permute_max", op_call("max"), _sink_spatial_reduce),
    Rule("sink_permute_batch_norm", op_call("batch_norm"), _sink_batch_norm),
    Rule("sink_permute_concat", op_call("concat"), _sink_concat),
    Rule("sink_permute_avg_pool", op_call("avg_pool2d"), _sink_avg_pool),
]


@dataclass(frozen=True)
class ConvGemm(Pass):
    """See the module docstring. ``params``: convert ``main``'s trailing conv weight params too."""

    params: bool = False
    name: str = "conv_gemm"

    def run(self, mod: IRModule) -> IRModule:
        mapping: dict[Var, Var] = {}
        mod = apply_rules(mod, [Rule("pool_before_pointwise_conv", op_call("avg_pool2d"), _pool_first(_sole_readers(mod)))])
        if self.params:
            mod, mapping = retype_weight_params(mod, WINOGRAD, _winograd_params, _winograd_info)
            mod, more = retype_weight_params(mod, DIRECT, _direct_params, _direct_info)
            mapping.update(more)
            mod, more = retype_weight_params(mod, ATTR, _conv_params, _matrix_info)
            mapping.update(more)
            mod, more = retype_weight_params(mod, DEPTHWISE, _depthwise_params, _taps_info)
            mapping.update(more)
        convs = _Convs(mapping)
        out = apply_rules(mod, [Rule("conv2d_as_linear", op_call("conv2d"), convs.rewrite), *SINK_RULES])
        return DeadCodeElimination()(out) if convs.changed else mod


__all__ = ["ATTR", "DEPTHWISE", "DIRECT", "WINOGRAD", "ConvGemm", "conv_weight_matrix", "depthwise_weight_matrix", "direct_weight_matrix", "winograd_weight"]
