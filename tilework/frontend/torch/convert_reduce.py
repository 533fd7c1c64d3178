"""Converters of ATen reductions: ``sum``, ``mean``, ``prod``, ``amax``/``amin``,
``max``/``min`` (whole tensor, or along a dim with their indices), ``argmax``/``argmin``,
``any``/``all``, ``var``/``std``, ``var_mean``, ``linalg_vector_norm`` (``F.normalize``, ``x.norm``), ``logsumexp``. An empty dim list reduces every dim (torch's rule); a sum of
an integer tensor is an int64 sum."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from tilework import op
from tilework.frontend.torch.common import as_list, norm_axis
from tilework.frontend.torch.registry import converter
from tilework.ir import sym
from tilework.ir.graph import Expr

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
    """``log(sum(exp(x - m))) + m`` with ``m`` the largest ``x``, or 0 where that is infinite
    (all ``-inf`` gives ``-inf``, a ``+inf`` gives ``+inf``, as torch's)."""
    from tilework.op import math as op_math

    out = t.out_dtype(node)
    y = t.tensor(x, out)
    axes = _axes(t, y, dim)
    top = t.emit(op.max(y, axes, True))
    shift = t.emit(op.where(t.emit(op_math.isinf(top)), t.tensor(0.0, out), top))
    total = t.emit(op.sum(t.emit(op.exp(t.emit(op.subtract(y, shift)))), axes, keepdim))
    if not keepdim:
        shift = t.emit(op.squeeze(shift, axes if axes is not None else tuple(range(len(t.shape(y))))))
    return t.emit(op.add(t.emit(op.log(total)), shift))


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
