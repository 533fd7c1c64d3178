"""Converters of ATen reductions: ``sum``, ``mean``, ``prod``, ``amax``/``amin``,
``max``/``min`` (whole tensor, or along a dim with their indices), ``argmax``/``argmin``,
``any``/``all``, ``var``/``std``, ``var_mean``, ``linalg_vector_norm`` (``F.normalize``, ``x.norm``), ``logsumexp``,
``kthvalue`` and ``median``. An empty dim list reduces every dim (torch's rule); a sum of
an integer tensor is an int64 sum.

``kthvalue`` and ``median`` (the lower median, torch's) take the ``k``-th of the ``k`` smallest
(``topk``, which compares every pair along the dim: meant for the modest lengths these see).
A NaN orders as the largest value (topk ranks it as ``+inf``, so a NaN beside a ``+inf`` may
come first); ``median`` gives NaN, at the first NaN's index, where the dim holds one (torch's).
Among equal values any one's index is valid (torch documents no choice): topk's is the k-th in
order of index."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from tilework import op
from tilework.frontend.torch.common import as_list, norm_axis
from tilework.frontend.torch.registry import converter
from tilework.ir import sym
from tilework.ir.graph import Expr, TupleGetItem
from tilework.ir.dtype import is_float_dtype
from tilework.ir.sym import Dim

if TYPE_CHECKING:
    from tilework.frontend.torch.translator import Translator


def _axes(t: Translator, x: Expr, dim: Any) -> tuple[int, ...] | None:
    ndim = len(t.shape(x))
    dims = as_list(dim) if dim is not None else []
    if not dims or ndim == 0:
        return None
    return tuple(sorted({norm_axis(d, ndim) for d in dims}))


def _reducer(fn: Callable[..., Expr]) -> Callable[..., Expr]:
    def convert(t: Translator, node: Any, x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Expr:
        y = t.tensor(x, t.out_dtype(node))
        return t.emit(fn(y, _axes(t, y, dim), keepdim))

    return convert


for _name, _fn in (("sum", op.sum), ("mean", op.mean), ("amax", op.max), ("amin", op.min)):
    converter(f"{_name}.default", f"{_name}.dim_IntList", f"{_name}.dim")(_reducer(_fn))
converter("prod.default", "prod.dim_int")(_reducer(op.prod))
converter("max.default")(lambda t, node, x: t.emit(op.max(x)))
converter("min.default")(lambda t, node, x: t.emit(op.min(x)))


def _with_index(value: Callable[..., Expr], index: Callable[..., Expr]) -> Callable[..., tuple[Expr | None, Expr | None]]:
    def convert(t: Translator, node: Any, x: Any, dim: int, keepdim: bool = False) -> tuple[Expr | None, Expr | None]:
        axis = norm_axis(dim, len(t.shape(x)))
        used = t.used_outputs(node)  # an unused result is not computed
        v = t.emit(value(x, axis, keepdim)) if 0 in used else None
        i = t.emit(index(x, axis, keepdim)) if 1 in used else None
        return v, i

    return convert


converter("max.dim")(_with_index(op.max, op.argmax))
converter("min.dim")(_with_index(op.min, op.argmin))


def _arg(fn: Callable[..., Expr]) -> Callable[..., Expr]:
    def convert(t: Translator, node: Any, x: Any, dim: Any = None, keepdim: bool = False) -> Expr:
        if dim is None:
            return t.emit(fn(x))
        return t.emit(fn(x, norm_axis(dim, len(t.shape(x))), keepdim))

    return convert


converter("argmax.default")(_arg(op.argmax))
converter("argmin.default")(_arg(op.argmin))


def _boolean(fn: Callable[..., Expr]) -> Callable[..., Expr]:
    """any (max) / all (min) of the values as bools, via int8."""

    def convert(t: Translator, node: Any, x: Any, dim: Any = None, keepdim: bool = False) -> Expr:
        flags = t.emit(op.astype(t.tensor(x, "bool"), "int8"))
        return t.emit(op.astype(t.emit(fn(flags, _axes(t, flags, dim), keepdim)), "bool"))

    return convert


converter("any.default", "any.dim", "any.dims")(_boolean(op.max))
converter("all.default", "all.dim", "all.dims")(_boolean(op.min))


def _var(t: Translator, dtype: str, x: Any, dim: Any, correction: Any, keepdim: bool) -> Expr:
    """``sum((x - mean)^2) / (n - correction)``."""
    y = t.tensor(x, dtype)
    axes = _axes(t, y, dim)
    shape = t.shape(y)
    count = sym.product(shape[a] for a in (axes if axes is not None else range(len(shape))))
    dev = t.emit(op.subtract(y, t.emit(op.mean(y, axes, True))))
    total = t.emit(op.sum(t.emit(op.multiply(dev, dev)), axes, keepdim))
    if isinstance(correction, float) and not correction.is_integer():  # a float divisor
        return t.emit(op.divide(total, t.emit(op.subtract(t.tensor(count, dtype), t.tensor(correction, dtype)))))
    return t.emit(op.divide(total, t.tensor(sym.sub(count, int(correction)), dtype)))


@converter("var.correction", "var.dim", "var.default")
def _var_conv(t: Translator, node: Any, x: Any, dim: Any = None, unbiased: Any = True, keepdim: bool = False, *, correction: Any = None) -> Expr:
    corr = correction if correction is not None else (1 if unbiased is True else 0 if unbiased is False else unbiased)
    return _var(t, t.out_dtype(node), x, dim, corr, keepdim)


@converter("std.correction", "std.dim", "std.default")
def _std(t: Translator, node: Any, x: Any, dim: Any = None, unbiased: Any = True, keepdim: bool = False, *, correction: Any = None) -> Expr:
    return t.emit(op.sqrt(_var_conv(t, node, x, dim, unbiased, keepdim, correction=correction)))


@converter("var_mean.correction", "var_mean.dim", "var_mean.default")
def _var_mean(t: Translator, node: Any, x: Any, dim: Any = None, unbiased: Any = True, keepdim: bool = False, *, correction: Any = None) -> tuple[Expr, Expr]:
    """``(var, mean)``; ``std_mean`` decomposes to it."""
    dtype = t.out_dtype(node, 0)
    corr = correction if correction is not None else (1 if unbiased is True else 0 if unbiased is False else unbiased)
    var = _var(t, dtype, x, dim, corr, keepdim)
    y = t.tensor(x, dtype)
    return var, t.emit(op.mean(y, _axes(t, y, dim), keepdim))


@converter("logsumexp.default")
def _logsumexp(t: Translator, node: Any, x: Any, dim: Any = (), keepdim: bool = False) -> Expr:
    """The logsumexp op: ``m + log(sum(exp(x - m)))`` with ``m`` the largest ``x``, or 0 where
    that is infinite; an empty set gives ``-inf`` (torch's), as all ``-inf`` does, a ``+inf``
    gives ``inf``."""
    out = t.out_dtype(node)
    y = t.tensor(x, out)
    axes = _axes(t, y, dim)
    shape = t.shape(y)
    if any(isinstance(shape[a], int) and shape[a] == 0 for a in (axes if axes is not None else range(len(shape)))):
        return t.emit(op.full(t.out_shape(node), float("-inf"), out))  # a kernel's reduction cannot be statically empty
    return t.emit(op.reduce.logsumexp(y, axes, keepdim))


def _kth_smallest(t: Translator, x: Expr, k: Any, axis: int, keepdim: bool) -> tuple[Expr, Expr]:
    """The ``k``-th smallest along ``axis`` (``k`` from 1, may be symbolic, at most the dim's
    size: the caller checks it, naming the user's op) and its index."""
    from tilework.op import math as op_math
    from tilework.op import search

    key = x
    if is_float_dtype(t.dtype(x)):  # NaN ranks as +inf (topk's comparisons skip a NaN)
        key = t.emit(op.where(t.emit(op_math.isnan(x)), t.tensor(float("inf"), t.dtype(x)), x))
    order = t.emit(search.topk(key, k, axis, largest=False))
    idx = t.emit(op.strided_slice(t.emit(TupleGetItem(order, 1)), (axis,), (sym.sub(k, 1),), (k,)))
    val = t.emit(op.gather(x, idx, axis))
    if not keepdim:
        idx, val = t.emit(op.squeeze(idx, (axis,))), t.emit(op.squeeze(val, (axis,)))
    return val, idx


@converter("kthvalue.default")
def _kthvalue(t: Translator, node: Any, x: Any, k: int, dim: int = -1, keepdim: bool = False) -> tuple[Expr, Expr]:
    """``(values, indices)`` of the ``k``-th smallest along ``dim``; ``k`` past the dim's size
    (an empty dim too) is a run-time error naming kthvalue, ``k`` and the dim (torch raises)."""
    if len(t.shape(x)) == 0:
        return _kthvalue(t, node, t.emit(op.reshape(x, [1])), k, 0, False)
    axis = norm_axis(dim, len(t.shape(x)))
    d = t.shape(x)[axis]
    t.require_at_least(d, k, f"kthvalue: k = {sym.to_str(k)} must not exceed the size of dim {axis} ({sym.to_str(d)})")
    return _kth_smallest(t, x, k, axis, keepdim)


def _median_along(t: Translator, x: Expr, axis: int, keepdim: bool, n: Dim | None = None, what: str | None = None) -> tuple[Expr, Expr]:
    """The lower median of the first ``n`` (default: all) along ``axis``: the ``(n + 1) //
    2``-th smallest; NaN at the first NaN where there is one. An empty dim is a run-time error
    naming median and ``what`` (default: the dim and its size), as torch raises."""
    from tilework.op import math as op_math

    if n is None:
        n = t.shape(x)[axis]
        t.require_at_least(n, 1, f"median: {what or f'dim {axis} ({sym.to_str(n)})'} must not be empty")
    val, idx = _kth_smallest(t, x, sym.max_(sym.floordiv(sym.add(n, 1), 2), 1), axis, keepdim)
    if not is_float_dtype(t.dtype(x)):
        return val, idx
    nan = t.emit(op.astype(t.emit(op_math.isnan(x)), "int8"))
    has_nan = t.emit(op.astype(t.emit(op.max(nan, (axis,), keepdim)), "bool"))
    first_nan = t.emit(op.argmax(nan, axis, keepdim))
    val = t.emit(op.where(has_nan, t.tensor(float("nan"), t.dtype(x)), val))
    return val, t.emit(op.where(has_nan, first_nan, idx))


@converter("median.dim")
def _median_dim(t: Translator, node: Any, x: Any, dim: int = -1, keepdim: bool = False) -> tuple[Expr, Expr]:
    if len(t.shape(x)) == 0:
        return _median_dim(t, node, t.emit(op.reshape(x, [1])), 0, False)
    return _median_along(t, x, norm_axis(dim, len(t.shape(x))), keepdim)


@converter("median.default")
def _median(t: Translator, node: Any, x: Any) -> Expr:
    """The lower median of all elements; NaN for an empty tensor (torch's). A largest value
    appended after the elements (``+inf``, or the dtype's largest integer: it comes after its
    equals, which keep the lower indices) leaves the ``(n + 1) // 2``-th smallest of ``n >= 1``
    unchanged and gives an empty tensor (of a symbolic size) an element to take, replaced by
    NaN."""
    out = t.out_dtype(node)
    numel = sym.product(t.shape(x))
    if isinstance(numel, int) and numel == 0:
        return t.emit(op.full((), float("nan"), out))
    flat = t.emit(op.reshape(x, [numel]))
    if isinstance(numel, int) or not is_float_dtype(t.dtype(x)):
        return t.emit(op.reshape(_median_along(t, flat, 0, False, what=f"the input ({sym.to_str(numel)} elements)")[0], ()))
    top = t.emit(op.full([1], float("inf"), t.dtype(x)))
    val = t.emit(op.reshape(_median_along(t, t.emit(op.concat([flat, top], axis=0)), 0, False, numel)[0], ()))
    empty = t.emit(op.equal(t.tensor(numel, "int64"), t.tensor(0, "int64")))
    return t.emit(op.where(empty, t.tensor(float("nan"), out), val))


@converter("linalg_vector_norm.default")
def _vector_norm(t: Translator, node: Any, x: Any, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Expr:
    """``sum(|x|^ord)^(1/ord)``; ord 2 as ``sqrt(sum(x*x))``, 1 as ``sum(|x|)``, +-inf as the
    largest / smallest ``|x|``, 0 as the count of nonzeros."""
    out = t.out_dtype(node)
    y = t.tensor(x, out)
    axes = _axes(t, y, dim)
    if ord == 2:
        return t.emit(op.sqrt(t.emit(op.sum(t.emit(op.multiply(y, y)), axes, keepdim))))
    if ord == 0:
        nonzero = t.emit(op.astype(t.emit(op.not_equal(y, t.tensor(0, out))), out))
        return t.emit(op.sum(nonzero, axes, keepdim))
    mag = t.emit(op.abs(y))
    if ord in (float("inf"), float("-inf")):
        return t.emit((op.max if ord > 0 else op.min)(mag, axes, keepdim))
    if ord == 1:
        return t.emit(op.sum(mag, axes, keepdim))
    total = t.emit(op.sum(t.emit(op.power(mag, t.tensor(float(ord), out))), axes, keepdim))
    return t.emit(op.power(total, t.tensor(1.0 / float(ord), out)))


__all__: list[str] = []
