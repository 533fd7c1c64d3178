"""Converters of neural-network ATen ops: ``linear`` and the matmul family, normalizations
(layer, RMS, group, batch in eval mode), softmax, ``scaled_dot_product_attention``, convolution
and pooling.

``scaled_dot_product_attention`` takes ``[batch, heads, seq, head_dim]`` tensors while
tilework's ``attention`` takes ``[batch, seq, heads, head_dim]``: q, k and v are permuted in
and the result out. torch's ``is_causal`` aligns the causal mask at the first key
(query ``i`` sees keys ``j <= i``) and tilework's at the last; they agree when the query and
key lengths are equal, otherwise the converter builds torch's mask explicitly. Grouped KV
heads (``enable_gqa``) map to tilework's native grouped attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from tilework import op
from tilework.errors import UnsupportedError
from tilework.frontend.torch.common import as_list, norm_axis
from tilework.ir.dtype import to_torch
from tilework.frontend.torch.registry import converter
from tilework.ir import sym
from tilework.ir.graph import Expr, TupleGetItem
from tilework.ir.sym import Dim

if TYPE_CHECKING:
    from tilework.frontend.torch.translator import Translator

# -- linear algebra -------------------------------------------------------------------------


@converter("linear.default")
def _linear(t: Translator, node: Any, x: Any, weight: Any, bias: Any = None) -> Expr:
    return t.emit(op.linear(x, weight, bias))


@converter("matmul.default", "mm.default", "bmm.default")
def _matmul(t: Translator, node: Any, a: Any, b: Any) -> Expr:
    return t.emit(op.matmul(a, b))


@converter("einsum.default")
def _einsum(t: Translator, node: Any, equation: str, operands: Any, *, path: Any = None) -> Expr:
    # torch's equations are NumPy's (explicit or implicit output, ``...``); ``path`` only
    # orders the contractions
    return t.emit(op.linalg.einsum(equation, *as_list(operands)))


@converter("addmm.default", "baddbmm.default")
def _addmm(t: Translator, node: Any, bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Expr:
    dtype = t.out_dtype(node)
    prod = t.emit(op.matmul(a, b))
    if alpha != 1:
        prod = t.emit(op.multiply(prod, t.tensor(alpha, dtype)))
    if beta == 0:
        return prod
    c = t.tensor(bias, dtype)
    if beta != 1:
        c = t.emit(op.multiply(c, t.tensor(beta, dtype)))
    return t.emit(op.add(c, prod))


@converter("glu.default")
def _glu(t: Translator, node: Any, x: Any, dim: int = -1) -> Expr:
    """``a * sigmoid(b)`` for the halves ``a``, ``b`` of ``x`` along ``dim``."""
    halves = t.emit(op.split(x, 2, axis=norm_axis(dim, len(t.shape(x)))))
    gate = t.emit(op.sigmoid(t.emit(TupleGetItem(halves, 1))))
    return t.emit(op.multiply(t.emit(TupleGetItem(halves, 0)), gate))


# -- normalization --------------------------------------------------------------------------


def _param_or(t: Translator, p: Any, shape: Sequence[Dim], dtype: str, value: float) -> Expr:
    return t.tensor(p, dtype) if p is not None else t.ones(shape, dtype, value)


def _norm_axes(t: Translator, x: Expr, normalized_shape: Sequence[Any]) -> tuple[tuple[int, ...], tuple[Dim, ...]]:
    shape = t.shape(x)
    k = len(normalized_shape)
    return tuple(range(len(shape) - k, len(shape))), shape[len(shape) - k :]


@converter("layer_norm.default")
def _layer_norm(t: Translator, node: Any, x: Any, normalized_shape: Sequence[Any], weight: Any = None, bias: Any = None, eps: float = 1e-5, cudnn_enable: bool = True) -> Expr:
    axes, pshape = _norm_axes(t, x, normalized_shape)
    dtype = t.dtype(x)
    g, b = _param_or(t, weight, pshape, dtype, 1.0), _param_or(t, bias, pshape, dtype, 0.0)
    return t.emit(op.layer_norm(x, g, b, axes=axes, eps=eps))


@converter("native_layer_norm.default")
def _native_layer_norm(t: Translator, node: Any, x: Any, normalized_shape: Sequence[Any], weight: Any, bias: Any, eps: float) -> tuple[Expr | None, ...]:
    """``(y, mean, rstd)``; the statistics are computed only when something reads them."""
    used = t.used_outputs(node)
    y = _layer_norm(t, node, x, normalized_shape, weight, bias, eps) if 0 in used else None
    if not used & {1, 2}:
        return y, None, None
    axes, _ = _norm_axes(t, x, normalized_shape)
    dtype = t.out_dtype(node, 1)
    xs = t.tensor(x, dtype)
    mean = t.emit(op.mean(xs, axes, keepdims=True))
    dev = t.emit(op.subtract(xs, mean))
    var = t.emit(op.mean(t.emit(op.multiply(dev, dev)), axes, keepdims=True))
    rstd = t.emit(op.rsqrt(t.emit(op.add(var, t.tensor(float(eps), dtype)))))
    return y, mean, rstd


@converter("rms_norm.default")
def _rms_norm(t: Translator, node: Any, x: Any, normalized_shape: Sequence[Any], weight: Any = None, eps: float | None = None) -> Expr:
    import torch

    axes, pshape = _norm_axes(t, x, normalized_shape)
    dtype = t.dtype(x)
    if eps is None:
        eps = float(torch.finfo(to_torch(dtype)).eps)
    return t.emit(op.rms_norm(x, _param_or(t, weight, pshape, dtype, 1.0), axes=axes, eps=eps))


@converter("group_norm.default")
def _group_norm(t: Translator, node: Any, x: Any, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5, cudnn_enable: bool = True) -> Expr:
    dtype, c = t.dtype(x), t.shape(x)[1]
    g, b = _param_or(t, weight, (c,), dtype, 1.0), _param_or(t, bias, (c,), dtype, 0.0)
    return t.emit(op.group_norm(x, g, b, num_groups, eps))


def _only_first(t: Translator, node: Any, what: str) -> None:
    if t.used_outputs(node) - {0}:
        raise UnsupportedError(f"{what}: only the normalized output is supported, not the saved statistics")


@converter("native_group_norm.default")
def _native_group_norm(t: Translator, node: Any, x: Any, weight: Any, bias: Any, n: Any, c: Any, hw: Any, group: int, eps: float) -> tuple[Expr | None, ...]:
    _only_first(t, node, "native_group_norm")
    return _group_norm(t, node, x, group, weight, bias, eps), None, None


def _batch_norm(t: Translator, x: Any, weight: Any, bias: Any, mean: Any, var: Any, eps: float) -> Expr:
    if mean is None or var is None:
        raise UnsupportedError("batch_norm without running statistics (track_running_stats=False) is not supported")
    dtype, c = t.dtype(x), t.shape(x)[1]
    g, b = _param_or(t, weight, (c,), dtype, 1.0), _param_or(t, bias, (c,), dtype, 0.0)
    return t.emit(op.batch_norm(x, t.tensor(mean, dtype), t.tensor(var, dtype), g, b, axis=1, eps=eps))


@converter("batch_norm.default")
def _batch_norm_conv(t: Translator, node: Any, x: Any, weight: Any, bias: Any, mean: Any, var: Any, training: bool, momentum: float, eps: float, cudnn: bool = True) -> Expr:
    if training:
        raise UnsupportedError("batch_norm in training mode; call model.eval() before exporting")
    return _batch_norm(t, x, weight, bias, mean, var, eps)


@converter("_native_batch_norm_legit_no_training.default")
def _bn_no_training(t: Translator, node: Any, x: Any, weight: Any, bias: Any, mean: Any, var: Any, momentum: float, eps: float) -> tuple[Expr | None, ...]:
    _only_first(t, node, "batch_norm")
    return _batch_norm(t, x, weight, bias, mean, var, eps), None, None


@converter("native_batch_norm.default", "_native_batch_norm_legit.default")
def _native_batch_norm(t: Translator, node: Any, x: Any, weight: Any, bias: Any, mean: Any, var: Any, training: bool, momentum: float, eps: float) -> tuple[Expr | None, ...]:
    if training:
        raise UnsupportedError("batch_norm in training mode; call model.eval() before exporting")
    _only_first(t, node, "batch_norm")
    return _batch_norm(t, x, weight, bias, mean, var, eps), None, None


# -- softmax ----------------------------------------------------------------------------------


@converter("softmax.int", "_softmax.default", "softmax.default")
def _softmax(t: Translator, node: Any, x: Any, dim: int, *rest: Any, **kw: Any) -> Expr:
    y = t.tensor(x, t.out_dtype(node))
    return t.emit(op.softmax(y, norm_axis(dim, len(t.shape(y)))))


@converter("log_softmax.int", "_log_softmax.default")
def _log_softmax(t: Translator, node: Any, x: Any, dim: int, *rest: Any, **kw: Any) -> Expr:
    y = t.tensor(x, t.out_dtype(node))
    return t.emit(op.log_softmax(y, norm_axis(dim, len(t.shape(y)))))


@converter("_safe_softmax.default")
def _safe_softmax(t: Translator, node: Any, x: Any, dim: int, *rest: Any, **kw: Any) -> Expr:
    """softmax, with 0 for a row that is all -inf (fully masked)."""
    y = t.tensor(x, t.out_dtype(node))
    axis = norm_axis(dim, len(t.shape(y)))
    dead = t.emit(op.equal(t.emit(op.max(y, axis, keepdims=True)), t.tensor(float("-inf"), t.dtype(y))))
    return t.emit(op.where(dead, t.tensor(0.0, t.dtype(y)), t.emit(op.softmax(y, axis))))


# -- attention --------------------------------------------------------------------------------


def _to_bshd(t: Translator, x: Expr, name: str) -> Expr:
    if len(t.shape(x)) == 3:  # [heads, seq, dim]: one batch
        x = t.emit(op.expand_dims(x, 0))
    if len(t.shape(x)) != 4:
        raise UnsupportedError(f"scaled_dot_product_attention: {name} must be 3-D or 4-D, got shape {t.shape(x)}")
    return t.permute(x, (0, 2, 1, 3))


def _causal_mask(t: Translator, sq: Dim, skv: Dim) -> Expr:
    """torch's is_causal mask ``[sq, skv]``: query ``i`` sees keys ``j <= i``."""
    rows = t.emit(op.expand_dims(t.emit(op.arange(0, sq, 1, dtype="int64")), 1))
    cols = t.emit(op.arange(0, skv, 1, dtype="int64"))
    return t.emit(op.greater_equal(rows, cols))


