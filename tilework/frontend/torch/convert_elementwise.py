"""Converters of elementwise ATen ops: math and activations, arithmetic with tensors or Python
scalars (torch's type promotion: operands are cast to the dtype torch computes in), comparisons,
logical ops, ``where``/``masked_fill``, clamps, dtype casts and the ops that are identities at
inference (``clone``, ``alias``, ``dropout`` in eval mode, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tilework import op
from tilework.op import bitwise as op_bitwise
from tilework.op import math as op_math
from tilework.errors import UnsupportedError
from tilework.frontend.torch.registry import converter
from tilework.ir.graph import Constant, Expr

if TYPE_CHECKING:
    from tilework.frontend.torch.translator import Translator

_UNARY: dict[str, Callable[[Expr], Expr]] = {
    "abs": op.abs, "neg": op.neg, "exp": op.exp, "log": op.log, "sqrt": op.sqrt, "rsqrt": op.rsqrt,
    "tanh": op.tanh, "sigmoid": op.sigmoid, "relu": op.relu, "silu": op.silu, "sin": op.sin,
    "cos": op.cos, "floor": op.floor, "ceil": op.ceil, "erf": op.erf, "logical_not": op.logical_not,
}  # fmt: skip


def _unary(name: str) -> Callable[..., Expr]:
    def convert(t: Translator, node: Any, x: Any, *rest: Any, **kw: Any) -> Expr:
        # math on an integer tensor computes in torch's result dtype (float)
        return t.emit(_UNARY[name](t.tensor(x, t.out_dtype(node))))

    return convert


for _name in _UNARY:
    converter(f"{_name}.default", _name)(_unary(_name))
converter("bitwise_not.default")(lambda t, node, x: t.emit(op_bitwise.bitwise_not(x)))


@converter("round.default")
def _round(t: Translator, node: Any, x: Any, decimals: int = 0) -> Expr:
    if decimals:
        raise UnsupportedError("round with decimals is not supported")
    return t.emit(op.round(x))


@converter("gelu.default")
def _gelu(t: Translator, node: Any, x: Any, approximate: str = "none") -> Expr:
    return t.emit(op.gelu_tanh(x) if approximate == "tanh" else op.gelu(x))


# -- arithmetic ---------------------------------------------------------------------------------


def _operands(t: Translator, dtype: str, *values: Any) -> list[Expr]:
    return [t.tensor(v, dtype) for v in values]


def _scaled(t: Translator, x: Expr, alpha: Any) -> Expr:
    if alpha == 1:
        return x
    return t.emit(op.multiply(x, t.tensor(alpha, t.dtype(x))))


@converter("add.Tensor", "add.Scalar", "add")
def _add(t: Translator, node: Any, a: Any, b: Any, alpha: Any = 1) -> Expr:
    x, y = _operands(t, t.out_dtype(node), a, b)
    return t.emit(op.add(x, _scaled(t, y, alpha)))


@converter("sub.Tensor", "sub.Scalar", "sub")
def _sub(t: Translator, node: Any, a: Any, b: Any, alpha: Any = 1) -> Expr:
    x, y = _operands(t, t.out_dtype(node), a, b)
    return t.emit(op.subtract(x, _scaled(t, y, alpha)))


@converter("rsub.Tensor", "rsub.Scalar")
def _rsub(t: Translator, node: Any, a: Any, b: Any, alpha: Any = 1) -> Expr:
    x, y = _operands(t, t.out_dtype(node), a, b)
    return t.emit(op.subtract(y, _scaled(t, x, alpha)))


@converter("mul.Tensor", "mul.Scalar", "mul")
def _mul(t: Translator, node: Any, a: Any, b: Any) -> Expr:
    if t.out_dtype(node) == "bool":
        return t.emit(op.logical_and(*_operands(t, "bool", a, b)))
    return t.emit(op.multiply(*_operands(t, t.out_dtype(node), a, b)))


def _divisor(t: Translator, y: Expr) -> Expr:
    """An integer divisor, checked at run time: torch raises ZeroDivisionError for an integer
    division by zero (docs/semantics.md). A constant divisor without zeros needs no check."""
    if t.dtype(y).startswith(("float", "bfloat")) or (isinstance(y, Constant) and np.all(y.data != 0)):
        return y
    return t.emit(op.check_nonzero(y))


@converter("div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode", "true_divide.Tensor")
def _div(t: Translator, node: Any, a: Any, b: Any, rounding_mode: str | None = None) -> Expr:
    dtype = t.out_dtype(node)
    x, y = _operands(t, dtype, a, b)
    y = _divisor(t, y)
    if rounding_mode == "floor":
        return t.emit(op.floor_divide(x, y))
    q = t.emit(op.divide(x, y))  # integer divide truncates: torch's "trunc"
    if rounding_mode == "trunc" and dtype.startswith(("float", "bfloat")):
        negative = t.emit(op.less(q, t.tensor(0.0, dtype)))
        return t.emit(op.where(negative, t.emit(op.ceil(q)), t.emit(op.floor(q))))
    return q


@converter("floor_divide.default", "floor_divide.Scalar", "floordiv")
def _floor_divide(t: Translator, node: Any, a: Any, b: Any) -> Expr:
    x, y = _operands(t, t.out_dtype(node), a, b)
    return t.emit(op.floor_divide(x, _divisor(t, y)))


@converter("remainder.Tensor", "remainder.Scalar")
def _remainder(t: Translator, node: Any, a: Any, b: Any) -> Expr:
    """Python's modulo (the sign of the divisor): ``a - floor(a / b) * b``."""
    dtype = t.out_dtype(node)
    x, y = _operands(t, dtype, a, b)
    if not dtype.startswith(("float", "bfloat")):
        return t.emit(op.mod(x, _divisor(t, y)))
    q = t.emit(op.floor(t.emit(op.divide(x, y))))
    return t.emit(op.subtract(x, t.emit(op.multiply(q, y))))


