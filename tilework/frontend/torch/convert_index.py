"""Converters of ATen ops that index by tensors or run along a dim: ``gather``, the
``scatter`` family (with ``slice_scatter``/``select_scatter``, how export writes an assignment
to a slice), ``index.Tensor`` (advanced indexing by integer tensors), ``index_put`` (its
assignment: ``x[idx] = v``, ``accumulate=True`` adds), ``cumsum``, ``cumprod``, ``tril``/``triu``,
``diff``, ``searchsorted`` and ``bucketize``.

``index.Tensor`` takes one index tensor (or None, a full slice) per leading dim. When the
indexed dims are adjacent the broadcast index shape replaces them in place; otherwise (torch's
rule) it goes first, which the converter gets by moving the indexed dims to the front. Bool
masks as indices select a data-dependent number of elements and are not supported; as
``index_put``'s index, a bool mask takes a value that is the same for every selected element
(a ``where``), and is refused otherwise.

``searchsorted`` and ``bucketize`` count, for each value, the boundaries that come before it
(``b < v`` on the left side, ``b <= v`` on the right, written ``not (b >= v)`` and ``not (b >
v)`` so that a NaN value counts every boundary, as torch's binary search ends past them all): a
comparison of every value with every boundary, summed (not a binary search; for the modest
boundary counts that bucketing sees in models).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from tilework import op
from tilework.errors import UnsupportedError
from tilework.frontend.torch.common import norm_axis
from tilework.frontend.torch.registry import converter
from tilework.ir import sym
from tilework.ir.graph import Expr
from tilework.ir.sym import Dim

if TYPE_CHECKING:
    from tilework.frontend.torch.translator import Translator


@converter("gather.default")
def _gather(t: Translator, node: Any, x: Any, dim: int, index: Any, sparse_grad: bool = False) -> Expr:
    axis = norm_axis(dim, len(t.shape(x)))
    return t.emit(op.gather(x, t.checked_index(index, t.shape(x)[axis]), axis))


def _scatter(t: Translator, node: Any, x: Any, dim: int, index: Any, src: Any, reduction: str) -> Expr:
    dtype = t.out_dtype(node)
    axis = norm_axis(dim, len(t.shape(x)))
    if not isinstance(src, Expr):  # scatter.value: one value everywhere index points
        src = t.emit(op.broadcast_to(t.tensor(src, dtype), t.shape(index)))
    return t.emit(op.scatter(t.tensor(x, dtype), index, t.tensor(src, dtype), axis, reduction))


@converter("scatter.src", "scatter.value")
def _scatter_plain(t: Translator, node: Any, x: Any, dim: int, index: Any, src: Any) -> Expr:
    return _scatter(t, node, x, dim, index, src, "none")


@converter("scatter.reduce", "scatter.value_reduce")
def _scatter_reduce_legacy(t: Translator, node: Any, x: Any, dim: int, index: Any, src: Any, *, reduce: str) -> Expr:
    names = {"add": "add", "multiply": "mul"}
    if reduce not in names:
        raise UnsupportedError(f"scatter with reduce={reduce!r}")
    return _scatter(t, node, x, dim, index, src, names[reduce])


@converter("scatter_add.default")
def _scatter_add(t: Translator, node: Any, x: Any, dim: int, index: Any, src: Any) -> Expr:
    return _scatter(t, node, x, dim, index, src, "add")


@converter("scatter_reduce.two")
def _scatter_reduce(t: Translator, node: Any, x: Any, dim: int, index: Any, src: Any, reduce: str, *, include_self: bool = True) -> Expr:
    names = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}
    if reduce not in names or not include_self:
        raise UnsupportedError(f"scatter_reduce with reduce={reduce!r}, include_self={include_self} (supported: sum, prod, amax, amin with include_self=True)")
    return _scatter(t, node, x, dim, index, src, names[reduce])


def _slice_bound(v: Any, n: Any, default: Any) -> Any:
    """A slice bound of ``slice_scatter`` as a position in ``[0, n]`` (None and torch's huge
    open end are ``default``; negative ints count from the end)."""
    if v is None or (isinstance(v, int) and abs(v) >= 2**62):
        return default
    if isinstance(v, int) and v < 0:
        v = sym.max_(sym.add(n, v), 0)
    return sym.min_(v, n) if isinstance(v, int) and isinstance(n, int) else v


@converter("slice_scatter.default")
def _slice_scatter(t: Translator, node: Any, x: Any, src: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Expr:
    """``x`` with ``x[..., start:end:step, ...] = src`` along ``dim``: the parts of ``x`` before
    and after around ``src`` (step 1), else a scatter at the slice's positions."""
    dtype = t.out_dtype(node)
    x, src = t.tensor(x, dtype), t.tensor(src, dtype)
    axis = norm_axis(dim, len(t.shape(x)))
    n = t.shape(x)[axis]
    lo, hi = _slice_bound(start, n, 0), _slice_bound(end, n, n)
    if not isinstance(step, int) or step <= 0:
        raise UnsupportedError(f"slice_scatter: step must be a positive int, got {step!r}")
    if step > 1:
        src_shape = t.shape(src)
        pos = t.emit(op.arange(lo, sym.add(lo, sym.mul(src_shape[axis], step)), step, dtype="int64"))
        pos = t.emit(op.reshape(pos, [src_shape[axis] if i == axis else 1 for i in range(len(src_shape))]))
        return t.emit(op.scatter(x, t.emit(op.broadcast_to(pos, src_shape)), src, axis))
    parts = [src]
    if not (isinstance(lo, int) and lo == 0):
        parts.insert(0, t.emit(op.strided_slice(x, (axis,), (0,), (lo,))))
    if not sym.prove_eq(hi, n):
        parts.append(t.emit(op.strided_slice(x, (axis,), (hi,), (None,))))
    return parts[0] if len(parts) == 1 else t.emit(op.concat(parts, axis=axis))