@converter("scaled_dot_product_attention.default")
def _sdpa(t: Translator, node: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Expr:
    if dropout_p:
        raise UnsupportedError("scaled_dot_product_attention with dropout_p > 0 (training) is not supported")
    rank = len(t.shape(q))
    qs, ks, vs = _to_bshd(t, q, "q"), _to_bshd(t, k, "k"), _to_bshd(t, v, "v")
    sq, skv = t.shape(qs)[1], t.shape(ks)[1]
    mask = attn_mask
    causal = bool(is_causal)
    if causal and not sym.prove_eq(sq, skv):
        causal_mask = _causal_mask(t, sq, skv)
        if mask is None:
            mask = causal_mask
        elif t.dtype(mask) == "bool":
            mask = t.emit(op.logical_and(mask, causal_mask))
        else:
            neg = t.tensor(float("-inf"), t.dtype(mask))
            mask = t.emit(op.where(causal_mask, mask, neg))
        causal = False
    if mask is not None and t.dtype(mask) != "bool":
        mask = t.tensor(mask, t.dtype(qs))
    out = t.permute(t.emit(op.attention(qs, ks, vs, mask=mask, causal=causal, scale=scale)), (0, 2, 1, 3))
    return t.emit(op.squeeze(out, 0)) if rank == 3 else out


@converter("_scaled_dot_product_flash_attention_for_cpu.default")
def _sdpa_flash_cpu(t: Translator, node: Any, q: Any, k: Any, v: Any, dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask: Any = None, scale: float | None = None) -> tuple[Expr | None, ...]:
    _only_first(t, node, "scaled_dot_product_attention")
    return _sdpa(t, node, q, k, v, attn_mask, dropout_p, is_causal, scale), None


# -- convolution and pooling -----------------------------------------------------------------------


def _per_dim(v: Any, n: int) -> tuple[int, ...]:
    vals = as_list(v)
    if len(vals) == 1:
        vals = vals * n
    if len(vals) != n or not all(isinstance(a, int) for a in vals):
        raise UnsupportedError(f"expected {n} static ints, got {v!r}")
    return tuple(vals)


def _conv_padding(padding: Any, kernel: Sequence[Dim], stride: Sequence[int], dilation: Sequence[int]) -> tuple[int, ...]:
    n = len(kernel)
    if padding == "valid":
        return (0,) * (2 * n)
    if padding == "same":
        if any(s != 1 for s in stride):
            raise UnsupportedError("padding='same' needs stride 1")
        sizes = [k for k in kernel if isinstance(k, int)]
        if len(sizes) != n:
            raise UnsupportedError("padding='same' needs a static kernel size")
        total = [d * (k - 1) for d, k in zip(dilation, sizes)]
        return tuple(p // 2 for p in total) + tuple(p - p // 2 for p in total)
    pads = _per_dim(padding, n)
    return pads + pads


def _conv(t: Translator, x: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: int) -> Expr:
    kernel = t.shape(weight)[2:]
    n = len(kernel)
    if n not in (1, 2):
        raise UnsupportedError(f"{n}-D convolution is not supported (1-D and 2-D are)")
    strides, dil = _per_dim(stride, n), _per_dim(dilation, n)
    pads = _conv_padding(padding, kernel, strides, dil)
    unbatched = len(t.shape(x)) == n + 1
    if unbatched:
        x = t.emit(op.expand_dims(x, 0))
    fn = op.conv1d if n == 1 else op.conv2d
    y = t.emit(fn(x, weight, bias, strides, pads, dil, groups))
    return t.emit(op.squeeze(y, 0)) if unbatched else y


@converter("conv1d.default", "conv2d.default", "conv1d.padding", "conv2d.padding")
def _conv_nd(t: Translator, node: Any, x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Expr:
    return _conv(t, x, weight, bias, stride, padding, dilation, groups)


@converter("convolution.default", "_convolution.default")
def _convolution(t: Translator, node: Any, x: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int, *rest: Any) -> Expr:
    if transposed:
        from tilework.frontend.torch.convert_vision import conv_transpose

        return conv_transpose(t, x, weight, bias, stride, padding, output_padding, groups, dilation)
    return _conv(t, x, weight, bias, stride, padding, dilation, groups)


def _batched(t: Translator, x: Expr) -> tuple[Expr, bool]:
    if len(t.shape(x)) == 3:
        return t.emit(op.expand_dims(x, 0)), True
    if len(t.shape(x)) != 4:
        raise UnsupportedError(f"2-D pooling needs a 3-D or 4-D input, got shape {t.shape(x)}")
    return x, False


def _unbatch(t: Translator, y: Expr, unbatched: bool) -> Expr:
    return t.emit(op.squeeze(y, 0)) if unbatched else y


@converter("max_pool2d.default")
def _max_pool2d(t: Translator, node: Any, x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> Expr:
    xb, unbatched = _batched(t, x)
    size = _per_dim(kernel_size, 2)
    strides = _per_dim(stride, 2) if as_list(stride) else size
    y = t.emit(op.max_pool2d(xb, size, strides, _per_dim(padding, 2), _per_dim(dilation, 2), ceil_mode))
    return _unbatch(t, y, unbatched)


@converter("max_pool2d_with_indices.default")
def _max_pool2d_with_indices(t: Translator, node: Any, x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple[Expr | None, ...]:
    """The maxima and, when used, their positions ``h * W + w`` in their input planes."""
    y = _max_pool2d(t, node, x, kernel_size, stride, padding, dilation, ceil_mode)
    if 1 not in t.used_outputs(node):
        return y, None
    xb, unbatched = _batched(t, x)
    size = _per_dim(kernel_size, 2)
    strides = _per_dim(stride, 2) if as_list(stride) else size
    where = t.emit(op.max_pool2d_indices(xb, size, strides, _per_dim(padding, 2), _per_dim(dilation, 2), ceil_mode))
    return y, _unbatch(t, where, unbatched)


@converter("avg_pool2d.default")
def _avg_pool2d(t: Translator, node: Any, x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> Expr:
    if divisor_override is not None:
        raise UnsupportedError("avg_pool2d with divisor_override is not supported")
    xb, unbatched = _batched(t, x)
    size = _per_dim(kernel_size, 2)
    strides = _per_dim(stride, 2) if as_list(stride) else size
    y = t.emit(op.avg_pool2d(xb, size, strides, _per_dim(padding, 2), ceil_mode, count_include_pad))
    return _unbatch(t, y, unbatched)


@converter("avg_pool1d.default")
def _avg_pool1d(t: Translator, node: Any, x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True) -> Expr:
    """``avg_pool2d`` over a plane one row high (``[..., C, L]`` as ``[..., C, 1, L]``)."""
    k, p = as_list(kernel_size)[0], as_list(padding)[0]
    s = as_list(stride)[0] if as_list(stride) else k
    rows = t.emit(op.expand_dims(x, len(t.shape(x)) - 1))
    y = _avg_pool2d(t, node, rows, (1, k), (1, s), (0, p), ceil_mode, count_include_pad)
    return t.emit(op.squeeze(y, len(t.shape(x)) - 1))


@converter("max_pool1d.default")
def _max_pool1d(t: Translator, node: Any, x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> Expr:
    """``max_pool2d`` over a plane one row high, as ``avg_pool1d``."""
    k, p, d = as_list(kernel_size)[0], as_list(padding)[0], as_list(dilation)[0]
    s = as_list(stride)[0] if as_list(stride) else k
    rows = t.emit(op.expand_dims(x, len(t.shape(x)) - 1))
    y = _max_pool2d(t, node, rows, (1, k), (1, s), (0, p), (1, d), ceil_mode)
    return t.emit(op.squeeze(y, len(t.shape(x)) - 1))


@converter("adaptive_avg_pool2d.default", "_adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(t: Translator, node: Any, x: Any, output_size: Any) -> Expr:
    out = [d for d in t.out_shape(node)[-2:] if isinstance(d, int)]
    if len(out) != 2:
        raise UnsupportedError(f"adaptive_avg_pool2d to a symbolic size {t.out_shape(node)[-2:]} is not supported")
    xb, unbatched = _batched(t, x)
    return _unbatch(t, t.emit(op.adaptive_avg_pool2d(xb, out)), unbatched)


__all__: list[str] = []