@converter("pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar")
def _pow(t: Translator, node: Any, a: Any, b: Any) -> Expr:
    dtype = t.out_dtype(node)
    x = t.tensor(a, dtype)
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        if b == 1:
            return x
        if b == 2:
            return t.emit(op.multiply(x, x))
        if b == 0.5:
            return t.emit(op.sqrt(x))
        if b == -0.5:
            return t.emit(op.rsqrt(x))
        if b == -1:
            return t.emit(op.divide(t.tensor(1, dtype), x))
    return t.emit(op.power(x, t.tensor(b, dtype)))


@converter("reciprocal.default")
def _reciprocal(t: Translator, node: Any, x: Any) -> Expr:
    dtype = t.out_dtype(node)
    return t.emit(op.divide(t.tensor(1.0, dtype), t.tensor(x, dtype)))


@converter("square.default")
def _square(t: Translator, node: Any, x: Any) -> Expr:
    y = t.tensor(x, t.out_dtype(node))
    return t.emit(op.multiply(y, y))


_BINARY: dict[str, Callable[[Expr, Expr], Expr]] = {"maximum": op.maximum, "minimum": op.minimum}
for _name, _fn in _BINARY.items():
    converter(f"{_name}.default")(lambda t, node, a, b, _fn=_fn: t.emit(_fn(*_operands(t, t.out_dtype(node), a, b))))

# -- comparisons and logic -----------------------------------------------------------------------

_COMPARE: dict[str, Callable[[Expr, Expr], Expr]] = {
    "eq": op.equal, "ne": op.not_equal, "lt": op.less, "le": op.less_equal, "gt": op.greater,
    "ge": op.greater_equal,
}  # fmt: skip


def _compare(fn: Callable[[Expr, Expr], Expr]) -> Callable[..., Expr]:
    def convert(t: Translator, node: Any, a: Any, b: Any) -> Expr:
        return t.emit(fn(*_operands(t, t.promote(a, b), a, b)))

    return convert


for _name, _fn in _COMPARE.items():
    converter(f"{_name}.Tensor", f"{_name}.Scalar", _name)(_compare(_fn))

_LOGICAL: dict[str, Callable[[Expr, Expr], Expr]] = {"and": op.logical_and, "or": op.logical_or, "xor": op.logical_xor}


