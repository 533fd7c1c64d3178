"""Converters of ONNX's signal ops: ``DFT``, ``STFT``, the ``Hann``/``Hamming``/``Blackman``
windows and ``MelWeightMatrix``, composed from graph ops.

A DFT along one axis is two matrix products with a twiddle matrix built at the symbolic
lengths: ``cos`` and ``sin`` of ``2 pi (n k mod L) / L`` from integer ``arange``s (the angle's
integer part is reduced exactly before it becomes a float), in float64, then cast to the
input's dtype. ONNX keeps complex numbers as a last dim of size 2 (real, imaginary), or 1 for a
real signal. Lengths may be symbolic; one compilation serves every length.
"""

from __future__ import annotations

import math
from typing import Callable

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_math import cast_to, scalar_const
from tilework.frontend.onnx.convert_shape import norm_axis
from tilework.frontend.onnx.registry import Result, converter
from tilework.ir import sym
from tilework.ir.dtype import is_float_dtype
from tilework.ir.graph import Expr
from tilework.ir.info import TensorInfo
from tilework.ir.sym import Dim
from tilework.op import create, linalg, manipulate
from tilework.op import elementwise as ew
from tilework.op import shape as op_shape

_TAU = 2.0 * math.pi


def dim_value(ctx: NodeCtx, d: Dim, dtype: str) -> Expr:
    """A 0-d tensor holding the dim ``d`` (a sym var's run-time value, or a constant)."""
    if isinstance(d, int):
        return scalar_const(d, dtype)
    t = ctx.emit(manipulate.reshape(ctx.emit(op_shape.shape_to_tensor([d])), ()))
    return cast_to(ctx, t, dtype)


def _iota(ctx: NodeCtx, n: Dim, rank: int, axis: int) -> Expr:
    """``0 .. n-1`` (int64) along ``axis`` of a rank-``rank`` tensor whose other dims are 1."""
    r = ctx.emit(create.arange(0, n, 1, "int64"))
    return ctx.emit(manipulate.reshape(r, tuple(n if i == axis else 1 for i in range(rank))))


def _twiddles(ctx: NodeCtx, rows: Dim, cols: Dim, length: Dim, dtype: str, inverse: bool, real_out: bool) -> tuple[Expr, Expr]:
    """``(C, S)`` of shape ``[rows, cols]`` such that ``Yr = Xr C + Xi S`` and ``Yi = Xi C - Xr S``
    is the DFT of the ``rows`` input bins to the ``cols`` output bins (length ``length``):

    forward ``C = cos t``, ``S = sin t``; inverse ``C = cos t / L``, ``S = -sin t / L``, where
    ``t = 2 pi r c / L``. Input rows at or past the length are dropped (zero rows). With
    ``real_out`` (the inverse of a one-sided spectrum) row ``r`` counts twice for the bins that
    stand for a conjugate pair, and rows past ``L // 2`` are dropped."""
    r, c = _iota(ctx, rows, 2, 0), _iota(ctx, cols, 2, 1)
    length_i = dim_value(ctx, length, "int64")
    rc = ctx.emit(ew.mod(ctx.emit(ew.multiply(r, c)), length_i))
    length_f = cast_to(ctx, length_i, "float64")
    theta = ctx.emit(ew.multiply(cast_to(ctx, rc, "float64"), ctx.emit(ew.divide(scalar_const(_TAU, "float64"), length_f))))
    cos, sin = ctx.emit(ew.cos(theta)), ctx.emit(ew.sin(theta))
    scale: Expr | None = None
    keep = sym.add(sym.floordiv(length, 2), 1) if real_out else length
    if real_out:
        ends = ctx.emit(ew.logical_or(ctx.emit(ew.equal(r, scalar_const(0, "int64"))), ctx.emit(ew.equal(ctx.emit(ew.add(r, r)), length_i))))
        scale = ctx.emit(ew.where(ends, scalar_const(1.0, "float64"), scalar_const(2.0, "float64")))
    if not (isinstance(rows, int) and isinstance(keep, int) and rows <= keep) and not sym.prove_le(rows, keep):
        inside = ctx.emit(ew.less(r, dim_value(ctx, keep, "int64")))
        mask = ctx.emit(ew.where(inside, scalar_const(1.0, "float64"), scalar_const(0.0, "float64")))
        scale = mask if scale is None else ctx.emit(ew.multiply(scale, mask))
    if inverse:
        inv = ctx.emit(ew.divide(scalar_const(1.0, "float64"), length_f))
        scale = inv if scale is None else ctx.emit(ew.multiply(scale, inv))
        sin = ctx.emit(ew.neg(sin))
    if scale is not None:
        cos, sin = ctx.emit(ew.multiply(cos, scale)), ctx.emit(ew.multiply(sin, scale))
    return cast_to(ctx, cos, dtype), cast_to(ctx, sin, dtype)