@converter("copy.default")
def _copy(t: Translator, node: Any, x: Any, src: Any, non_blocking: bool = False) -> Expr:
    """``x.copy_(src)`` made functional: ``src`` cast to ``x``'s dtype, broadcast to its shape."""
    return t.emit(op.broadcast_to(t.tensor(src, t.out_dtype(node)), t.out_shape(node)))


@converter("select_scatter.default")
def _select_scatter(t: Translator, node: Any, x: Any, src: Any, dim: int, index: Any) -> Expr:
    """``x`` with ``x[..., index, ...] = src`` along ``dim`` (``src`` lacks that dim)."""
    axis = norm_axis(dim, len(t.shape(x)))
    row = t.emit(op.expand_dims(t.tensor(src, t.out_dtype(node)), axis))
    end = None if isinstance(index, int) and index == -1 else sym.add(index, 1)
    return _slice_scatter(t, node, x, row, dim, index, end, 1)


@converter("index.Tensor", "_unsafe_index.Tensor")
def _index(t: Translator, node: Any, x: Any, indices: Sequence[Any]) -> Expr:
    ndim = len(t.shape(x))
    if any(v is not None and t.dtype(v) == "bool" for v in indices):  # before the index check, which wants ints
        raise UnsupportedError("indexing by a bool mask (a data-dependent number of elements) is not supported")
    if "_unsafe_index" not in str(node.target):  # _unsafe_index: unchecked by torch too (its decompositions' own indices)
        indices = [v if v is None else t.checked_index(v, t.shape(x)[i], negative=True) for i, v in enumerate(indices)]
    picked = [i for i, v in enumerate(indices) if v is not None]
    if not picked:
        return x
    tensors = [indices[i] for i in picked]
    adjacent = picked == list(range(picked[0], picked[0] + len(picked)))
    if adjacent:
        return t.emit(op.index_tensor(x, tensors, axis=picked[0]))
    rest = [d for d in range(ndim) if d not in picked]
    front = t.permute(x, picked + rest)
    return t.emit(op.index_tensor(front, tensors, axis=0))


def _normalized(t: Translator, idx: Expr, size: Any) -> Expr:
    """``idx`` (checked within ``[-size, size)``) as int64 positions in ``[0, size)``."""
    idx = t.cast(t.checked_index(idx, size, negative=True), "int64")
    wrapped = t.emit(op.add(idx, t.tensor(size, "int64")))
    return t.emit(op.where(t.emit(op.less(idx, t.tensor(0, "int64"))), wrapped, idx))