_BITWISE: dict[str, Callable[[Expr, Expr], Expr]] = {"and": op_bitwise.bitwise_and, "or": op_bitwise.bitwise_or, "xor": op_bitwise.bitwise_xor}


def _logical(fn: Callable[[Expr, Expr], Expr], name: str, bitwise: bool) -> Callable[..., Expr]:
    def convert(t: Translator, node: Any, a: Any, b: Any) -> Expr:
        dtype = t.out_dtype(node)
        if bitwise and dtype != "bool":  # integers: the bits, in torch's promoted dtype
            return t.emit(_BITWISE[name](*_operands(t, dtype, a, b)))
        return t.emit(fn(*_operands(t, "bool", a, b)))

    return convert


for _name, _fn in _LOGICAL.items():
    converter(f"logical_{_name}.default")(_logical(_fn, _name, False))
    converter(f"bitwise_{_name}.Tensor", f"bitwise_{_name}.Scalar", f"__{_name}__.Tensor", f"__{_name}__.Scalar")(_logical(_fn, _name, True))


def _shift(direction: str) -> Callable[..., Expr]:
    def convert(t: Translator, node: Any, a: Any, b: Any) -> Expr:
        x, y = _operands(t, t.out_dtype(node), a, b)
        return t.emit(op_math.bitshift(x, y, direction))

    return convert


for _dir, _name in (("left", "lshift"), ("right", "rshift")):
    converter(f"__{_name}__.Tensor", f"__{_name}__.Scalar", f"bitwise_{_dir}_shift.Tensor", f"bitwise_{_dir}_shift.Tensor_Scalar", f"bitwise_{_dir}_shift.Scalar_Tensor")(_shift(_dir))


def _math(name: str) -> Callable[..., Expr]:
    def convert(t: Translator, node: Any, x: Any) -> Expr:
        return t.emit(op_math.math(name, t.tensor(x, t.out_dtype(node))))

    return convert


for _name in ("log1p", "expm1", "log2", "exp2", "trunc", "sign"):
    converter(f"{_name}.default")(_math(_name))
converter("isnan.default")(lambda t, node, x: t.emit(op_math.isnan(x)))
converter("isinf.default")(lambda t, node, x: t.emit(op_math.isinf(x)))


@converter("fmod.Tensor", "fmod.Scalar")
def _fmod(t: Translator, node: Any, a: Any, b: Any) -> Expr:
    x, y = _operands(t, t.out_dtype(node), a, b)
    return t.emit(op_math.fmod(x, y))


@converter("atan2.default")
def _atan2(t: Translator, node: Any, a: Any, b: Any) -> Expr:
    y, x = _operands(t, t.out_dtype(node), a, b)  # integers compute in torch's float dtype
    return t.emit(op_math.atan2(y, x))


@converter("hypot.default")
def _hypot(t: Translator, node: Any, a: Any, b: Any) -> Expr:
    x, y = _operands(t, t.out_dtype(node), a, b)
    return t.emit(op_math.hypot(x, y))


@converter("elu.default")
def _elu(t: Translator, node: Any, x: Any, alpha: Any = 1.0, scale: Any = 1.0, input_scale: Any = 1.0) -> Expr:
    """``scale * (x if x > 0 else alpha * expm1(input_scale * x))`` (``selu`` and ``celu``
    decompose to it)."""
    dtype = t.out_dtype(node)
    y = t.tensor(x, dtype)
    neg = t.emit(op_math.math("elu", _scaled(t, y, input_scale), alpha=float(alpha)))
    if input_scale != 1:
        neg = t.emit(op.where(t.emit(op.greater(y, t.tensor(0.0, dtype))), y, neg))
    return _scaled(t, neg, scale)


