"""The loop level: tensor programs over buffers with symbolic shapes.

A ``TensorFunc`` takes buffers (inputs first, then outputs: destination-passing) and sym vars
that no buffer shape supplies. Its body is made of loops, blocks and stores. A ``Block`` is a
named computation with its iteration vars (spatial or reduction), each bound to an expression
of the enclosing loop vars; it is the unit that analyses and schedules work on.

Scalar expressions (``PExpr``) compute values; integer index arithmetic is done with
``sym`` dims (an ``int`` or ``SymExpr`` is a valid int64 scalar expression), so loop indices
simplify and bound with the same machinery as shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterator, Union

from tilework.ir.graph import EMPTY_ATTRS, Attrs
from tilework.ir.sym import Dim, SymExpr, SymVar

# -- scalar expressions -------------------------------------------------------------------


class PExpr:
    """Base of loop-level scalar expressions; every subclass has a ``dtype``."""

    __slots__ = ()
    if TYPE_CHECKING:
        dtype: str


Scalar = Union[PExpr, int, SymExpr]  # an int or SymExpr is an int64 index value

BINARY_OPS = ("+", "-", "*", "/", "//", "%", "min", "max", "pow")
COMPARE_OPS = ("<", "<=", "==", "!=", ">", ">=")
LOGICAL_OPS = ("and", "or")
UNARY_OPS = ("neg", "not")
INTRINSICS = (
    "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "floor", "ceil", "round",
    "sin", "cos", "log1p", "expm1", "isnan", "isinf",
)  # fmt: skip


def dtype_of(x: Scalar) -> str:
    return "int64" if isinstance(x, (int, SymExpr)) else x.dtype


@dataclass(frozen=True, slots=True, eq=False)
class Const(PExpr):
    value: Union[int, float, bool]
    dtype: str


@dataclass(frozen=True, slots=True, eq=False)
class Load(PExpr):
    buffer: "Buffer"
    indices: tuple[Scalar, ...]

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.buffer.dtype


@dataclass(frozen=True, slots=True, eq=False)
class Binary(PExpr):
    op: str
    a: Scalar
    b: Scalar
    dtype: str


@dataclass(frozen=True, slots=True, eq=False)
class Unary(PExpr):
    op: str
    a: Scalar
    dtype: str


@dataclass(frozen=True, slots=True, eq=False)
class Cast(PExpr):
    dtype: str
    value: Scalar


@dataclass(frozen=True, slots=True, eq=False)
class Select(PExpr):
    cond: Scalar
    a: Scalar
    b: Scalar
    dtype: str


@dataclass(frozen=True, slots=True, eq=False)
class Intrin(PExpr):
    name: str
    args: tuple[Scalar, ...]
    dtype: str


# -- buffers and statements ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Buffer:
    """A dense row-major array. Identity makes it unique, like a var."""

    name: str
    shape: tuple[Dim, ...]
    dtype: str

    def __repr__(self) -> str:
        return f"Buffer({self.name})"


class Stmt:
    __slots__ = ()


@dataclass(frozen=True, slots=True, eq=False)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[Scalar, ...]
    value: Scalar


LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled")


@dataclass(frozen=True, slots=True, eq=False)
class For(Stmt):
    """``for var in range(extent)``: ``var`` runs over ``[0, extent)``."""

    var: SymVar
    extent: Dim
    body: Stmt
    kind: str = "serial"


@dataclass(frozen=True, slots=True, eq=False)
class IterVar:
    """A block iteration var: ``var`` ranges over ``[0, extent)`` and takes ``binding``, an
    expression of the enclosing loop vars, on each execution of the block."""

    var: SymVar
    extent: Dim
    kind: str  # "spatial" | "reduce"
    binding: Dim


@dataclass(frozen=True, slots=True, eq=False)
class Block(Stmt):
    """A named computation. ``init`` runs when every reduction iter var is 0."""

    name: str
    iter_vars: tuple[IterVar, ...]
    reads: tuple[Buffer, ...]
    writes: tuple[Buffer, ...]
    body: Stmt
    init: Stmt | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Allocate(Stmt):
    """Scratch storage for ``buffer`` during ``body``."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, slots=True, eq=False)
class IfThenElse(Stmt):
    cond: Scalar
    then_body: Stmt
    else_body: Stmt | None = None


@dataclass(frozen=True, slots=True, eq=False)
class SeqStmt(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True, eq=False)
class TensorFunc:
    """A loop-level function. ``params`` are buffers and sym vars; the last ``num_outputs``
    buffers are written (destination-passing)."""

    params: tuple[Union[Buffer, SymVar], ...]
    body: Stmt
    num_outputs: int = 1
    attrs: Attrs = EMPTY_ATTRS

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return tuple(p for p in self.params if isinstance(p, Buffer))

    @property
    def inputs(self) -> tuple[Buffer, ...]:
        bufs = self.buffers
        return bufs[: len(bufs) - self.num_outputs]

    @property
    def outputs(self) -> tuple[Buffer, ...]:
        bufs = self.buffers
        return bufs[len(bufs) - self.num_outputs :]

    @property
    def sym_params(self) -> tuple[SymVar, ...]:
        return tuple(p for p in self.params if isinstance(p, SymVar))

    def replace(self, **changes: Any) -> "TensorFunc":
        return replace(self, **changes)


def walk_stmts(s: Stmt) -> Iterator[Stmt]:
    """Every statement of ``s`` in pre-order."""
    yield s
    if isinstance(s, SeqStmt):
        for x in s.stmts:
            yield from walk_stmts(x)
    elif isinstance(s, (For, Allocate)):
        yield from walk_stmts(s.body)
    elif isinstance(s, Block):
        if s.init is not None:
            yield from walk_stmts(s.init)
        yield from walk_stmts(s.body)
    elif isinstance(s, IfThenElse):
        yield from walk_stmts(s.then_body)
        if s.else_body is not None:
            yield from walk_stmts(s.else_body)


def walk_scalars(x: Scalar) -> Iterator[Scalar]:
    """Every scalar sub-expression of ``x`` in pre-order."""
    yield x
    if isinstance(x, Load):
        for i in x.indices:
            yield from walk_scalars(i)
    elif isinstance(x, Binary):
        yield from walk_scalars(x.a)
        yield from walk_scalars(x.b)
    elif isinstance(x, Unary):
        yield from walk_scalars(x.a)
    elif isinstance(x, Cast):
        yield from walk_scalars(x.value)
    elif isinstance(x, Select):
        yield from walk_scalars(x.cond)
        yield from walk_scalars(x.a)
        yield from walk_scalars(x.b)
    elif isinstance(x, Intrin):
        for a in x.args:
            yield from walk_scalars(a)


def stmt_scalars(s: Stmt) -> Iterator[Scalar]:
    """The top-level scalar expressions that statement ``s`` itself holds (not nested stmts)."""
    if isinstance(s, Store):
        yield from s.indices
        yield s.value
    elif isinstance(s, IfThenElse):
        yield s.cond