def dft(ctx: NodeCtx, x: Expr, axis: int, length: Dim | None, inverse: bool, onesided: bool) -> Expr:
    """ONNX's DFT of ``x`` (``[..., 1 or 2]``) along ``axis`` (normalized, not the last)."""
    shape = ctx.shape_of(x)
    rank = len(shape)
    dtype = x.info.dtype if isinstance(x.info, TensorInfo) else None
    if dtype is None or not is_float_dtype(dtype):
        raise ctx.unsupported(f"the signal must be a float tensor, got {dtype}")
    if shape[-1] not in (1, 2):
        raise ctx.unsupported(f"the last dim holds (real, imaginary) and must be 1 or 2, got {shape[-1]}")
    if not 0 <= axis < rank - 1:
        raise ctx.unsupported(f"axis {axis} must name a signal dim (not the last, complex dim) of the rank-{rank} input")
    n_in = shape[axis]
    real_out = inverse and onesided
    if length is None:
        length = sym.mul(sym.sub(n_in, 1), 2) if real_out else n_in
    cols = length if not onesided or real_out else sym.add(sym.floordiv(length, 2), 1)
    # the signal axis moved last, the complex dim dropped: [..., n_in]
    perm = [i for i in range(rank - 1) if i != axis] + [axis]
    parts = []
    for k in range(shape[-1]):
        part = ctx.emit(manipulate.strided_slice(x, [rank - 1], [k], [k + 1]))
        part = ctx.emit(manipulate.squeeze(part, [rank - 1]))
        parts.append(ctx.emit(manipulate.permute_dims(part, perm)) if perm != list(range(rank - 1)) else part)
    cm, sm = _twiddles(ctx, n_in, cols, length, dtype, inverse, real_out)
    xr = parts[0]
    xi = parts[1] if len(parts) == 2 else None
    yr = ctx.emit(linalg.matmul(xr, cm))
    if xi is not None:
        yr = ctx.emit(ew.add(yr, ctx.emit(linalg.matmul(xi, sm))))
    outs = [yr]
    if not real_out:
        yi = ctx.emit(ew.neg(ctx.emit(linalg.matmul(xr, sm))))
        if xi is not None:
            yi = ctx.emit(ew.add(ctx.emit(linalg.matmul(xi, cm)), yi))
        outs.append(yi)
    y = ctx.emit(manipulate.concat([ctx.emit(manipulate.expand_dims(o, rank - 1)) for o in outs], axis=rank - 1))
    if perm == list(range(rank - 1)):
        return y
    back = [perm.index(i) for i in range(rank - 1)] + [rank - 1]
    return ctx.emit(manipulate.permute_dims(y, back))


def _dft_length(ctx: NodeCtx) -> Dim | None:
    if not ctx.has_input(1):
        return None
    length = ctx.scalar(1, "dft_length")
    if isinstance(length, int) and length < 1:
        raise ctx.unsupported(f"dft_length must be positive, got {length}")
    return length


@converter("DFT", 17, 17, static_inputs=(1,))
def _dft17(ctx: NodeCtx) -> Result:
    x = ctx.expr(0)
    axis = norm_axis(ctx, int(ctx.attr("axis", 1)), ctx.rank(0))
    return dft(ctx, x, axis, _dft_length(ctx), bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0)))


@converter("DFT", 20, 20, static_inputs=(1, 2))
def _dft20(ctx: NodeCtx) -> Result:
    x = ctx.expr(0)
    axis = ctx.ints(2, "axis")[0] if ctx.has_input(2) else -2
    axis = norm_axis(ctx, axis, ctx.rank(0))
    return dft(ctx, x, axis, _dft_length(ctx), bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0)))