@converter("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(t: Translator, node: Any, cond: Any, a: Any, b: Any) -> Expr:
    dtype = t.out_dtype(node)
    return t.emit(op.where(t.tensor(cond, "bool"), t.tensor(a, dtype), t.tensor(b, dtype)))


@converter("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(t: Translator, node: Any, x: Any, mask: Any, value: Any) -> Expr:
    dtype = t.out_dtype(node)
    return t.emit(op.where(t.tensor(mask, "bool"), t.tensor(value, dtype), t.tensor(x, dtype)))


def _bound(t: Translator, x: Expr, v: Any, fn: Callable[[Expr, Expr], Expr]) -> Expr:
    return x if v is None else t.emit(fn(x, t.tensor(v, t.dtype(x))))


@converter("clamp.default", "clamp.Tensor", "clip.default")
def _clamp(t: Translator, node: Any, x: Any, lo: Any = None, hi: Any = None) -> Expr:
    y = t.tensor(x, t.out_dtype(node))
    return _bound(t, _bound(t, y, lo, op.maximum), hi, op.minimum)


converter("clamp_min.default", "clamp_min.Tensor")(lambda t, node, x, lo: _clamp(t, node, x, lo, None))
converter("clamp_max.default", "clamp_max.Tensor")(lambda t, node, x, hi: _clamp(t, node, x, None, hi))


@converter("hardtanh.default")
def _hardtanh(t: Translator, node: Any, x: Any, lo: float = -1.0, hi: float = 1.0) -> Expr:
    return _clamp(t, node, x, lo, hi)


@converter("relu6.default")
def _relu6(t: Translator, node: Any, x: Any) -> Expr:
    return _clamp(t, node, x, 0.0, 6.0)


@converter("leaky_relu.default")
def _leaky_relu(t: Translator, node: Any, x: Any, slope: float = 0.01) -> Expr:
    dtype = t.dtype(x)
    neg = t.emit(op.multiply(x, t.tensor(slope, dtype)))
    return t.emit(op.where(t.emit(op.greater(x, t.tensor(0.0, dtype))), x, neg))


@converter("hardsigmoid.default")
def _hardsigmoid(t: Translator, node: Any, x: Any) -> Expr:
    dtype = t.dtype(x)
    shifted = t.emit(op.add(t.emit(op.divide(x, t.tensor(6.0, dtype))), t.tensor(0.5, dtype)))
    return _bound(t, _bound(t, shifted, 0.0, op.maximum), 1.0, op.minimum)


@converter("hardswish.default")
def _hardswish(t: Translator, node: Any, x: Any) -> Expr:
    return t.emit(op.multiply(x, _hardsigmoid(t, node, x)))


# -- casts and identities -------------------------------------------------------------------------


def _cast_to(t: Translator, node: Any, x: Any) -> Expr:
    return t.tensor(x, t.out_dtype(node))


@converter("_to_copy.default", "to.dtype", "to.dtype_layout", "to.device", "to.other", "type_as.default", "_to_dim_order_copy.default")
def _to(t: Translator, node: Any, x: Any, *args: Any, **kwargs: Any) -> Expr:
    device = kwargs.get("device")
    if device is not None and "cpu" not in str(device):
        raise UnsupportedError(f"moving a tensor to {device} inside the model is not supported")
    return _cast_to(t, node, x)


@converter("clone.default", "contiguous.default", "alias.default", "detach.default", "lift_fresh_copy.default", "alias_copy.default", "detach_copy.default", "view_as.default")
def _identity(t: Translator, node: Any, x: Any, *args: Any, **kwargs: Any) -> Expr:
    return t.tensor(x)


@converter("dropout.default", "feature_dropout.default", "alpha_dropout.default")
def _dropout(t: Translator, node: Any, x: Any, p: float = 0.5, train: bool = False) -> Expr:
    if train and p > 0:
        raise UnsupportedError("dropout in training mode; call model.eval() before exporting")
    return t.tensor(x)


@converter("native_dropout.default")
def _native_dropout(t: Translator, node: Any, x: Any, p: float, train: bool | None) -> tuple[Expr, Expr]:
    if train and p > 0:
        raise UnsupportedError("dropout in training mode; call model.eval() before exporting")
    return t.tensor(x), t.ones(t.shape(x), "bool", True)


@converter("scalar_tensor.default")
def _scalar_tensor(t: Translator, node: Any, value: Any, **kwargs: Any) -> Expr:
    return t.tensor(value, t.out_dtype(node))