def _index_put_mask(t: Translator, x: Expr, indices: Sequence[Any], v: Expr, accumulate: bool) -> Expr:
    """``x[mask] = v`` (or ``+=``): ``where(mask, v, x)``, when ``v`` is one value for every
    element the mask selects (it broadcasts without the selected elements' dim)."""
    shape = t.shape(x)
    picked = [i for i, ix in enumerate(indices) if ix is not None]
    why = "index_put with a bool mask index"
    if len(picked) != 1 or t.dtype(indices[picked[0]]) != "bool":
        raise UnsupportedError(f"{why} among other indices is not supported (the number of elements it selects is known only at run time)")
    p = picked[0]
    mask = indices[p]
    r = len(t.shape(mask))
    rest = len(shape) - p - r
    vshape: list[Dim] = list(t.shape(v))
    ones: list[Dim] = [1] * r
    if len(vshape) > rest:  # v has the dim of the selected elements: it must be 1
        count = vshape[len(vshape) - rest - 1]
        if not (isinstance(count, int) and count == 1):
            raise UnsupportedError(f"{why}: the values must be the same for every selected element (a dim of 1 where the mask's elements go, got shape {tuple(vshape)}); one value per selected element needs their count, known only at run time")
        vshape = vshape[: len(vshape) - rest - 1] + ones + vshape[len(vshape) - rest :]
    else:
        vshape = ones + vshape
    v = t.emit(op.reshape(v, vshape)) if vshape != list(t.shape(v)) else v
    m = t.emit(op.reshape(mask, [1] * p + list(t.shape(mask)) + [1] * rest))
    if accumulate:
        zero = t.tensor(0, t.dtype(x))
        return t.emit(op.add(x, t.emit(op.broadcast_to(t.emit(op.where(m, v, zero)), shape))))
    return t.emit(op.where(m, v, x))


@converter("index_put.default", "index_put_.default", "_index_put_impl.default", "_unsafe_index_put.default")
def _index_put(t: Translator, node: Any, x: Any, indices: Sequence[Any], values: Any, accumulate: bool = False, unsafe: bool = False) -> Expr:
    """``x`` with ``x[indices] = values`` (``+=`` when ``accumulate``; a repeated position then
    adds every value, and without it the last one stays, as torch's CPU loop leaves it).

    The indexed dims go first (as ``index.Tensor`` reads them), flattened into one of their
    positions' count; the indices become one linear position each. ``values`` (broadcast to the
    indexed shape, its index dims first) are added by a ``scatter`` along that dim; assigned,
    a scatter of the value numbers into a vector of the positions finds the one that lands on
    each (positions x values compares, not times the row length too), and the rows are copied
    by one ``take``."""
    dtype = t.out_dtype(node)
    x, v = t.tensor(x, dtype), t.tensor(values, dtype)
    shape = t.shape(x)
    ndim = len(shape)
    if any(ix is not None and t.dtype(ix) == "bool" for ix in indices):
        return _index_put_mask(t, x, indices, v, bool(accumulate))
    picked = [i for i, ix in enumerate(indices) if ix is not None]
    if not picked:
        return t.emit(op.add(x, v) if accumulate else op.broadcast_to(v, shape))
    rest = [d for d in range(ndim) if d not in picked]
    adjacent = picked == list(range(picked[0], picked[0] + len(picked)))
    lin: Expr | None = None
    for i in picked:
        pos = _normalized(t, indices[i], shape[i])
        lin = pos if lin is None else t.emit(op.add(t.emit(op.multiply(lin, t.tensor(shape[i], "int64"))), pos))
    assert lin is not None
    bshape = t.shape(lin)
    nb = len(bshape)
    rest_shape = [shape[d] for d in rest]
    before = picked[0] if adjacent else 0  # the dims of x before the index dims in the values' shape
    vfull: Expr = t.emit(op.broadcast_to(v, [*rest_shape[:before], *bshape, *rest_shape[before:]]))
    if before:
        vfull = t.permute(vfull, [*range(before, before + nb), *range(before), *range(before + nb, nb + len(rest))])
    count = sym.product(bshape)
    src = t.emit(op.reshape(vfull, [count, *rest_shape]))
    front = t.permute(x, picked + rest)
    positions = sym.product(shape[i] for i in picked)
    flat = t.emit(op.reshape(front, [positions, *rest_shape]))
    if accumulate:
        where = t.emit(op.reshape(lin, [count] + [1] * len(rest)))
        put = t.emit(op.scatter(flat, t.emit(op.broadcast_to(where, [count, *rest_shape])), src, 0, "add"))
    else:  # which value lands on each position (the last one), then one copy of the rows
        last = t.emit(op.zeros([positions], "int64"))  # value k lands as k + 1; 0: none does
        last = t.emit(op.scatter(last, t.emit(op.reshape(lin, [count])), t.emit(op.arange(1, sym.add(count, 1), 1, dtype="int64")), 0))
        padded = t.emit(op.concat([t.emit(op.zeros([1, *rest_shape], dtype)), src], axis=0))  # row 0 is read where none lands
        rows = t.emit(op.take(padded, last, 0))
        hit = t.emit(op.reshape(t.emit(op.greater(last, t.tensor(0, "int64"))), [positions] + [1] * len(rest)))
        put = t.emit(op.where(hit, rows, flat))
    put = t.emit(op.reshape(put, [shape[i] for i in picked] + rest_shape))
    order = picked + rest
    return t.permute(put, [order.index(d) for d in range(ndim)])