@converter("STFT", 17, 17, static_inputs=(1, 3))
def _stft(ctx: NodeCtx) -> Result:
    """Frames ``signal[:, f * step + j]`` (``j < frame_length``) gathered by an index matrix,
    weighted by the window, then a DFT of length ``frame_length`` along the frame axis."""
    signal = ctx.expr(0)
    shape = ctx.known_shape(0)
    if len(shape) != 3:
        raise ctx.unsupported(f"the signal must be [batch, length, 1 or 2], got rank {len(shape)}")
    step = ctx.scalar(1, "frame_step")
    if isinstance(step, int) and step < 1:
        raise ctx.unsupported(f"frame_step must be positive, got {step}")
    window = ctx.expr(2) if ctx.has_input(2) else None
    if window is not None:  # a frame_length given too must equal the window's length
        frame = ctx.shape_of(window)[0]
        if ctx.has_input(3) and sym.prove_ne(ctx.scalar(3, "frame_length"), frame):
            raise ctx.unsupported(f"frame_length {ctx.scalar(3, 'frame_length')} differs from the window's length {frame}")
    elif ctx.has_input(3):
        frame = ctx.scalar(3, "frame_length")
    else:
        frame = shape[1]
    frames = sym.add(sym.floordiv(sym.sub(shape[1], frame), step), 1)
    starts = ctx.emit(ew.multiply(_iota(ctx, frames, 2, 0), dim_value(ctx, step, "int64")))
    index = ctx.emit(ew.add(starts, _iota(ctx, frame, 2, 1)))  # [frames, frame]
    framed = ctx.emit(manipulate.take(signal, index, axis=1))  # [batch, frames, frame, c]
    if window is not None:
        w = ctx.emit(manipulate.reshape(cast_to(ctx, window, ctx.dtype(0)), (1, 1, frame, 1)))
        framed = ctx.emit(ew.multiply(framed, w))
    return dft(ctx, framed, 2, frame, False, bool(ctx.attr("onesided", 1)))


# -- windows ------------------------------------------------------------------------------------

# w[n] = sum_i a_i cos(2 pi i n / N'), N' = size (periodic) or size - 1 (symmetric)
_WINDOWS: dict[str, tuple[float, ...]] = {
    "HannWindow": (0.5, -0.5),
    "HammingWindow": (25.0 / 46.0, -21.0 / 46.0),
    "BlackmanWindow": (0.42, -0.5, 0.08),
}


def _window(coeffs: tuple[float, ...]) -> Callable[[NodeCtx], Result]:
    def conv(ctx: NodeCtx) -> Result:
        size = ctx.scalar(0, "size")
        dtype = ctx.dtype_attr("output_datatype", 1)
        periodic = bool(ctx.attr("periodic", 1))
        n = cast_to(ctx, ctx.emit(create.arange(0, size, 1, "int64")), "float64")
        denom = dim_value(ctx, size if periodic else sym.sub(size, 1), "float64")
        t = ctx.emit(ew.multiply(n, ctx.emit(ew.divide(scalar_const(_TAU, "float64"), denom))))
        acc: Expr = ctx.emit(create.full((size,), coeffs[0], "float64"))
        for i, a in enumerate(coeffs[1:], start=1):
            ti = t if i == 1 else ctx.emit(ew.multiply(t, scalar_const(float(i), "float64")))
            acc = ctx.emit(ew.add(acc, ctx.emit(ew.multiply(ctx.emit(ew.cos(ti)), scalar_const(a, "float64")))))
        return cast_to(ctx, acc, dtype)

    return conv


for _onnx, _coeffs in _WINDOWS.items():
    converter(_onnx, 17, 17, static_inputs=(0,))(_window(_coeffs))


# -- mel filter bank ---------------------------------------------------------------------------


