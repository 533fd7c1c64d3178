"""Tensor creation: ``full``, ``zeros``, ``ones`` (from a shape value), their ``*_like``
forms (from another tensor's shape), ``eye_like`` (ones on a diagonal of a matrix shaped like
another) and ``arange``.

A shape is a graph value (a ``ShapeExpr`` such as ``shape(n, 4)``, or any shape-typed var), so a
shape computed at run time works the same way as a literal one. ``arange`` takes its bounds as
attributes that may be symbolic: ``arange(0, n)`` has ``n`` elements; in general the length is
``max(0, ceil((end - start) / step))``.

Legalized kernels read no tensor: they write an output of the call's result shape.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo
from tilework.ir.dtype import is_float_dtype
from tilework.ir.loop import Scalar
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.op.base import (
    InferCtx,
    Op,
    OpPattern,
    dtype_attr,
    make_call,
    register,
    require_nonneg,
    shape_arg,
    tensor_arg,
    to_shape_expr,
)
from tilework.op.kernel import op_name, out_tensor

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

_SHAPED = ("full", "zeros", "ones")
_LIKE = ("full_like", "zeros_like", "ones_like")


def _check_fill(call: Call, ctx: InferCtx) -> None:
    if "fill_value" not in call.attrs:
        return
    v = call.attrs["fill_value"]
    if not isinstance(v, (bool, int, float)):
        raise ctx.error(f"attribute fill_value must be a number or a bool, got {v!r}")


def _infer_shaped(call: Call, ctx: InferCtx) -> StructInfo:
    s = shape_arg(call, 0, ctx)
    _check_fill(call, ctx)
    dtype = dtype_attr(call, "dtype", ctx)
    if dtype is None:
        raise ctx.error("attribute dtype is required")
    if s.values is None:
        return TensorInfo(None, dtype, s.ndim)
    require_nonneg(s.values, ctx, "shape")
    return TensorInfo(s.values, dtype)


def _infer_like(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    _check_fill(call, ctx)
    dtype = dtype_attr(call, "dtype", ctx)
    return TensorInfo(x.shape, x.dtype if dtype is None else dtype, x.ndim)


def _number(v: object) -> bool:
    return isinstance(v, (int, float, SymExpr)) and not isinstance(v, bool)


def arange_length(start: Dim | float, end: Dim | float, step: int | float, ctx: InferCtx) -> Dim:
    """``max(0, ceil((end - start) / step))``, exact for ints and symbolic bounds."""
    if isinstance(step, float) or isinstance(start, float) or isinstance(end, float):
        if isinstance(start, SymExpr) or isinstance(end, SymExpr):
            raise ctx.error("symbolic bounds need an integer start and step")
        n = math.ceil((float(end) - float(start)) / float(step))
        return n if n > 0 else 0
    span = sym.sub(end, start) if step > 0 else sym.sub(start, end)
    return sym.max_(0, sym.ceildiv(span, step if step > 0 else -step))


def _infer_arange(call: Call, ctx: InferCtx) -> StructInfo:
    start, end, step = call.attrs["start"], call.attrs["end"], call.attrs["step"]
    for name, v in (("start", start), ("end", end)):
        if not _number(v):
            raise ctx.error(f"attribute {name} must be a number or a symbolic dim, got {v!r}")
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        raise ctx.error(f"attribute step must be a static number, got {step!r}")
    if step == 0:
        raise ctx.error("step must not be zero")
    dtype = dtype_attr(call, "dtype", ctx)
    if dtype is None:
        raise ctx.error("attribute dtype is required")
    return TensorInfo((arange_length(start, end, step, ctx),), dtype)


def _infer_eye_like(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if x.ndim not in (-1, 2):
        raise ctx.shape_error(f"expects a 2-D tensor, got rank {x.ndim}")
    dtype = dtype_attr(call, "dtype", ctx)
    return TensorInfo(x.shape, x.dtype if dtype is None else dtype, 2)


# -- legalization ---------------------------------------------------------------------------


def _fill_value(call: Call, dtype: str) -> float | int | bool:
    """The fill value in ``dtype``'s Python kind (a float for an integer dtype truncates)."""
    name = op_name(call)
    if name.startswith("zeros"):
        return 0
    if name.startswith("ones"):
        return 1
    v = call.attrs["fill_value"]
    if isinstance(v, float) and dtype != "bool" and not is_float_dtype(dtype):
        return int(v)
    return v


