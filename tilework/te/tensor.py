"""Tensors of the compute DSL: placeholders, compute stages, reduction axes and reducers.

A ``Tensor`` is a placeholder (an input) or the result of ``compute``: a function from output
indices to a scalar expression. Indexing a tensor gives a ``TensorLoad``; a reducer gives a
``Reduce`` over ``ReduceVar`` axes. Both are DSL-only expression nodes that ``create_func``
lowers to loop-level IR (``Load``, a ``Block`` with ``init``); everything else a compute body
holds is already loop-level IR (``tilework.ir.loop``), built with its operators and helpers.

Shapes are symbolic: one TensorFunc built from these serves every value of its dims.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Sequence, Union

from tilework.ir import sym
from tilework.ir.info import check_dtype
from tilework.ir.dtype import int_range as dtype_int_range, is_float_dtype, is_int_dtype
from tilework.ir.loop import Operand, PExpr, Scalar, convert, dtype_of
from tilework.ir.sym import Dim, SymExpr, SymVar

REDUCERS = ("sum", "prod", "max", "min", "argmax", "argmin")


def _bounded_var(name: str, extent: Dim) -> tuple[str, int, int | None]:
    """Arguments for a SymVar ranging over ``[0, extent)`` with the tightest known upper bound."""
    hi = sym.bounds(extent)[1]
    return name, 0, (hi - 1 if hi is not None and hi >= 1 else None)


class ReduceVar(SymVar):
    """A reduction axis: an index var ranging over ``[0, extent)``."""

    __slots__ = ("extent",)

    def __init__(self, name: str, extent: Dim) -> None:
        super().__init__(*_bounded_var(name, extent))
        self.extent = extent


Axes = Union[ReduceVar, Sequence[ReduceVar]]  # a reducer's ``axis``: one reduce axis or several


@dataclass(frozen=True, slots=True, eq=False)
class TensorLoad(PExpr):
    """``tensor[indices]`` inside a compute body (lowered to a ``Load`` of its buffer)."""

    tensor: "Tensor"
    indices: tuple[Scalar, ...]

    @property
    def dtype(self) -> str:
        return self.tensor.dtype


@dataclass(frozen=True, slots=True, eq=False)
class Reduce(PExpr):
    """``combiner`` of ``source`` over ``axes`` (where ``where`` holds). argmax/argmin give the
    int64 row-major flat index over ``axes`` of the first extreme value (NaN counts as the
    extreme, as NumPy does)."""

    combiner: str
    source: Scalar
    axes: tuple[ReduceVar, ...]
    where: Scalar | None
    dtype: str


@dataclass(frozen=True, slots=True, eq=False)
class Stage:
    """How a computed tensor's element at ``axes`` is computed: ``body``."""

    axes: tuple[SymVar, ...]
    body: Scalar


class Tensor:
    """A named, typed array of symbolic shape: a placeholder (``stage`` None) or computed."""

    __slots__ = ("name", "shape", "dtype", "stage")

    def __init__(self, name: str, shape: tuple[Dim, ...], dtype: str, stage: Stage | None) -> None:
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.stage = stage

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_placeholder(self) -> bool:
        return self.stage is None

    def __getitem__(self, index: object) -> TensorLoad:
        idx = index if isinstance(index, tuple) else (index,)
        if len(idx) != len(self.shape):
            raise IndexError(f"tensor {self.name} has rank {len(self.shape)}, indexed with {len(idx)} indices")
        out: list[Scalar] = []
        for k, x in enumerate(idx):
            if isinstance(x, bool) or not isinstance(x, (int, SymExpr, PExpr)):
                raise TypeError(f"index {k} of {self.name} must be an integer expression, got {x!r}")
            if isinstance(x, PExpr) and not is_int_dtype(x.dtype):
                raise TypeError(f"index {k} of {self.name} must be an integer expression, got dtype {x.dtype}")
            out.append(x)
        return TensorLoad(self, tuple(out))

    def __repr__(self) -> str:
        kind = "placeholder" if self.stage is None else "compute"
        return f"Tensor({self.name}, {kind}, shape=({', '.join(sym.to_str(d) for d in self.shape)}), {self.dtype})"


def _shape(shape: Union[Dim, Sequence[Dim]]) -> tuple[Dim, ...]:
    dims = (shape,) if isinstance(shape, (int, SymExpr)) else tuple(shape)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, SymExpr)):
            raise TypeError(f"a shape dim must be an int or a symbolic dim, got {d!r}")
    return dims


def placeholder(shape: Union[Dim, Sequence[Dim]], dtype: str = "float32", name: str = "A") -> Tensor:
    """An input tensor."""
    return Tensor(name, _shape(shape), check_dtype(dtype), None)


def _axis_names(fcompute: Callable[..., object], ndim: int) -> list[str]:
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) == ndim and all(n.isidentifier() for n in names):
        return names
    return [f"i{k}" for k in range(ndim)]


