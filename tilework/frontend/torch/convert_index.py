"""Converters of ATen ops that index by tensors or run along a dim: ``gather``, the
``scatter`` family (with ``slice_scatter``/``select_scatter``, how export writes an assignment
to a slice), ``index.Tensor`` (advanced indexing by integer tensors), ``cumsum``, ``cumprod``,
``tril``/``triu`` and ``diff``.

``index.Tensor`` takes one index tensor (or None, a full slice) per leading dim. When the
indexed dims are adjacent the broadcast index shape replaces them in place; otherwise (torch's
rule) it goes first, which the converter gets by moving the indexed dims to the front. Bool
masks as indices select a data-dependent number of elements and are not supported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from tilework import op
from tilework.errors import UnsupportedError
from tilework.frontend.torch.common import norm_axis
from tilework.frontend.torch.registry import converter
from tilework.ir import sym
from tilework.ir.graph import Expr

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