def _search(t: Translator, node: Any, seq: Any, values: Any, right: bool, sorter: Any = None) -> Expr:
    """For each value, the count of ``seq``'s boundaries before it (along ``seq``'s last dim;
    an N-d ``seq`` pairs its leading dims with the values')."""
    common = t.promote(seq, values)
    seq, vals = t.tensor(seq, common), t.tensor(values, common)
    if sorter is not None:
        seq = t.emit(op.gather(seq, t.checked_index(sorter, t.shape(seq)[-1]), len(t.shape(seq)) - 1))
    sshape, vshape = t.shape(seq), t.shape(vals)
    if len(sshape) == 1:
        b = t.emit(op.reshape(seq, [1] * len(vshape) + [sshape[0]]))
    else:
        b = t.emit(op.expand_dims(seq, len(sshape) - 1))  # [..., 1, S] against the values' [..., V, 1]
    before = t.emit(op.greater(b, t.emit(op.expand_dims(vals, len(vshape)))) if right else op.greater_equal(b, t.emit(op.expand_dims(vals, len(vshape)))))
    counted = t.emit(op.astype(t.emit(op.logical_not(before)), "int64"))
    return t.cast(t.emit(op.sum(counted, (len(vshape),), False)), t.out_dtype(node))


@converter("searchsorted.Tensor", "searchsorted.Scalar")
def _searchsorted(t: Translator, node: Any, seq: Any, values: Any, *, out_int32: bool = False, right: bool = False, side: Any = None, sorter: Any = None) -> Expr:
    """``torch.searchsorted``: ``right`` or ``side='right'`` counts the boundaries ``<=`` a
    value, else those ``<`` it; ``sorter`` orders an unsorted ``seq``."""
    return _search(t, node, seq, values, bool(right) or side == "right", sorter)


@converter("bucketize.Tensor", "bucketize.Scalar")
def _bucketize(t: Translator, node: Any, values: Any, boundaries: Any, *, out_int32: bool = False, right: bool = False) -> Expr:
    """``torch.bucketize``: ``searchsorted(boundaries, values, right=right)``."""
    return _search(t, node, boundaries, values, bool(right))


@converter("cumsum.default")
def _cumsum(t: Translator, node: Any, x: Any, dim: int, *, dtype: Any = None) -> Expr:
    out = t.out_dtype(node)
    return t.emit(op.cumsum(t.tensor(x, out), norm_axis(dim, len(t.shape(x))), dtype=out))


@converter("cumprod.default")
def _cumprod(t: Translator, node: Any, x: Any, dim: int, *, dtype: Any = None) -> Expr:
    out = t.out_dtype(node)  # an integer or bool input multiplies in int64, as torch's
    return t.emit(op.index.cumprod(t.tensor(x, out), norm_axis(dim, len(t.shape(x)))))


@converter("tril.default")
def _tril(t: Translator, node: Any, x: Any, diagonal: Any = 0) -> Expr:
    return t.emit(op.tril(x, diagonal))


@converter("triu.default")
def _triu(t: Translator, node: Any, x: Any, diagonal: Any = 0) -> Expr:
    return t.emit(op.triu(x, diagonal))


@converter("diff.default")
def _diff(t: Translator, node: Any, x: Any, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Expr:
    """``y[i] = x[i + 1] - x[i]`` along ``dim``, ``n`` times, after joining prepend/append."""
    axis = norm_axis(dim, len(t.shape(x)))
    parts = [p for p in (prepend, x, append) if p is not None]
    y = parts[0] if len(parts) == 1 else t.emit(op.concat(parts, axis=axis))
    for _ in range(n):
        hi = t.emit(op.strided_slice(y, (axis,), (1,), (None,)))
        lo = t.emit(op.strided_slice(y, (axis,), (0,), (-1,)))
        y = t.emit(op.logical_xor(hi, lo) if t.dtype(y) == "bool" else op.subtract(hi, lo))
    return y


__all__: list[str] = []