def compute(
    shape: Union[Dim, Sequence[Dim]],
    fcompute: Callable[..., object],
    name: str = "T",
    dtype: str | None = None,
) -> Tensor:
    """A tensor whose element at ``(i0, i1, ...)`` is ``fcompute(i0, i1, ...)``.

    ``fcompute`` receives one SymVar per output dim (ranging over that dim) and returns a
    scalar expression: loads of other tensors, arithmetic, intrinsics, a reducer, a Python
    number, or an index expression (an int64 value). ``dtype`` casts the result.
    """
    dims = _shape(shape)
    axes = tuple(SymVar(*_bounded_var(n, d)) for n, d in zip(_axis_names(fcompute, len(dims)), dims))
    body = fcompute(*axes)
    if dtype is not None:
        body = convert(body, check_dtype(dtype))
    elif isinstance(body, (bool, float)):
        body = convert(body, "bool" if isinstance(body, bool) else "float32")
    elif not isinstance(body, (int, SymExpr, PExpr)):
        raise TypeError(f"compute {name}: fcompute must return a scalar expression, got {type(body).__name__}")
    assert isinstance(body, (int, SymExpr, PExpr))
    return Tensor(name, dims, dtype_of(body), Stage(axes, body))


def reduce_axis(extent: Dim, name: str = "k") -> ReduceVar:
    """A reduction axis over ``[0, extent)``, for use in a reducer's ``axis``."""
    if isinstance(extent, bool) or not isinstance(extent, (int, SymExpr)):
        raise TypeError(f"reduce_axis extent must be an int or a symbolic dim, got {extent!r}")
    return ReduceVar(name, extent)


def _axes(axis: Axes, reducer: str) -> tuple[ReduceVar, ...]:
    given: Sequence[object] = axis if isinstance(axis, (list, tuple)) else (axis,)
    if not given:
        raise ValueError(f"{reducer} needs at least one reduce axis")
    axes: list[ReduceVar] = []
    for a in given:
        if not isinstance(a, ReduceVar):
            hint = f"; for two values use te.{reducer}imum" if reducer in ("max", "min") else ""
            raise TypeError(f"{reducer}: axis must be a te.reduce_axis, got {a!r}{hint}")
        axes.append(a)
    if len(set(map(id, axes))) != len(axes):
        raise ValueError(f"{reducer}: a reduce axis is given twice")
    return tuple(axes)


def _reduce(combiner: str, expr: Operand, axis: Axes, where: Operand | None) -> Reduce:
    axes = _axes(axis, combiner)
    src = convert(expr, "float32") if isinstance(expr, float) else expr
    if not isinstance(src, (int, SymExpr, PExpr)):
        raise TypeError(f"{combiner}: not a scalar expression: {expr!r}")
    dt = dtype_of(src)
    if dt == "bool" and combiner in ("sum", "prod"):
        raise TypeError(f"{combiner} of bool values: cast them to an integer dtype first")
    cond = None if where is None else convert(where, "bool")
    out = "int64" if combiner in ("argmax", "argmin") else dt
    return Reduce(combiner, src, axes, cond, out)


def sum(expr: Operand, axis: Axes, where: Operand | None = None) -> Reduce:  # noqa: A001
    """The sum of ``expr`` over the reduce axes ``axis`` (one or a sequence)."""
    return _reduce("sum", expr, axis, where)


def prod(expr: Operand, axis: Axes, where: Operand | None = None) -> Reduce:
    """The product of ``expr`` over ``axis``."""
    return _reduce("prod", expr, axis, where)


def max(expr: Operand, axis: Axes, where: Operand | None = None) -> Reduce:  # noqa: A001
    """The maximum of ``expr`` over ``axis`` (NaN propagates); ``te.maximum`` for two values."""
    return _reduce("max", expr, axis, where)


def min(expr: Operand, axis: Axes, where: Operand | None = None) -> Reduce:  # noqa: A001
    """The minimum of ``expr`` over ``axis`` (NaN propagates); ``te.minimum`` for two values."""
    return _reduce("min", expr, axis, where)


def argmax(expr: Operand, axis: Axes, where: Operand | None = None) -> Reduce:
    """The int64 row-major flat index over ``axis`` of the first maximum of ``expr``."""
    return _reduce("argmax", expr, axis, where)


def argmin(expr: Operand, axis: Axes, where: Operand | None = None) -> Reduce:
    """The int64 row-major flat index over ``axis`` of the first minimum of ``expr``."""
    return _reduce("argmin", expr, axis, where)


def identity_value(combiner: str, dtype: str) -> Union[int, float, bool]:
    """The value a reduction starts from (the worst value for max/min and argmax/argmin)."""
    if combiner == "sum":
        return 0
    if combiner == "prod":
        return 1
    highest = combiner in ("min", "argmin")
    if dtype == "bool":
        return highest
    if is_float_dtype(dtype):
        return float("inf") if highest else float("-inf")
    return int_range(dtype)[1 if highest else 0]


def int_range(dtype: str) -> tuple[int, int]:
    if not is_int_dtype(dtype):
        raise ValueError(f"not an integer dtype: {dtype}")
    return dtype_int_range(dtype)
