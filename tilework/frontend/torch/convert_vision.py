"""Converters of the ATen ops vision and sequence models use beyond the basics: transposed
convolution, upsampling (``interpolate``, antialiased too), ``grid_sampler``, padding in every mode,
``instance_norm``, ``pixel_shuffle``/``pixel_unshuffle``, adaptive pooling in 1-D and max
form, ``topk``/``sort``/``argsort``, ``embedding_bag``, ``_weight_norm`` and the binary
``max``/``min``.

Output sizes come from torch's own metadata (``t.out_shape``), so an upsampled size computed
from a symbolic input size stays symbolic. Where torch resamples with a given scale factor the
source coordinate divides by that factor (not by the ratio of the sizes), as torch does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from tilework import op
from tilework.errors import UnsupportedError
from tilework.frontend.torch.common import as_list, norm_axis
from tilework.frontend.torch.registry import converter
from tilework.ir import sym
from tilework.ir.graph import Expr, TupleGetItem
from tilework.ir.sym import Dim
from tilework.op import conv, pad, search

if TYPE_CHECKING:
    from tilework.frontend.torch.translator import Translator


def _only_values(t: Translator, node: Any, what: str) -> None:
    read = {int(u.args[1]) if u.args[1:] and isinstance(u.args[1], int) else -1 for u in node.users if u.users}
    if read - {0}:
        raise UnsupportedError(f"{what}: only the first result is supported (the indices are read)")


# -- transposed convolution ---------------------------------------------------------------------


def conv_transpose(t: Translator, x: Any, weight: Any, bias: Any, stride: Any, padding: Any, output_padding: Any, groups: int, dilation: Any) -> Expr:
    n = len(t.shape(weight)) - 2
    if n not in (1, 2, 3):
        raise UnsupportedError(f"{n}-D transposed convolution is not supported")
    per = [_per(v, n) for v in (stride, padding, output_padding, dilation)]
    unbatched = len(t.shape(x)) == n + 1
    xb = t.emit(op.expand_dims(x, 0)) if unbatched else x
    y = t.emit(conv.conv_transpose(xb, weight, bias, per[0], per[1], per[2], per[3], groups, ndim=n))
    return t.emit(op.squeeze(y, 0)) if unbatched else y


def _per(v: Any, n: int) -> tuple[int, ...]:
    vs = [int(a) for a in as_list(v)]
    return tuple(vs * n if len(vs) == 1 else vs)


@converter("conv_transpose1d.default", "conv_transpose2d.input", "conv_transpose3d.input")
def _conv_transpose(t: Translator, node: Any, x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Expr:
    return conv_transpose(t, x, weight, bias, stride, padding, output_padding, groups, dilation)


# -- upsampling ---------------------------------------------------------------------------------


def _upsample(t: Translator, node: Any, x: Expr, scale_factors: Any, mode: str, coord: str, rounding: str = "floor") -> Expr:
    shape = t.shape(x)
    out = t.out_shape(node)
    nsp = len(out) - 2
    factors = [f for f in as_list(scale_factors) if f is not None] if scale_factors is not None else []
    scales = None
    if factors and coord != "align_corners":
        scales = (1.0, 1.0, *(float(f) for f in (factors * nsp if len(factors) == 1 else factors)))
    if len(shape) != len(out):
        raise UnsupportedError(f"upsampling changes the rank: {shape} -> {out}")
    return t.emit(pad.resize(x, out, scales, mode=mode, coord=coord, rounding=rounding))


def _scales_of(args: Sequence[Any]) -> list[Any] | None:
    """The trailing per-dim ``scales_*`` of the ``.default`` overloads (None when absent)."""
    vals = [a for a in args if a is not None]
    return vals or None


@converter("upsample_nearest1d.vec", "upsample_nearest2d.vec", "upsample_nearest3d.vec")
def _nearest_vec(t: Translator, node: Any, x: Any, output_size: Any, scale_factors: Any) -> Expr:
    return _upsample(t, node, x, scale_factors, "nearest", "asymmetric")


@converter("upsample_nearest1d.default", "upsample_nearest2d.default", "upsample_nearest3d.default")
def _nearest(t: Translator, node: Any, x: Any, output_size: Any, *scales: Any) -> Expr:
    return _upsample(t, node, x, _scales_of(scales), "nearest", "asymmetric")


@converter("_upsample_nearest_exact1d.vec", "_upsample_nearest_exact2d.vec", "_upsample_nearest_exact3d.vec")
def _nearest_exact_vec(t: Translator, node: Any, x: Any, output_size: Any, scale_factors: Any) -> Expr:
    return _upsample(t, node, x, scale_factors, "nearest", "half_pixel", "round_prefer_ceil")


@converter("_upsample_nearest_exact1d.default", "_upsample_nearest_exact2d.default", "_upsample_nearest_exact3d.default")
def _nearest_exact(t: Translator, node: Any, x: Any, output_size: Any, *scales: Any) -> Expr:
    return _upsample(t, node, x, _scales_of(scales), "nearest", "half_pixel", "round_prefer_ceil")


def _linear_like(mode: str) -> Any:
    def vec(t: Translator, node: Any, x: Any, output_size: Any, align_corners: bool, scale_factors: Any) -> Expr:
        return _upsample(t, node, x, scale_factors, mode, "align_corners" if align_corners else "half_pixel")

    def default(t: Translator, node: Any, x: Any, output_size: Any, align_corners: bool, *scales: Any) -> Expr:
        return _upsample(t, node, x, _scales_of(scales), mode, "align_corners" if align_corners else "half_pixel")

    return vec, default


for _names, _mode in ((("upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d"), "linear"), (("upsample_bicubic2d",), "cubic")):
    _vec, _default = _linear_like(_mode)
    converter(*(f"{n}.vec" for n in _names))(_vec)
    converter(*(f"{n}.default" for n in _names))(_default)


def _aa_weights(t: Translator, n_in: Dim, n_out: Dim, scale: float | None, align_corners: bool, cubic: bool, dtype: str) -> Expr:
    """torch's antialiased resampling weights ``[n_out, n_in]`` along one dim: output ``i``
    centred at ``s * (i + 0.5)`` in the input (``s`` the input/output ratio), input ``j``
    weighted by the filter at ``(j + 0.5 - centre) / max(s, 1)`` (a downscale widens the filter
    by ``s``), the weights of each output normalized to sum 1 over the input's pixels (those
    past its borders left out). Bilinear's filter is the triangle ``1 - |x|``, bicubic's the
    cubic of ``a = -0.5`` (Pillow's, which torch follows)."""
    f = lambda v: t.tensor(float(v), dtype)  # noqa: E731
    s: Expr
    if align_corners:
        s = t.emit(op.where(t.emit(op.greater(t.tensor(n_out, "int64"), t.tensor(1, "int64"))),
                            t.emit(op.divide(t.tensor(sym.sub(n_in, 1), dtype), t.emit(op.maximum(t.tensor(sym.sub(n_out, 1), dtype), f(1))))), f(0)))
    elif scale is not None and scale > 0:
        s = f(1.0 / scale)
    else:
        s = t.emit(op.divide(t.tensor(n_in, dtype), t.tensor(n_out, dtype)))
    inv = t.emit(op.where(t.emit(op.greater_equal(s, f(1))), t.emit(op.divide(f(1), s)), f(1)))
    out_pos = t.emit(op.reshape(t.emit(op.arange(0, n_out, 1, dtype=dtype)), [n_out, 1]))
    in_pos = t.emit(op.reshape(t.emit(op.arange(0, n_in, 1, dtype=dtype)), [1, n_in]))
    centre = t.emit(op.multiply(s, t.emit(op.add(out_pos, f(0.5)))))
    x = t.emit(op.abs(t.emit(op.multiply(t.emit(op.subtract(t.emit(op.add(in_pos, f(0.5))), centre)), inv))))
    if cubic:
        a = -0.5
        near = t.emit(op.add(t.emit(op.multiply(t.emit(op.multiply(t.emit(op.subtract(t.emit(op.multiply(f(a + 2), x)), f(a + 3))), x)), x)), f(1)))
        far = t.emit(op.multiply(t.emit(op.subtract(t.emit(op.multiply(t.emit(op.add(t.emit(op.multiply(t.emit(op.subtract(x, f(5))), x)), f(8))), x)), f(4))), f(a)))
        w = t.emit(op.where(t.emit(op.less(x, f(1))), near, t.emit(op.where(t.emit(op.less(x, f(2))), far, f(0)))))
    else:
        w = t.emit(op.maximum(t.emit(op.subtract(f(1), x)), f(0)))
    total = t.emit(op.sum(w, (1,), True))
    return t.emit(op.divide(w, t.emit(op.where(t.emit(op.equal(total, f(0))), f(1), total))))


def _antialiased(t: Translator, node: Any, x: Any, align_corners: bool, scales: Sequence[Any]) -> Expr:
    """``interpolate(..., antialias=True)`` (bilinear, bicubic) as two matmuls by the weights
    of each spatial dim (dense ``[out, in]`` matrices: zero outside each output's window)."""
    cubic = "bicubic" in str(node.target)
    dtype = t.dtype(x)
    if dtype not in ("float32", "float64"):
        raise UnsupportedError(f"interpolate(mode={'bicubic' if cubic else 'bilinear'!r}, antialias=True) of a {dtype} tensor is not supported (float32, float64 are)")
    h, w = t.shape(x)[-2:]
    oh, ow = t.out_shape(node)[-2:]
    scales = list(scales) + [None] * (2 - len(scales))
    wh = _aa_weights(t, h, oh, scales[0], bool(align_corners), cubic, dtype)
    ww = _aa_weights(t, w, ow, scales[1], bool(align_corners), cubic, dtype)
    rows = t.emit(op.matmul(wh, x))  # [..., oh, w]
    return t.emit(op.matmul(rows, t.emit(op.permute_dims(ww, (1, 0)))))


@converter("_upsample_bilinear2d_aa.vec", "_upsample_bicubic2d_aa.vec")
def _antialiased_vec(t: Translator, node: Any, x: Any, output_size: Any, align_corners: bool, scale_factors: Any) -> Expr:
    factors = list(scale_factors) if scale_factors is not None else []
    return _antialiased(t, node, x, align_corners, factors * 2 if len(factors) == 1 else factors)


@converter("_upsample_bilinear2d_aa.default", "_upsample_bicubic2d_aa.default")
def _antialiased_default(t: Translator, node: Any, x: Any, output_size: Any, align_corners: bool, scales_h: Any = None, scales_w: Any = None) -> Expr:
    return _antialiased(t, node, x, align_corners, [scales_h, scales_w])


@converter("grid_sampler.default", "grid_sampler_2d.default", "grid_sampler_3d.default")
def _grid_sampler(t: Translator, node: Any, x: Any, grid: Any, interpolation_mode: int, padding_mode: int, align_corners: bool) -> Expr:
    modes, paddings = ("linear", "nearest", "cubic"), ("zeros", "border", "reflection")
    return t.emit(pad.grid_sample(x, grid, modes[int(interpolation_mode)], paddings[int(padding_mode)], bool(align_corners)))


# -- padding ------------------------------------------------------------------------------------


def _pads(t: Translator, x: Expr, amounts: Sequence[Any]) -> tuple[Dim, ...]:
    """torch's pad list (last dim first, ``(before, after)`` pairs) in ONNX's layout."""
    n = len(t.shape(x))
    if len(amounts) % 2 or len(amounts) // 2 > n:
        raise UnsupportedError(f"pad {list(amounts)} must hold (before, after) pairs for at most {n} dims")
    before: list[Dim] = [0] * n
    after: list[Dim] = [0] * n
    for k in range(len(amounts) // 2):
        before[n - 1 - k], after[n - 1 - k] = amounts[2 * k], amounts[2 * k + 1]
    return tuple(before) + tuple(after)


def _pad(t: Translator, x: Expr, amounts: Sequence[Any], mode: str, value: Any = 0) -> Expr:
    dtype = t.dtype(x)
    return t.emit(pad.pad(x, t.tensor(0 if value is None else value, dtype), _pads(t, x, amounts), mode))


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@converter("pad.default")
def _pad_default(t: Translator, node: Any, x: Any, amounts: Any, mode: str = "constant", value: Any = None) -> Expr:
    if mode not in _PAD_MODES:
        raise UnsupportedError(f"pad mode {mode!r} is not supported (supported: {', '.join(_PAD_MODES)})")
    return _pad(t, x, amounts, _PAD_MODES[mode], value)


converter("constant_pad_nd.default")(lambda t, node, x, amounts, value=0: _pad(t, x, amounts, "constant", value))
for _k in (1, 2, 3):
    converter(f"reflection_pad{_k}d.default")(lambda t, node, x, amounts: _pad(t, x, amounts, "reflect"))
    converter(f"replication_pad{_k}d.default")(lambda t, node, x, amounts: _pad(t, x, amounts, "edge"))
converter("_pad_circular.default")(lambda t, node, x, amounts: _pad(t, x, amounts, "wrap"))


# -- normalization and rearrangement ------------------------------------------------------------


@converter("instance_norm.default")
def _instance_norm(t: Translator, node: Any, x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, use_input_stats: bool, momentum: float, eps: float, cudnn_enabled: bool = True) -> Expr:
    shape, dtype = t.shape(x), t.dtype(x)
    c = shape[1]
    g = t.tensor(weight, dtype) if weight is not None else t.ones((c,), dtype, 1.0)
    b = t.tensor(bias, dtype) if bias is not None else t.ones((c,), dtype, 0.0)
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise UnsupportedError("instance_norm without input statistics needs running_mean and running_var")
        return t.emit(op.batch_norm(x, running_mean, running_var, g, b, axis=1, eps=eps))
    if not isinstance(c, int):
        raise UnsupportedError(f"instance_norm needs a static channel count, got {sym.to_str(c)}")
    return t.emit(op.group_norm(x, g, b, c, eps))


@converter("pixel_shuffle.default")
def _pixel_shuffle(t: Translator, node: Any, x: Any, r: int) -> Expr:
    *lead, c, h, w = t.shape(x)
    k = len(lead)
    oc = sym.floordiv(c, r * r)
    y = t.emit(op.reshape(x, (*lead, oc, r, r, h, w)))
    y = t.emit(op.permute_dims(y, (*range(k), k, k + 3, k + 1, k + 4, k + 2)))
    return t.emit(op.reshape(y, (*lead, oc, sym.mul(h, r), sym.mul(w, r))))


@converter("pixel_unshuffle.default")
def _pixel_unshuffle(t: Translator, node: Any, x: Any, r: int) -> Expr:
    *lead, c, h, w = t.shape(x)
    k = len(lead)
    oh, ow = sym.floordiv(h, r), sym.floordiv(w, r)
    y = t.emit(op.reshape(x, (*lead, c, oh, r, ow, r)))
    y = t.emit(op.permute_dims(y, (*range(k), k, k + 2, k + 4, k + 1, k + 3)))
    return t.emit(op.reshape(y, (*lead, sym.mul(c, r * r), oh, ow)))


# -- adaptive pooling ---------------------------------------------------------------------------


def _static_size(t: Translator, node: Any, n: int, what: str) -> tuple[int, ...]:
    out = t.out_shape(node, 0 if isinstance(node.meta.get("val"), (list, tuple)) else None)[-n:]
    static = tuple(d for d in out if isinstance(d, int))
    if len(static) != n:
        raise UnsupportedError(f"{what} to a symbolic size {out} is not supported")
    return static


def _adaptive(t: Translator, x: Expr, size: tuple[int, ...], fn: Any) -> Expr:
    """``fn`` (a 2-D adaptive pool) over a 1-D (``len(size) == 1``) or 2-D pool, batched or not."""
    rank = len(t.shape(x))
    nsp = len(size)
    y = x
    if nsp == 1:
        y = t.emit(op.expand_dims(y, rank - 1))
        size = (1, *size)
    unbatched = len(t.shape(y)) == 3
    if unbatched:
        y = t.emit(op.expand_dims(y, 0))
    y = t.emit(fn(y, size))
    if unbatched:
        y = t.emit(op.squeeze(y, 0))
    return t.emit(op.squeeze(y, rank - 1)) if nsp == 1 else y


@converter("adaptive_avg_pool1d.default")
def _adaptive_avg_pool1d(t: Translator, node: Any, x: Any, output_size: Any) -> Expr:
    return _adaptive(t, x, _static_size(t, node, 1, "adaptive_avg_pool1d"), conv.adaptive_avg_pool2d)


@converter("adaptive_max_pool1d.default", "adaptive_max_pool2d.default")
def _adaptive_max_pool(t: Translator, node: Any, x: Any, output_size: Any) -> tuple[Expr | None, ...]:
    _only_values(t, node, "adaptive_max_pool")
    n = len(as_list(output_size))
    return _adaptive(t, x, _static_size(t, node, n, "adaptive_max_pool"), conv.adaptive_max_pool2d), None


# -- ordering -----------------------------------------------------------------------------------


@converter("topk.default")
def _topk(t: Translator, node: Any, x: Any, k: Any, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Expr, ...]:
    axis = norm_axis(dim, len(t.shape(x)))
    res = t.emit(search.topk(x, k, axis, largest))
    return tuple(t.emit(TupleGetItem(res, i)) for i in range(2))


def _sort_impl(t: Translator, x: Expr, dim: int, descending: bool) -> tuple[Expr, ...]:
    shape = t.shape(x)
    if not shape:
        return x, t.ones((), "int64", 0)
    axis = norm_axis(dim, len(shape))
    res = t.emit(search.topk(x, shape[axis], axis, bool(descending)))
    return tuple(t.emit(TupleGetItem(res, i)) for i in range(2))


@converter("sort.default")
def _sort(t: Translator, node: Any, x: Any, dim: int = -1, descending: bool = False) -> tuple[Expr, ...]:
    return _sort_impl(t, x, dim, descending)


@converter("sort.stable")
def _sort_stable(t: Translator, node: Any, x: Any, *, stable: Any = None, dim: int = -1, descending: bool = False) -> tuple[Expr, ...]:
    return _sort_impl(t, x, dim, descending)


@converter("argsort.default")
def _argsort(t: Translator, node: Any, x: Any, dim: int = -1, descending: bool = False) -> Expr:
    return _sort_impl(t, x, dim, descending)[1]


@converter("argsort.stable")
def _argsort_stable(t: Translator, node: Any, x: Any, *, stable: bool = False, dim: int = -1, descending: bool = False) -> Expr:
    return _sort_impl(t, x, dim, descending)[1]


# -- embedding bags, weight norm, binary min/max ------------------------------------------------


def _embedding_bag(t: Translator, node: Any, weight: Any, indices: Any, offsets: Any, scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False, per_sample_weights: Any = None, include_last_offset: bool = False, padding_idx: Any = None) -> tuple[Expr | None, ...]:
    """Bag ``b`` reduces the rows ``weight[indices[i]]`` for ``offsets[b] <= i < offsets[b + 1]``
    (a 2-D ``indices`` is one bag per row): a membership mask ``[bags, n]`` over the gathered rows
    ``[n, dim]`` reduces them (a matrix product for sum and mean, a masked max for max); entries
    equal to ``padding_idx`` are left out. An empty bag gives zeros, as torch does."""
    _only_values(t, node, "embedding_bag")
    dtype = t.dtype(weight)
    if len(t.shape(indices)) == 2:
        rows, cols = t.shape(indices)
        offsets = t.emit(op.multiply(t.emit(op.arange(0, rows, 1, dtype="int64")), t.tensor(cols, "int64")))
        indices = t.emit(op.reshape(indices, (sym.mul(rows, cols),)))
        if per_sample_weights is not None:
            per_sample_weights = t.emit(op.reshape(per_sample_weights, (sym.mul(rows, cols),)))
        include_last_offset = False
    n = t.shape(indices)[0]
    nb = t.shape(offsets)[0]
    starts = offsets
    ends_tail = t.emit(op.strided_slice(offsets, (0,), (1,), (nb,)))
    ends = t.emit(op.concat([ends_tail, t.emit(op.reshape(t.tensor(n, "int64"), (1,)))], 0))
    if include_last_offset:
        nb = sym.sub(nb, 1)
        starts = t.emit(op.strided_slice(offsets, (0,), (0,), (nb,)))
        ends = t.emit(op.strided_slice(ends, (0,), (0,), (nb,)))
    pos = t.emit(op.arange(0, n, 1, dtype="int64"))
    mask = t.emit(op.logical_and(t.emit(op.greater_equal(pos, t.emit(op.expand_dims(starts, 1)))), t.emit(op.less(pos, t.emit(op.expand_dims(ends, 1))))))
    if padding_idx is not None and padding_idx >= 0:
        mask = t.emit(op.logical_and(mask, t.emit(op.not_equal(indices, t.tensor(int(padding_idx), t.dtype(indices))))))
    vecs = t.emit(op.take(weight, t.checked_index(indices, t.shape(weight)[0]), 0))
    if per_sample_weights is not None:
        vecs = t.emit(op.multiply(vecs, t.emit(op.expand_dims(t.tensor(per_sample_weights, dtype), 1))))
    if int(mode) == 2:
        expanded = t.emit(op.where(t.emit(op.expand_dims(mask, 2)), t.emit(op.expand_dims(vecs, 0)), t.tensor(float("-inf"), dtype)))
        best = t.emit(op.max(expanded, axis=1)) if not isinstance(n, int) or n > 0 else None
        count = t.emit(op.sum(t.emit(op.astype(mask, "int64")), axis=1, keepdims=True))
        if best is None:
            return t.ones((nb, t.shape(weight)[1]), dtype, 0.0), None, None, None
        return t.emit(op.where(t.emit(op.greater(count, t.tensor(0, "int64"))), best, t.tensor(0.0, dtype))), None, None, None
    weights = t.emit(op.astype(mask, dtype))
    total = t.emit(op.matmul(weights, vecs))
    if int(mode) == 1:
        count = t.emit(op.sum(weights, axis=1, keepdims=True))
        total = t.emit(op.divide(total, t.emit(op.maximum(count, t.tensor(1.0, dtype)))))
    return total, None, None, None


converter("embedding_bag.default", "embedding_bag.padding_idx", "_embedding_bag.default", "_embedding_bag_forward_only.default")(_embedding_bag)


@converter("_weight_norm.default")
def _weight_norm(t: Translator, node: Any, v: Any, g: Any, dim: int = 0) -> Expr:
    """``v * g / ||v||`` with the norm over every dim but ``dim`` (all dims for -1)."""
    rank = len(t.shape(v))
    axes = tuple(range(rank)) if dim == -1 else tuple(a for a in range(rank) if a != norm_axis(dim, rank))
    sq = t.emit(op.multiply(v, v))
    norm = t.emit(op.sqrt(t.emit(op.sum(sq, axis=axes, keepdims=True)))) if axes else t.emit(op.abs(v))
    return t.emit(op.multiply(v, t.emit(op.divide(g, norm))))


for _name, _fn in (("max", op.maximum), ("min", op.minimum)):
    converter(f"{_name}.other")(lambda t, node, a, b, _fn=_fn: t.emit(_fn(t.tensor(a, t.out_dtype(node)), t.tensor(b, t.out_dtype(node)))))

__all__ = ["conv_transpose"]