def _legalize_fill(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = op_name(call)
    shape, dtype = out_tensor(call)
    value = te.constant(_fill_value(call, dtype), dtype)
    out = te.compute(shape, lambda *i: value, name)
    return ctx.call_te(name, [], [], [out], call.info)


def _legalize_arange(call: Call, ctx: "LegalizeCtx") -> Expr:
    """``start + i * step``: exact integer index arithmetic for integer bounds, float64 (then
    rounded to the dtype, as NumPy does) when a bound or the step is a float."""
    shape, dtype = out_tensor(call)
    start, step = call.attrs["start"], call.attrs["step"]
    exact = not isinstance(start, float) and not isinstance(step, float)

    def f(i: SymVar) -> Scalar:
        if exact:
            return te.cast(sym.add(start, sym.mul(i, step)), dtype)
        return te.cast(te.cast(start, "float64") + te.cast(i, "float64") * float(step), dtype)

    out = te.compute(shape, f, "arange")
    return ctx.call_te("arange", [], [], [out], call.info)


def _legalize_eye_like(call: Call, ctx: "LegalizeCtx") -> Expr:
    shape, dtype = out_tensor(call)
    k = int(call.attrs["k"])
    out = te.compute(shape, lambda i, j: te.if_then_else(te.eq(j - i, k), 1, 0), "eye_like", dtype)
    return ctx.call_te("eye_like", [], [], [out], call.info)


_FILL: dict[str, object] = {"fill_value": 0.0}
for _name in _SHAPED:
    register(Op(_name, _infer_shaped, OpPattern.INJECTIVE, attrs={**(_FILL if _name == "full" else {}), "dtype": "float32"}, num_args=1, legalize=_legalize_fill))
for _name in _LIKE:
    register(Op(_name, _infer_like, OpPattern.ELEMWISE, attrs={**(_FILL if _name == "full_like" else {}), "dtype": None}, num_args=1, legalize=_legalize_fill))
register(Op("arange", _infer_arange, OpPattern.INJECTIVE, attrs={"start": 0, "end": 0, "step": 1, "dtype": "int64"}, num_args=0, legalize=_legalize_arange))
register(Op("eye_like", _infer_eye_like, OpPattern.INJECTIVE, attrs={"k": 0, "dtype": None}, num_args=1, legalize=_legalize_eye_like))


def full(shape: Expr | Sequence[Dim], fill_value: float, dtype: str = "float32") -> Call:
    """A tensor of ``shape`` filled with ``fill_value``."""
    return make_call("full", [to_shape_expr(shape, "full")], fill_value=fill_value, dtype=dtype)


def zeros(shape: Expr | Sequence[Dim], dtype: str = "float32") -> Call:
    return make_call("zeros", [to_shape_expr(shape, "zeros")], dtype=dtype)


def ones(shape: Expr | Sequence[Dim], dtype: str = "float32") -> Call:
    return make_call("ones", [to_shape_expr(shape, "ones")], dtype=dtype)


def full_like(x: Expr, fill_value: float, dtype: str | None = None) -> Call:
    """A tensor shaped like ``x`` filled with ``fill_value``; ``dtype`` None keeps ``x``'s."""
    return make_call("full_like", [x], fill_value=fill_value, dtype=dtype)


def zeros_like(x: Expr, dtype: str | None = None) -> Call:
    return make_call("zeros_like", [x], dtype=dtype)


def ones_like(x: Expr, dtype: str | None = None) -> Call:
    return make_call("ones_like", [x], dtype=dtype)


def eye_like(x: Expr, k: int = 0, dtype: str | None = None) -> Call:
    """Ones on diagonal ``k`` of a matrix shaped like ``x``, zeros elsewhere."""
    return make_call("eye_like", [x], k=k, dtype=dtype)


def arange(
    start: Dim | float,
    end: Dim | float | None = None,
    step: int | float = 1,
    dtype: str | None = None,
) -> Call:
    """``[start, start + step, ...)`` below ``end``, like Python's ``range``; ``arange(n)`` is
    ``arange(0, n)``. ``dtype`` None: float32 when a bound is a float, else int64."""
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = "float32" if any(isinstance(v, float) for v in (start, end, step)) else "int64"
    return make_call("arange", [], start=start, end=end, step=step, dtype=dtype)
