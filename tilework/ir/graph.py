"""The graph level: dataflow functions in A-normal form, typed by struct info.

Nodes are immutable. Identity is equality (``eq=False``): two ``Var`` objects with the same
name are different variables; structural comparison lives in ``tilework.ir.structural``.
Every expression carries ``info`` (its struct info), filled in by the ``BlockBuilder``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Union

import numpy as np

from tilework.ir.info import AnyInfo, FuncInfo, PrimInfo, ShapeInfo, StructInfo, TensorInfo
from tilework.ir.sym import Dim


class Attrs(Mapping[str, Any]):
    """An immutable, hashable mapping of attribute names to values (ints, floats, strings,
    bools, None, dims, dtypes, tuples of those)."""

    __slots__ = ("_items", "_dict")

    def __init__(self, items: Mapping[str, Any] | None = None, **kw: Any) -> None:
        d = dict(items or {})
        d.update(kw)
        self._dict = {k: _freeze(v) for k, v in sorted(d.items())}
        self._items = tuple(self._dict.items())

    def __getitem__(self, key: str) -> Any:
        return self._dict[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attrs) and self._items == other._items

    def __repr__(self) -> str:
        return f"Attrs({self._dict!r})"

    def with_(self, **kw: Any) -> "Attrs":
        return Attrs({**self._dict, **kw})


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, tuple):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return Attrs(v)
    return v


EMPTY_ATTRS = Attrs()


class Expr:
    """Base of graph-level expressions; every subclass has an ``info`` field."""

    __slots__ = ()
    if TYPE_CHECKING:
        info: StructInfo


# -- leaves -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Var(Expr):
    """A variable bound once (a function parameter or a binding's left side)."""

    name: str
    info: StructInfo = AnyInfo()

    def __repr__(self) -> str:
        return f"%{self.name}"


@dataclass(frozen=True, slots=True, eq=False)
class DataflowVar(Var):
    """A variable local to a dataflow block; it cannot escape the block."""

    def __repr__(self) -> str:
        return f"%{self.name}"


@dataclass(frozen=True, slots=True, eq=False)
class Constant(Expr):
    data: np.ndarray
    info: StructInfo = AnyInfo()
    name: str = ""  # a hint for printing and weight files

    @staticmethod
    def of(data: Any, dtype: str | None = None, name: str = "") -> "Constant":
        arr = np.asarray(data, dtype=dtype)
        return Constant(arr, TensorInfo(tuple(int(d) for d in arr.shape), str(arr.dtype)), name)


@dataclass(frozen=True, slots=True, eq=False)
class ShapeExpr(Expr):
    """A shape value built from dims: ``shape(n, 4)``."""

    values: tuple[Dim, ...]
    info: StructInfo = AnyInfo()

    @staticmethod
    def of(values: tuple[Dim, ...]) -> "ShapeExpr":
        return ShapeExpr(tuple(values), ShapeInfo(tuple(values)))


@dataclass(frozen=True, slots=True, eq=False)
class PrimValue(Expr):
    """A scalar: a symbolic int, or a float/bool/int literal."""

    value: Union[Dim, float, bool]
    info: StructInfo = AnyInfo()

    @staticmethod
    def of(value: Union[Dim, float, bool], dtype: str | None = None) -> "PrimValue":
        if dtype is None:
            dtype = "bool" if isinstance(value, bool) else "float32" if isinstance(value, float) else "int64"
        sym_value = value if dtype == "int64" and not isinstance(value, (bool, float)) else None
        return PrimValue(value, PrimInfo(dtype, sym_value))


@dataclass(frozen=True, slots=True, eq=False)
class StringImm(Expr):
    value: str
    info: StructInfo = AnyInfo()


@dataclass(frozen=True, slots=True, eq=False)
class GlobalVar(Expr):
    """The name of a function in the module (graph, tensor or extern)."""

    name: str
    info: StructInfo = AnyInfo()

    def __repr__(self) -> str:
        return f"@{self.name}"


@dataclass(frozen=True, slots=True, eq=False)
class ExternFunc(Expr):
    """A library entry point called by symbol (``call_lib`` / ``call_packed``)."""

    symbol: str
    info: StructInfo = FuncInfo(None, AnyInfo(), pure=False)


@dataclass(frozen=True, slots=True, eq=False)
class OpRef(Expr):
    """A reference to a registered operator by name (see ``tilework.op``)."""

    name: str
    info: StructInfo = AnyInfo()

    def __repr__(self) -> str:
        return self.name


# -- compound -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Call(Expr):
    """``callee(args)``. ``sinfo_args`` carry struct info that an op needs to be told (the
    output of ``call_tensor``, ``call_lib``, ``call_packed``)."""

    callee: Expr
    args: tuple[Expr, ...]
    attrs: Attrs = EMPTY_ATTRS
    sinfo_args: tuple[StructInfo, ...] = ()
    info: StructInfo = AnyInfo()


@dataclass(frozen=True, slots=True, eq=False)
class Tuple(Expr):
    fields: tuple[Expr, ...]
    info: StructInfo = AnyInfo()


@dataclass(frozen=True, slots=True, eq=False)
class TupleGetItem(Expr):
    tuple_value: Expr
    index: int
    info: StructInfo = AnyInfo()


@dataclass(frozen=True, slots=True, eq=False)
class Binding:
    """``var = value``."""

    var: Var
    value: Expr


@dataclass(frozen=True, slots=True, eq=False)
class MatchCast:
    """``var = match_cast(value, info)``: binds sym vars on first occurrence in ``info``,
    asserts the others at run time."""

    var: Var
    value: Expr
    cast_info: StructInfo


AnyBinding = Union[Binding, MatchCast]


@dataclass(frozen=True, slots=True, eq=False)
class BindingBlock:
    bindings: tuple[AnyBinding, ...]

    @property
    def is_dataflow(self) -> bool:
        return False


@dataclass(frozen=True, slots=True, eq=False)
class DataflowBlock(BindingBlock):
    """A pure block without control flow; only non-dataflow vars escape it."""

    @property
    def is_dataflow(self) -> bool:
        return True


@dataclass(frozen=True, slots=True, eq=False)
class SeqExpr(Expr):
    blocks: tuple[BindingBlock, ...]
    body: Expr
    info: StructInfo = AnyInfo()


@dataclass(frozen=True, slots=True, eq=False)
class If(Expr):
    cond: Expr
    then_branch: SeqExpr
    else_branch: SeqExpr
    info: StructInfo = AnyInfo()


@dataclass(frozen=True, slots=True, eq=False)
class GraphFunc:
    """A graph-level function. ``attrs`` may hold ``num_inputs`` (trailing params are weights)
    and ``dim_bounds``; ``pure`` is False when the body calls impure functions."""

    params: tuple[Var, ...]
    body: SeqExpr
    ret_info: StructInfo
    attrs: Attrs = EMPTY_ATTRS
    pure: bool = True

    @property
    def info(self) -> FuncInfo:
        return FuncInfo(tuple(p.info for p in self.params), self.ret_info, self.pure)

    def replace(self, **changes: Any) -> "GraphFunc":
        return replace(self, **changes)


def bindings_of(f: GraphFunc | SeqExpr) -> Iterator[AnyBinding]:
    """Every binding of the body, nested If branches included, in program order."""
    seq = f.body if isinstance(f, GraphFunc) else f
    for block in seq.blocks:
        for b in block.bindings:
            yield b
            if isinstance(b.value, If):
                yield from bindings_of(b.value.then_branch)
                yield from bindings_of(b.value.else_branch)


def used_vars(e: Expr) -> Iterator[Var]:
    """The vars an A-normal-form value reads (for an If: its condition and everything its
    branches read), in order, with repeats."""
    if isinstance(e, Var):
        yield e
    elif isinstance(e, Call):
        yield from used_vars(e.callee)
        for a in e.args:
            yield from used_vars(a)
    elif isinstance(e, Tuple):
        for f in e.fields:
            yield from used_vars(f)
    elif isinstance(e, TupleGetItem):
        yield from used_vars(e.tuple_value)
    elif isinstance(e, If):
        yield from used_vars(e.cond)
        for branch in (e.then_branch, e.else_branch):
            yield from seq_used_vars(branch)


def seq_used_vars(seq: SeqExpr) -> Iterator[Var]:
    """Every var read inside ``seq``: by its bindings' values and by its result."""
    for block in seq.blocks:
        for b in block.bindings:
            yield from used_vars(b.value)
    yield from used_vars(seq.body)


__all__ = [
    "Attrs",
    "EMPTY_ATTRS",
    "Expr",
    "Var",
    "DataflowVar",
    "Constant",
    "ShapeExpr",
    "PrimValue",
    "StringImm",
    "GlobalVar",
    "ExternFunc",
    "OpRef",
    "Call",
    "Tuple",
    "TupleGetItem",
    "Binding",
    "MatchCast",
    "AnyBinding",
    "BindingBlock",
    "DataflowBlock",
    "SeqExpr",
    "If",
    "GraphFunc",
    "bindings_of",
    "used_vars",
    "seq_used_vars",
]