@converter("MelWeightMatrix", 17, 17, static_inputs=(0, 1))
def _mel_weight_matrix(ctx: NodeCtx) -> Result:
    """``[dft_length // 2 + 1, num_mel_bins]`` triangles between spectrogram bins ``b[i]``,
    ``b[i + 1]``, ``b[i + 2]``: ``num_mel_bins + 2`` points equally spaced in mel
    (``2595 log10(1 + f / 700)``) from the lower to the upper edge, each mapped to the bin
    ``floor((dft_length + 1) f / sample_rate)``. Rising edge ``(j - b[i]) / (b[i+1] - b[i])``
    on ``b[i] <= j <= b[i+1]`` (1 at ``j = b[i+1]`` when the two coincide), falling edge
    ``(b[i+2] - j) / (b[i+2] - b[i+1])`` on ``b[i+1] <= j < b[i+2]``."""
    mels = ctx.scalar(0, "num_mel_bins")
    length = ctx.scalar(1, "dft_length")
    dtype = ctx.dtype_attr("output_datatype", 1)
    f64 = "float64"

    def scalar_input(i: int) -> Expr:
        return cast_to(ctx, ctx.emit(manipulate.reshape(ctx.expr(i), ())), f64)

    rate, lower, upper = scalar_input(2), scalar_input(3), scalar_input(4)

    def hz_to_mel(f: Expr) -> Expr:
        ratio = ctx.emit(ew.divide(f, scalar_const(700.0, f64)))
        log = ctx.emit(ew.log(ctx.emit(ew.add(ratio, scalar_const(1.0, f64)))))
        return ctx.emit(ew.multiply(log, scalar_const(2595.0 / math.log(10.0), f64)))

    low, high = hz_to_mel(lower), hz_to_mel(upper)
    points = sym.add(mels, 2)
    step = ctx.emit(ew.divide(ctx.emit(ew.subtract(high, low)), dim_value(ctx, points, f64)))
    i = cast_to(ctx, ctx.emit(create.arange(0, points, 1, "int64")), f64)
    mel = ctx.emit(ew.add(ctx.emit(ew.multiply(i, step)), low))
    hz = ctx.emit(ew.exp(ctx.emit(ew.multiply(mel, scalar_const(math.log(10.0) / 2595.0, f64)))))
    hz = ctx.emit(ew.multiply(ctx.emit(ew.subtract(hz, scalar_const(1.0, f64))), scalar_const(700.0, f64)))
    scaled = ctx.emit(ew.multiply(hz, dim_value(ctx, sym.add(length, 1), f64)))
    bins = cast_to(ctx, ctx.emit(ew.floor(ctx.emit(ew.divide(scaled, rate)))), "int64")  # [points]

    def edge(k: int) -> Expr:
        part = ctx.emit(manipulate.strided_slice(bins, [0], [k], [sym.add(mels, k)]))
        return ctx.emit(manipulate.reshape(part, (1, mels)))

    left, center, right = edge(0), edge(1), edge(2)
    j = _iota(ctx, sym.add(sym.floordiv(length, 2), 1), 2, 0)  # [bins, 1]

    def ratio(num: Expr, den: Expr) -> Expr:
        den_safe = ctx.emit(ew.where(ctx.emit(ew.equal(den, scalar_const(0, "int64"))), scalar_const(1, "int64"), den))
        return ctx.emit(ew.divide(cast_to(ctx, num, f64), cast_to(ctx, den_safe, f64)))

    rise_w, fall_w = ctx.emit(ew.subtract(center, left)), ctx.emit(ew.subtract(right, center))
    rising = ctx.emit(ew.logical_and(ctx.emit(ew.greater_equal(j, left)), ctx.emit(ew.less_equal(j, center))))
    up = ctx.emit(ew.where(ctx.emit(ew.equal(rise_w, scalar_const(0, "int64"))), scalar_const(1.0, f64), ratio(ctx.emit(ew.subtract(j, left)), rise_w)))
    falling = ctx.emit(ew.logical_and(ctx.emit(ew.greater_equal(j, center)), ctx.emit(ew.less(j, right))))
    down = ratio(ctx.emit(ew.subtract(right, j)), fall_w)
    zero = ctx.emit(create.zeros((sym.add(sym.floordiv(length, 2), 1), mels), f64))
    out = ctx.emit(ew.where(rising, up, zero))
    out = ctx.emit(ew.where(falling, down, out))
    return cast_to(ctx, out, dtype)


__all__ = ["dft", "dim_value"]
