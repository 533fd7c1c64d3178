"""Converters of ATen ops that move data without computing: views and reshapes, permutes,
broadcasts, (un)squeezes, concatenation and stacking, splits, slices, selects, ``repeat``,
``flip``, ``roll``, ``unfold`` (sliding windows) and ``diagonal``.

torch's metadata states every output shape, with symbolic sizes, so reshapes and broadcasts
take their target shape from it (no ``-1`` to resolve) and splits read their parts' lengths
from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from tilework import op
from tilework.errors import UnsupportedError
from tilework.frontend.torch.common import as_list, norm_axis
from tilework.frontend.torch.registry import converter
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.graph import Expr, TupleGetItem
from tilework.ir.sym import Dim

if TYPE_CHECKING:
    from tilework.frontend.torch.translator import Translator

_BIG = 2**62  # torch spells an open slice end as a huge int


@converter("view.default", "reshape.default", "_unsafe_view.default", "view_copy.default", "_reshape_copy.default", "unflatten.int", "flatten.using_ints", "view_as.default", "reshape_as.default")
def _reshape(t: Translator, node: Any, x: Any, *args: Any, **kwargs: Any) -> Expr:
    shape = t.out_shape(node)
    if sym.prove_dims_eq(t.shape(x), shape):
        return x
    return t.emit(op.reshape(x, shape))


@converter("permute.default", "permute_copy.default")
def _permute(t: Translator, node: Any, x: Any, dims: Sequence[int]) -> Expr:
    ndim = len(t.shape(x))
    return t.permute(x, [norm_axis(d, ndim) for d in dims])


@converter("transpose.int", "transpose_copy.int", "swapaxes.default")
def _transpose(t: Translator, node: Any, x: Any, d0: int, d1: int) -> Expr:
    ndim = len(t.shape(x))
    a, b = norm_axis(d0, ndim), norm_axis(d1, ndim)
    perm = list(range(ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(t, node, x, perm)


@converter("t.default", "numpy_T.default")
def _t(t: Translator, node: Any, x: Any) -> Expr:
    ndim = len(t.shape(x))
    return x if ndim < 2 else _permute(t, node, x, list(range(ndim))[::-1])


@converter("mT.default", "mH.default", "adjoint.default")
def _swap_last(t: Translator, node: Any, x: Any) -> Expr:
    """The last two dims swapped (mH and adjoint conjugate too, a no-op for real tensors)."""
    return _transpose(t, node, x, -2, -1)


@converter("expand.default", "expand_as.default", "expand_copy.default", "broadcast_to.default")
def _expand(t: Translator, node: Any, x: Any, *args: Any, **kwargs: Any) -> Expr:
    shape = t.out_shape(node)
    if sym.prove_dims_eq(t.shape(x), shape):
        return x
    return t.emit(op.broadcast_to(x, shape))


@converter("unsqueeze.default", "unsqueeze_copy.default")
def _unsqueeze(t: Translator, node: Any, x: Any, dim: int) -> Expr:
    return t.emit(op.expand_dims(x, norm_axis(dim, len(t.shape(x)) + 1)))


@converter("squeeze.dim", "squeeze.dims", "squeeze.default", "squeeze_copy.dim", "squeeze_copy.dims", "squeeze_copy.default")
def _squeeze(t: Translator, node: Any, x: Any, dims: Any = None) -> Expr:
    shape = t.shape(x)
    asked = range(len(shape)) if dims is None else [norm_axis(d, len(shape)) for d in as_list(dims)]
    drop = [a for a in asked if isinstance(shape[a], int) and shape[a] == 1]
    if not drop:
        return x
    return t.emit(op.squeeze(x, drop))


@converter("cat.default", "concat.default", "concatenate.default")
def _cat(t: Translator, node: Any, tensors: Sequence[Any], dim: int = 0) -> Expr:
    dtype = t.out_dtype(node)
    ndim = len(t.out_shape(node))
    parts = [t.tensor(x, dtype) for x in tensors]
    # torch still accepts 1-D empty tensors next to tensors of any rank; they add nothing
    parts = [p for p in parts if not (len(t.shape(p)) == 1 and t.shape(p)[0] == 0 and ndim != 1)]
    if len(parts) == 1:
        return parts[0]
    return t.emit(op.concat(parts, axis=norm_axis(dim, ndim)))


@converter("stack.default")
def _stack(t: Translator, node: Any, tensors: Sequence[Any], dim: int = 0) -> Expr:
    dtype = t.out_dtype(node)
    axis = norm_axis(dim, len(t.out_shape(node)))
    parts = [t.emit(op.expand_dims(t.tensor(x, dtype), axis)) for x in tensors]
    return parts[0] if len(parts) == 1 else t.emit(op.concat(parts, axis=axis))


def _split_parts(t: Translator, node: Any, x: Expr, dim: int, unit: bool = False) -> tuple[Expr, ...]:
    """``x`` split along ``dim`` into the parts torch's metadata lists (``unit``: parts of
    length 1, whose dim torch drops)."""
    ndim = len(t.shape(x))
    axis = norm_axis(dim, ndim)
    count = len(node.meta["val"])
    lengths: list[Dim] = [1] * count if unit else [t.out_shape(node, i)[axis] for i in range(count)]
    if len(lengths) == 1:
        return (x,)
    points: list[Dim] = []
    total: Dim = 0
    for n in lengths[:-1]:
        total = sym.add(total, n)
        points.append(total)
    parts = t.emit(op.split(x, points, axis=axis))
    return tuple(t.emit(TupleGetItem(parts, i)) for i in range(len(lengths)))


@converter("split.Tensor", "split_with_sizes.default", "split_copy.Tensor", "split_with_sizes_copy.default", "split.sizes", "tensor_split.sections", "tensor_split.indices")
def _split(t: Translator, node: Any, x: Any, sizes: Any, dim: int = 0) -> tuple[Expr, ...]:
    return _split_parts(t, node, x, dim)


@converter("chunk.default")
def _chunk(t: Translator, node: Any, x: Any, chunks: int, dim: int = 0) -> tuple[Expr, ...]:
    return _split_parts(t, node, x, dim)


@converter("unbind.int", "unbind_copy.int")
def _unbind(t: Translator, node: Any, x: Any, dim: int = 0) -> tuple[Expr, ...]:
    axis = norm_axis(dim, len(t.shape(x)))
    return tuple(t.emit(op.squeeze(p, axis)) for p in _split_parts(t, node, x, dim, unit=True))


def _open(v: Any) -> Any:
    return None if v is None or (isinstance(v, int) and abs(v) >= _BIG) else v


@converter("slice.Tensor", "slice_copy.Tensor")
def _slice(t: Translator, node: Any, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Expr:
    shape = t.shape(x)
    axis = norm_axis(dim, len(shape))
    start, end = _open(start), _open(end)
    if start in (None, 0) and end is None and step == 1:
        return x
    if not isinstance(step, int) or step <= 0:
        raise UnsupportedError(f"slice step must be a positive int, got {step!r}")
    return t.emit(op.strided_slice(x, (axis,), (start,), (end,), (step,)))


@converter("narrow.default", "narrow_copy.default")
def _narrow(t: Translator, node: Any, x: Any, dim: int, start: Any, length: Any) -> Expr:
    return _slice(t, node, x, dim, start, sym.add(start, length), 1)


@converter("select.int", "select_copy.int")
def _select(t: Translator, node: Any, x: Any, dim: int, index: Any) -> Expr:
    shape = t.shape(x)
    axis = norm_axis(dim, len(shape))
    end = None if isinstance(index, int) and index == -1 else sym.add(index, 1)
    part = t.emit(op.strided_slice(x, (axis,), (index,), (end,)))
    return t.emit(op.squeeze(part, axis))


@converter("index_select.default")
def _index_select(t: Translator, node: Any, x: Any, dim: int, index: Any) -> Expr:
    axis = norm_axis(dim, len(t.shape(x)))
    return t.emit(op.take(x, t.checked_index(index, t.shape(x)[axis]), axis=axis))


@converter("embedding.default")
def _embedding(t: Translator, node: Any, weight: Any, indices: Any, *args: Any) -> Expr:
    return t.emit(op.take(weight, t.checked_index(indices, t.shape(weight)[0]), axis=0))


@converter("repeat.default")
def _repeat(t: Translator, node: Any, x: Any, repeats: Sequence[Any]) -> Expr:
    """Tiling: ``x`` gets a size-1 dim before each of its dims, broadcast to the repeat counts
    and merged back."""
    reps = list(repeats)
    ones: list[Dim] = [1] * (len(reps) - len(t.shape(x)))
    shape = ones + list(t.shape(x))
    y = t.emit(op.reshape(x, shape)) if len(shape) != len(t.shape(x)) else x
    inter = [d for s in shape for d in (1, s)]
    wide = [d for r, s in zip(reps, shape) for d in (r, s)]
    y = t.emit(op.reshape(y, inter))
    y = t.emit(op.broadcast_to(y, wide))
    return t.emit(op.reshape(y, t.out_shape(node)))


@converter("flip.default")
def _flip(t: Translator, node: Any, x: Any, dims: Any) -> Expr:
    """``x[::-1]`` along each of ``dims``."""
    axes = sorted({norm_axis(d, len(t.shape(x))) for d in as_list(dims)})
    if not axes:
        return x
    return t.emit(op.strided_slice(x, axes, [None] * len(axes), [None] * len(axes), [-1] * len(axes)))


@converter("roll.default")
def _roll(t: Translator, node: Any, x: Any, shifts: Any, dims: Any = ()) -> Expr:
    """``torch.roll``: along each dim the last ``shift mod n`` entries move to the front (two
    slices and a concat; a symbolic length gets a symbolic split point). Without dims the
    flattened tensor rolls and keeps its shape."""
    shifts, dims = as_list(shifts), as_list(dims)
    if not dims:
        flat = t.emit(op.reshape(x, [sym_walk.simplify(_numel(t.shape(x)))]))
        return t.emit(op.reshape(_roll(t, node, flat, shifts, [0]), t.shape(x)))
    if len(shifts) != len(dims):
        raise UnsupportedError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
    ndim = len(t.shape(x))
    y = x
    for s, d in zip(shifts, dims):
        axis = norm_axis(d, ndim)
        n = t.shape(y)[axis]
        cut = sym.sub(n, sym.floormod(s, n))  # the front part y[:cut] goes to the back
        if isinstance(n, int) and isinstance(cut, int) and cut in (0, n):
            continue
        head = t.emit(op.strided_slice(y, (axis,), (cut,), (None,)))
        tail = t.emit(op.strided_slice(y, (axis,), (0,), (cut,)))
        y = t.emit(op.concat([head, tail], axis=axis))
    return y


@converter("unfold.default")
def _unfold(t: Translator, node: Any, x: Any, dim: int, size: int, step: int) -> Expr:
    """``x.unfold(dim, size, step)``: the windows ``x[..., j*step : j*step + size, ...]`` along
    ``dim`` (their count from torch's metadata), each window's elements in a new last dim; one
    ``take`` by the ``[count, size]`` positions, then that dim moved last."""
    out = t.out_shape(node)
    ndim = len(t.shape(x))
    if ndim == 0:  # a 0-d tensor unfolds into one window of one element
        return t.emit(op.reshape(x, out))
    axis = norm_axis(dim, ndim)
    if not isinstance(size, int) or not isinstance(step, int) or step <= 0:
        raise UnsupportedError(f"unfold: size and step must be ints (step positive), got size={size!r}, step={step!r}")
    count = out[axis]
    starts = t.emit(op.reshape(t.emit(op.arange(0, sym.mul(count, step), step, dtype="int64")), [count, 1]))
    within = t.emit(op.reshape(t.emit(op.arange(0, size, 1, dtype="int64")), [1, size]))
    windows = t.emit(op.take(x, t.emit(op.add(starts, within)), axis))  # [..., count, size, ...]
    if axis == ndim - 1:
        return windows
    perm = [d for d in range(ndim + 1) if d != axis + 1] + [axis + 1]
    return t.permute(windows, perm)


@converter("diagonal.default", "diagonal_copy.default")
def _diagonal(t: Translator, node: Any, x: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Expr:
    """``x[..., i, i + offset]`` over ``dim1``, ``dim2`` (a negative offset: ``x[..., i -
    offset, i]``), the diagonal last: both dims moved last, then indexed by two ``arange``s of
    the diagonal's length (from torch's metadata)."""
    ndim = len(t.shape(x))
    d1, d2 = norm_axis(dim1, ndim), norm_axis(dim2, ndim)
    if d1 == d2:
        raise UnsupportedError(f"diagonal: dim1 and dim2 are the same dim ({dim1}, {dim2})")
    if not isinstance(offset, int):
        raise UnsupportedError(f"diagonal: offset must be an int, got {offset!r}")
    length = t.out_shape(node)[-1]
    front = t.permute(x, [d for d in range(ndim) if d not in (d1, d2)] + [d1, d2])
    rows = t.emit(op.arange(max(-offset, 0), sym.add(length, max(-offset, 0)), 1, dtype="int64"))
    cols = t.emit(op.arange(max(offset, 0), sym.add(length, max(offset, 0)), 1, dtype="int64"))
    return t.emit(op.index_tensor(front, [rows, cols], axis=ndim - 2))


def _numel(shape: Sequence[Dim]) -> Dim:
    total: Dim = 1
    for d in shape:
        total = sym.mul(total, d)
    return total


__all__: list[str] = []
