"""What the importer knows about an ONNX value while it converts a graph.

A ``Value`` is a tensor that may be known at three levels at once:

- ``expr``: the graph expression that computes it at run time (a ``Var`` or a ``Constant``);
- ``const``: its contents as a NumPy array, when they are known at conversion time;
- ``elems``: the contents of a small rank-0 or rank-1 integer or bool tensor as *symbolic
  scalars* (``int``, ``SymExpr`` or ``bool``), when they are known as expressions of the
  graph's sym vars. ``Shape(x)`` of ``x: (b, s, 768)`` is ``elems == (b, s, 768)``.

Exporters compute shapes in the graph (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``).
Tracking ``elems`` through those ops folds the whole chain into symbolic dims, so ``Reshape``
gets a symbolic target shape instead of a run-time tensor. A value is materialized as a graph
expression only when a tensor op consumes it.

ONNX sequences and optionals exist only at conversion time: a ``SeqValue`` is a list of
``Value``s whose number and order are known while converting (a tuple where it crosses a
function or ``If`` boundary), an ``OptValue`` holds its element or nothing, known likewise.
Ops whose effect on them depends on run-time data are refused by their converters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, Union

import numpy as np
from onnx import TensorProto

from tilework.ir import sym
from tilework.ir.dtype import INT_DTYPES, from_onnx
from tilework.ir.graph import Expr
from tilework.ir.info import TensorInfo
from tilework.ir.sym import Dim, SymExpr

Elem = Union[int, SymExpr, bool]


# elems are tracked for small tensors only: shape arithmetic, not data
MAX_ELEMS = 64


def dtype_name(elem_type: int) -> str | None:
    """The tilework dtype of an ONNX element type, or None when tilework has no such dtype."""
    return from_onnx(elem_type)


def elem_type_name(elem_type: int) -> str:
    """The ONNX name of an element type (for messages)."""
    try:
        return str(TensorProto.DataType.Name(elem_type))
    except ValueError:
        return f"type {elem_type}"


@dataclass
class Value:
    """An ONNX tensor during conversion; see the module docstring. ``info`` is always set."""

    info: TensorInfo
    expr: Expr | None = None
    const: np.ndarray | None = None
    elems: tuple[Elem, ...] | None = None

    @property
    def dtype(self) -> str | None:
        return self.info.dtype

    @property
    def ndim(self) -> int:
        return self.info.ndim

    @property
    def shape(self) -> tuple[Dim, ...] | None:
        return self.info.shape

    @staticmethod
    def of_const(arr: np.ndarray) -> "Value":
        arr = np.asarray(arr)
        info = TensorInfo(tuple(int(d) for d in arr.shape), str(arr.dtype))
        elems = None
        if arr.ndim <= 1 and arr.size <= MAX_ELEMS and (arr.dtype == np.bool_ or str(arr.dtype) in INT_DTYPES):
            elems = tuple(bool(v) if arr.dtype == np.bool_ else int(v) for v in arr.reshape(-1))
        return Value(info, None, arr, elems)

    @staticmethod
    def of_elems(elems: Sequence[Elem], dtype: str, scalar: bool = False) -> "Value":
        """A rank-1 (or rank-0 when ``scalar``) tensor with symbolic contents ``elems``."""
        items = tuple(elems)
        if scalar and len(items) != 1:
            raise ValueError("a scalar holds exactly one element")
        shape: tuple[int, ...] = () if scalar else (len(items),)
        const = None
        if all(not isinstance(e, SymExpr) for e in items):
            const = np.asarray(items, dtype=np.bool_ if dtype == "bool" else dtype).reshape(shape)
        return Value(TensorInfo(shape, dtype), None, const, items)

    @staticmethod
    def of_expr(expr: Expr) -> "Value":
        info = expr.info
        if not isinstance(info, TensorInfo):
            info = TensorInfo(None, None, -1)
        return Value(info, expr)


@dataclass
class SeqValue:
    """An ONNX sequence during conversion: its tensors, in order. ``dtype`` is the element type
    (the only thing an empty sequence knows about its elements)."""

    items: tuple[Value, ...]
    dtype: str | None = None


@dataclass
class OptValue:
    """An ONNX optional during conversion: its element, or None when it is empty."""

    elem: "Value | SeqValue | None"


AnyValue = Union[Value, SeqValue, OptValue]


def kind_of(v: AnyValue) -> str:
    """What ``v`` is, for messages: 'a tensor', 'a sequence of 3 tensors', 'an empty optional'."""
    if isinstance(v, Value):
        return "a tensor"
    if isinstance(v, SeqValue):
        return f"a sequence of {len(v.items)} tensor(s)"
    return "an empty optional" if v.elem is None else f"an optional holding {kind_of(v.elem)}"


def layout_of(v: AnyValue) -> object:
    """What must agree between two values for one graph expression to carry either: a tensor,
    a sequence of so many tensors, an optional with or without its element."""
    if isinstance(v, Value):
        return "tensor"
    if isinstance(v, SeqValue):
        return ("sequence", len(v.items))
    return ("optional", None if v.elem is None else layout_of(v.elem))


def static_ints(dims: Sequence[Dim]) -> tuple[int, ...] | None:
    """``dims`` as ints when every one is static, else None."""
    out = tuple(d for d in dims if isinstance(d, int))
    return out if len(out) == len(dims) else None


def is_scalar_like(v: Value) -> bool:
    return v.info.shape is not None and len(v.info.shape) <= 1


# -- symbolic arithmetic on elems -------------------------------------------------------------


def _known_sign(d: Dim) -> bool:
    return isinstance(d, int) or sym.prove_ge(d, 0)


def _div(a: Dim, b: Dim) -> Dim | None:
    """ONNX integer Div (truncating), known only where truncation equals flooring."""
    if isinstance(b, int) and b == 0:
        return None
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    if _known_sign(a) and (isinstance(b, int) and b > 0 or sym.prove_ge(b, 1)):
        return sym.floordiv(a, b)
    return None


def _mod(a: Dim, b: Dim) -> Dim | None:
    """ONNX integer Mod (fmod=0: the sign of the divisor, as Python's ``%``)."""
    if isinstance(b, int) and b == 0:
        return None
    if isinstance(b, int) and b > 0 or sym.prove_ge(b, 1):
        return sym.floormod(a, b)
    return None


def _compare(kind: str, a: Dim, b: Dim) -> bool | None:
    if kind == "eq":
        return True if sym.prove_eq(a, b) else False if sym.prove_ne(a, b) else None
    if kind == "lt":
        return True if sym.prove_le(sym.add(a, 1), b) else False if sym.prove_ge(a, b) else None
    if kind == "le":
        return True if sym.prove_le(a, b) else False if sym.prove_ge(a, sym.add(b, 1)) else None
    if kind == "gt":
        return _compare("lt", b, a)
    if kind == "ge":
        return _compare("le", b, a)
    raise ValueError(kind)


def _dim(e: Elem) -> Dim | None:
    return None if isinstance(e, bool) else e


_ARITH: dict[str, Callable[[Dim, Dim], Dim | None]] = {
    "add": sym.add,
    "sub": sym.sub,
    "mul": sym.mul,
    "div": _div,
    "mod": _mod,
    "min": sym.min_,
    "max": sym.max_,
}


def binary_elems(kind: str, a: Sequence[Elem], b: Sequence[Elem]) -> tuple[Elem, ...] | None:
    """``a OP b`` element by element with broadcasting of a single element; None when some
    element is not known symbolically (the caller falls back to a tensor op)."""
    if len(a) != len(b) and 1 not in (len(a), len(b)):
        return None
    n = max(len(a), len(b))
    out: list[Elem] = []
    for i in range(n):
        x = a[0] if len(a) == 1 else a[i]
        y = b[0] if len(b) == 1 else b[i]
        if kind in ("and", "or", "xor"):
            if not isinstance(x, bool) or not isinstance(y, bool):
                return None
            out.append(x and y if kind == "and" else x or y if kind == "or" else x != y)
            continue
        dx, dy = _dim(x), _dim(y)
        if dx is None or dy is None:
            return None
        r: Elem | None = _compare(kind, dx, dy) if kind in ("eq", "lt", "le", "gt", "ge") else _ARITH[kind](dx, dy)
        if r is None:
            return None
        out.append(r)
    return tuple(out)


def where_elems(c: Sequence[Elem], a: Sequence[Elem], b: Sequence[Elem]) -> tuple[Elem, ...] | None:
    n = max(len(c), len(a), len(b))
    if any(len(s) not in (1, n) for s in (c, a, b)):
        return None
    out: list[Elem] = []
    for i in range(n):
        ci = c[0] if len(c) == 1 else c[i]
        if not isinstance(ci, bool):
            return None
        src = a if ci else b
        out.append(src[0] if len(src) == 1 else src[i])
    return tuple(out)


__all__ = [
    "Elem",
    "MAX_ELEMS",
    "Value",
    "SeqValue",
    "OptValue",
    "AnyValue",
    "kind_of",
    "layout_of",
    "dtype_name",
    "elem_type_name",
    "is_scalar_like",
    "static_ints",
    "binary_elems",
    "where_elems",
]
