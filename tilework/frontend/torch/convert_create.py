"""Converters of ATen ops that create tensors: ``full``/``zeros``/``ones``/``empty`` and their
``new_*`` and ``*_like`` forms, ``arange``. Shapes and dtypes come from torch's metadata
(sizes may be symbolic); ``empty`` gives zeros. A fill value that is a symbolic size becomes a
tensor holding its run-time value."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tilework import op
from tilework.errors import UnsupportedError
from tilework.frontend.torch.registry import converter
from tilework.ir import sym
from tilework.ir.graph import Expr

if TYPE_CHECKING:
    from tilework.frontend.torch.translator import Translator


def _filled(t: Translator, node: Any, value: Any) -> Expr:
    shape, dtype = t.out_shape(node), t.out_dtype(node)
    if isinstance(value, sym.SymExpr):
        return t.emit(op.broadcast_to(t.tensor(value, dtype), shape))
    if isinstance(value, Expr):
        raise UnsupportedError("a fill value computed by the model (a tensor) is not supported")
    return t.ones(shape, dtype, value)


@converter("full.default", "new_full.default")
def _full(t: Translator, node: Any, *args: Any, **kwargs: Any) -> Expr:
    value = kwargs.get("fill_value", args[-1] if args else None)
    return _filled(t, node, value)


@converter("full_like.default")
def _full_like(t: Translator, node: Any, x: Any, fill_value: Any, **kwargs: Any) -> Expr:
    return _filled(t, node, fill_value)


@converter("zeros.default", "new_zeros.default", "zeros_like.default", "empty.memory_format", "new_empty.default", "empty_like.default", "empty_strided.default", "new_empty_strided.default")
def _zeros(t: Translator, node: Any, *args: Any, **kwargs: Any) -> Expr:
    return _filled(t, node, False if t.out_dtype(node) == "bool" else 0)


@converter("zero.default")
def _zero(t: Translator, node: Any, x: Any) -> Expr:
    return _filled(t, node, False if t.out_dtype(node) == "bool" else 0)


@converter("fill.Scalar")
def _fill(t: Translator, node: Any, x: Any, value: Any) -> Expr:
    return _filled(t, node, value)


@converter("fill.Tensor")
def _fill_tensor(t: Translator, node: Any, x: Any, value: Any) -> Expr:
    """``x``'s shape filled with a 0-d tensor's value (cast to ``x``'s dtype)."""
    if isinstance(value, Expr) and len(t.shape(value)) != 0:
        raise UnsupportedError(f"fill.Tensor: the value must be a 0-d tensor, got shape {t.shape(value)}")
    return t.emit(op.broadcast_to(t.tensor(value, t.out_dtype(node)), t.out_shape(node)))


@converter("ones.default", "new_ones.default", "ones_like.default")
def _ones(t: Translator, node: Any, *args: Any, **kwargs: Any) -> Expr:
    return _filled(t, node, True if t.out_dtype(node) == "bool" else 1)


@converter("arange.default", "arange.start", "arange.start_step")
def _arange(t: Translator, node: Any, *args: Any, **kwargs: Any) -> Expr:
    nums: list[Any] = [a for a in args if isinstance(a, (int, float, sym.SymExpr)) and not isinstance(a, bool)]
    for key in ("start", "end", "step"):
        if key in kwargs:
            nums.append(kwargs[key])
    start: Any
    end: Any
    step: Any
    if len(nums) == 1:
        start, end, step = 0, nums[0], 1
    elif len(nums) == 2:
        (start, end), step = nums, 1
    elif len(nums) == 3:
        start, end, step = nums
    else:
        raise UnsupportedError(f"arange with arguments {args} {kwargs}")
    if isinstance(step, sym.SymExpr):
        raise UnsupportedError("arange with a symbolic step")
    dtype = t.out_dtype(node)
    if dtype.startswith(("float", "bfloat")) and all(isinstance(v, int) for v in (start, end, step)):
        start, end, step = float(start), float(end), float(step)
    return t.emit(op.arange(start, end, step, dtype=dtype))


__all__: list[str] = []
