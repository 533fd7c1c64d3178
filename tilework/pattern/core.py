"""The pattern language: patterns over graph-level expressions, with predicates.

The one pattern vocabulary of tilework: the rewrite driver's rules
(``tilework.transform.rewrite_driver``), the block matcher and subgraph rewriter
(``tilework.pattern.graph``, ``tilework.pattern.rewrite``) and the backends' capabilities all
use these patterns. A pattern is ``match(expr, m) -> bool`` with captures recorded in the
``Match``; the match's context (``MatchContext``) says what a var is bound to, so patterns look
through bindings the same way under every matcher. The language:

- **op patterns with argument sub-patterns**: ``is_op("add", is_op("matmul"), wildcard())``;
  an argument that is a var bound in the block being matched is looked through to its value,
  and the binding becomes part of the match;
- **leaves**: ``wildcard()``, ``is_const()``, ``is_var()``, ``is_tuple``, ``is_item``;
- **predicates** on the matched value's struct info: dtype, rank, shape, "no symbolic dims",
  per-dim facts that hold for every value of the sym vars (``dim(-1, static=True,
  divisible_by=4)``), and on the call's attributes; ``where(fn)`` for anything else;
- **combinators**: ``p | q`` (the first alternative that matches), ``p & q`` (both, captures
  of both), ``~p`` (``p`` does not match);
- **use constraints**: ``used_by(q)``, ``only_used_by(q)``, ``single_use()``: facts about the
  users of the matched var inside its block ("the matmul's output is used only by this add").
  They need the block matcher (``tilework.pattern.graph``), which knows every use; under the
  streaming rewrite driver a use constraint never holds.

Captures: ``name=`` on a constructor or ``.named(name)`` records what was written at the
matched place (a var, usually); a name captured twice must see the same node.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

from tilework.ir import sym
from tilework.ir.graph import Call, Constant, Expr, OpRef, Tuple, TupleGetItem, Var, used_vars
from tilework.ir.info import StructInfo, TensorInfo
from tilework.ir.sym import Dim

# -- match state --------------------------------------------------------------------------


class MatchContext(Protocol):
    """Where a match happens: what a var is bound to (None for a param, a var from outside
    the block, or one the matcher does not look through)."""

    def bound_value(self, v: Var) -> Expr | None: ...


class Match:
    """The captures of one match, by name, and the bindings it looked through (``bound``:
    var -> value, in the order they were entered)."""

    __slots__ = ("ctx", "captures", "bound")

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.captures: dict[str, Expr] = {}
        self.bound: dict[Var, Expr] = {}

    def __getitem__(self, name: str) -> Expr:
        return self.captures[name]

    def resolved(self, name: str) -> Expr:
        """What the capture ``name`` stands for, with bindings followed."""
        return _peek(self.captures[name], self)

    def capture(self, name: str | None, e: Expr) -> bool:
        """Record ``e`` under ``name``; a name captured twice must see the same node."""
        if name is None:
            return True
        prev = self.captures.get(name)
        if prev is not None:
            return prev is e
        self.captures[name] = e
        return True


def _fork(m: Match) -> Match:
    trial = Match(m.ctx)
    trial.captures = dict(m.captures)
    trial.bound = dict(m.bound)
    return trial


def _adopt(m: Match, trial: Match) -> None:
    m.captures = trial.captures
    m.bound = trial.bound


_MAX_CHAIN = 64  # var -> var -> ... bindings followed at most this far


def resolve(e: Expr, m: Match) -> Expr:
    """``e`` with var-to-value bindings followed; the vars passed through are recorded as part
    of the match."""
    step = m.ctx.bound_value
    for _ in range(_MAX_CHAIN):
        if not isinstance(e, Var):
            break
        value = step(e)
        if value is None:
            break
        m.bound.setdefault(e, value)
        e = value
    return e


def _peek(e: Expr, m: Match) -> Expr:
    """``e`` with bindings followed, without recording anything (for predicates)."""
    step = m.ctx.bound_value
    for _ in range(_MAX_CHAIN):
        if not isinstance(e, Var):
            break
        value = step(e)
        if value is None:
            break
        e = value
    return e


# -- the base class -----------------------------------------------------------------------


class Pattern(abc.ABC):
    """Base of tilework patterns: ``match`` plus combinators and predicates."""

    @abc.abstractmethod
    def match(self, e: Expr, m: Match) -> bool:
        """Whether ``e`` matches; captures (and bindings looked through) go into ``m``."""

    def __or__(self, other: "Pattern") -> "Pattern":
        return AnyOf((self, other))

    def __ror__(self, other: "Pattern") -> "Pattern":
        return AnyOf((other, self))

    def __and__(self, other: Pattern) -> "Pattern":
        return AllOf((self, other))

    def __invert__(self) -> "Pattern":
        return Not(self)

    def named(self, name: str) -> "Pattern":
        return Named(self, name)

    # -- struct info ------------------------------------------------------------------------

    def has_dtype(self, *dtypes: str) -> "Pattern":
        """The value's dtype is one of ``dtypes`` (an unknown dtype never matches)."""
        return Check(self, HasDtype(frozenset(dtypes)))

    def has_rank(self, *ranks: int) -> "Pattern":
        """The value is a tensor whose rank is one of ``ranks``."""
        return Check(self, HasRank(frozenset(ranks)))

    def has_shape(self, shape: Sequence[Dim | None]) -> "Pattern":
        """The value's shape equals ``shape`` (provably, for every value of the sym vars);
        ``None`` entries match any dim."""
        return Check(self, HasShape(tuple(shape)))

    def static_shape(self) -> "Pattern":
        """The value's shape is known and has no symbolic dims."""
        return Check(self, StaticShape())

    def dim(
        self,
        axis: int,
        *,
        static: bool | None = None,
        divisible_by: int | None = None,
        equals: Dim | None = None,
        at_least: int | None = None,
        at_most: int | None = None,
    ) -> "Pattern":
        """Facts about dim ``axis`` (negative counts from the end) that must hold for every
        value of the sym vars: ``static`` (an int / symbolic), ``divisible_by`` (``d % k == 0``
        proved), ``equals`` (proved equal), ``at_least``/``at_most`` (proved with the vars'
        bounds)."""
        return Check(self, DimIs(axis, static, divisible_by, equals, at_least, at_most))

    # -- attributes and anything else --------------------------------------------------------

    def has_attr(self, **attrs: Any) -> "Pattern":
        """The matched call has these attribute values."""
        return Check(self, HasAttrs(tuple(sorted(attrs.items()))))

    def attr_where(self, name: str, fn: Callable[[Any], bool]) -> "Pattern":
        """The matched call has attribute ``name`` and ``fn(value)`` holds."""
        return Check(self, AttrWhere(name, fn))

    def where(self, fn: Callable[[Expr, Match], bool]) -> "Pattern":
        """``fn(value, match)`` holds, where ``value`` is the matched expression with bindings
        followed (the call, for an op pattern)."""
        return Check(self, Custom(fn))

    # -- uses ---------------------------------------------------------------------------------

    def used_by(self, consumer: Pattern, index: int | None = None) -> "Pattern":
        """Some binding of the block that reads the matched var matches ``consumer`` (reading
        it as argument ``index`` when given)."""
        return Check(self, UsedBy(consumer, index, only=False))

    def only_used_by(self, consumer: Pattern, index: int | None = None) -> "Pattern":
        """Every reader of the matched var matches ``consumer`` (at ``index`` when given), and
        the var does not escape its block."""
        return Check(self, UsedBy(consumer, index, only=True))

    def single_use(self) -> "Pattern":
        """The matched var is read exactly once, inside its block, and does not escape it."""
        return Check(self, SingleUse())


# -- leaves -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wildcard(Pattern):
    """Anything."""

    name: str | None = None

    def match(self, e: Expr, m: Match) -> bool:
        return m.capture(self.name, e)


@dataclass(frozen=True)
class IsConst(Pattern):
    """A constant (or a var bound to one in the block)."""

    name: str | None = None

    def match(self, e: Expr, m: Match) -> bool:
        if not isinstance(_peek(e, m), Constant):
            return False
        resolve(e, m)
        return m.capture(self.name, e)


@dataclass(frozen=True)
class IsVar(Pattern):
    """A var that is not looked through: a parameter, or a value produced outside the block.
    With ``var_name`` the var must have that name."""

    name: str | None = None
    var_name: str | None = None

    def match(self, e: Expr, m: Match) -> bool:
        if not isinstance(e, Var) or _peek(e, m) is not e:
            return False
        if self.var_name is not None and e.name != self.var_name:
            return False
        return m.capture(self.name, e)


@dataclass(frozen=True)
class IsOp(Pattern):
    """A call of a registered op: ``op`` is a name, a set of names, or None (any op). ``args``
    match positionally when given (the counts must agree); ``None`` accepts any arguments."""

    op: str | frozenset[str] | None = None
    args: tuple[Pattern, ...] | None = None
    name: str | None = None

    def match(self, e: Expr, m: Match) -> bool:
        c = _peek(e, m)
        if not isinstance(c, Call) or not isinstance(c.callee, OpRef):
            return False
        op_name = c.callee.name
        if isinstance(self.op, str) and op_name != self.op:
            return False
        if isinstance(self.op, frozenset) and op_name not in self.op:
            return False
        if self.args is not None and len(self.args) != len(c.args):
            return False
        resolve(e, m)
        if self.args is not None and not all(p.match(a, m) for p, a in zip(self.args, c.args)):
            return False
        return m.capture(self.name, e)


@dataclass(frozen=True)
class IsTuple(Pattern):
    """A tuple (or a var bound to one) whose fields match ``fields`` (any when None)."""

    fields: tuple[Pattern, ...] | None = None
    name: str | None = None

    def match(self, e: Expr, m: Match) -> bool:
        t = _peek(e, m)
        if not isinstance(t, Tuple):
            return False
        if self.fields is not None and len(self.fields) != len(t.fields):
            return False
        resolve(e, m)
        if self.fields is not None and not all(p.match(f, m) for p, f in zip(self.fields, t.fields)):
            return False
        return m.capture(self.name, e)


@dataclass(frozen=True)
class IsItem(Pattern):
    """``tuple[index]`` (any index when None) whose tuple matches ``tuple_pattern``."""

    tuple_pattern: Pattern = Wildcard()
    index: int | None = None
    name: str | None = None

    def match(self, e: Expr, m: Match) -> bool:
        v = _peek(e, m)
        if not isinstance(v, TupleGetItem) or (self.index is not None and v.index != self.index):
            return False
        resolve(e, m)
        return self.tuple_pattern.match(v.tuple_value, m) and m.capture(self.name, e)


# -- combinators --------------------------------------------------------------------------


@dataclass(frozen=True)
class Named(Pattern):
    pattern: Pattern
    name: str

    def match(self, e: Expr, m: Match) -> bool:
        return self.pattern.match(e, m) and m.capture(self.name, e)


@dataclass(frozen=True)
class AnyOf(Pattern):
    """The first alternative that matches; only its captures and bindings are kept."""

    options: tuple[Pattern, ...]

    def match(self, e: Expr, m: Match) -> bool:
        for p in self.options:
            trial = _fork(m)
            if p.match(e, trial):
                _adopt(m, trial)
                return True
        return False


@dataclass(frozen=True)
class AllOf(Pattern):
    """Every part matches the same expression; captures and bindings of all are kept."""

    parts: tuple[Pattern, ...]

    def match(self, e: Expr, m: Match) -> bool:
        trial = _fork(m)
        if not all(p.match(e, trial) for p in self.parts):
            return False
        _adopt(m, trial)
        return True


@dataclass(frozen=True)
class Not(Pattern):
    """``pattern`` does not match (nothing is captured)."""

    pattern: Pattern

    def match(self, e: Expr, m: Match) -> bool:
        return not self.pattern.match(e, _fork(m))


# -- predicates ---------------------------------------------------------------------------


class Predicate(abc.ABC):
    """A fact about a matched expression; ``test(expr, value, m)`` sees the expression as
    written (a var, usually) and its value with bindings followed."""

    @abc.abstractmethod
    def test(self, e: Expr, value: Expr, m: Match) -> bool: ...


@dataclass(frozen=True)
class Check(Pattern):
    """``pattern`` and ``pred``."""

    pattern: Pattern
    pred: Predicate

    def match(self, e: Expr, m: Match) -> bool:
        trial = _fork(m)
        if not self.pattern.match(e, trial) or not self.pred.test(e, _peek(e, m), trial):
            return False
        _adopt(m, trial)
        return True


def _tensor(e: Expr) -> TensorInfo | None:
    info: StructInfo = e.info
    return info if isinstance(info, TensorInfo) else None


@dataclass(frozen=True)
class HasDtype(Predicate):
    dtypes: frozenset[str]

    def test(self, e: Expr, value: Expr, m: Match) -> bool:
        dtype = getattr(e.info, "dtype", None)
        return dtype is not None and dtype in self.dtypes


@dataclass(frozen=True)
class HasRank(Predicate):
    ranks: frozenset[int]

    def test(self, e: Expr, value: Expr, m: Match) -> bool:
        t = _tensor(e)
        return t is not None and t.ndim in self.ranks


@dataclass(frozen=True)
class HasShape(Predicate):
    dims: tuple[Dim | None, ...]

    def test(self, e: Expr, value: Expr, m: Match) -> bool:
        t = _tensor(e)
        if t is None or t.shape is None or len(t.shape) != len(self.dims):
            return False
        return all(want is None or sym.prove_eq(d, want) for d, want in zip(t.shape, self.dims))


@dataclass(frozen=True)
class StaticShape(Predicate):
    def test(self, e: Expr, value: Expr, m: Match) -> bool:
        t = _tensor(e)
        return t is not None and t.shape is not None and sym.is_static(t.shape)


@dataclass(frozen=True)
class DimIs(Predicate):
    axis: int
    static: bool | None = None
    divisible_by: int | None = None
    equals: Dim | None = None
    at_least: int | None = None
    at_most: int | None = None

    def test(self, e: Expr, value: Expr, m: Match) -> bool:
        t = _tensor(e)
        if t is None or t.shape is None or not -len(t.shape) <= self.axis < len(t.shape):
            return False
        return dim_holds(t.shape[self.axis], self.static, self.divisible_by, self.equals, self.at_least, self.at_most)


def dim_holds(
    d: Dim,
    static: bool | None = None,
    divisible_by: int | None = None,
    equals: Dim | None = None,
    at_least: int | None = None,
    at_most: int | None = None,
) -> bool:
    """Whether the facts about ``d`` hold for every value of its sym vars (see ``Pattern.dim``)."""
    if static is not None and isinstance(d, int) != static:
        return False
    if divisible_by is not None and sym.floormod(d, divisible_by) != 0:
        return False
    if equals is not None and not sym.prove_eq(d, equals):
        return False
    if at_least is not None and not sym.prove_ge(d, at_least):
        return False
    return at_most is None or sym.prove_le(d, at_most)


@dataclass(frozen=True)
class HasAttrs(Predicate):
    items: tuple[tuple[str, Any], ...]

    def test(self, e: Expr, value: Expr, m: Match) -> bool:
        if not isinstance(value, Call):
            return False
        return all(k in value.attrs and value.attrs[k] == v for k, v in self.items)


@dataclass(frozen=True)
class AttrWhere(Predicate):
    name: str
    fn: Callable[[Any], bool] = field(compare=False)

    def test(self, e: Expr, value: Expr, m: Match) -> bool:
        return isinstance(value, Call) and self.name in value.attrs and bool(self.fn(value.attrs[self.name]))


@dataclass(frozen=True)
class Custom(Predicate):
    fn: Callable[[Expr, Match], bool] = field(compare=False)

    def test(self, e: Expr, value: Expr, m: Match) -> bool:
        return bool(self.fn(value, m))


@dataclass(frozen=True)
class UsedBy(Predicate):
    consumer: Pattern
    index: int | None
    only: bool

    def test(self, e: Expr, value: Expr, m: Match) -> bool:
        graph = _use_graph(m)
        if graph is None or not isinstance(e, Var):
            return False
        users = graph.users(e)
        if not users or (self.only and graph.escapes(e)):
            return False
        verdicts = (self._reads(graph, e, user) for user in users)
        return all(verdicts) if self.only else any(verdicts)

    def _reads(self, graph: Any, e: Var, user: Var) -> bool:
        call = graph.bound_value(user)
        if self.index is not None and not (isinstance(call, Call) and self.index < len(call.args) and call.args[self.index] is e):
            return False
        return self.consumer.match(user, Match(graph))


@dataclass(frozen=True)
class SingleUse(Predicate):
    def test(self, e: Expr, value: Expr, m: Match) -> bool:
        graph = _use_graph(m)
        if graph is None or not isinstance(e, Var):
            return False
        users = graph.users(e)
        if len(users) != 1 or graph.escapes(e):
            return False
        reader = graph.bound_value(users[0])
        return reader is not None and sum(1 for x in used_vars(reader) if x is e) == 1


def _use_graph(m: Match) -> Any:
    """The match context when it knows every use (the block matcher's ``BlockGraph``), else
    None."""
    ctx: Any = m.ctx
    return ctx if hasattr(ctx, "users") and hasattr(ctx, "escapes") else None


# -- constructors -------------------------------------------------------------------------


def wildcard(name: str | None = None) -> Wildcard:
    return Wildcard(name)


def is_const(name: str | None = None) -> IsConst:
    return IsConst(name)


def is_var(name: str | None = None, var_name: str | None = None) -> IsVar:
    return IsVar(name, var_name)


def is_op(op: str | Iterable[str] | None, *args: Pattern, name: str | None = None, any_args: bool = False) -> IsOp:
    """A call of ``op`` (a name, several names, or None for any op) with ``args`` matched
    positionally; with no ``args`` and ``any_args`` the arguments are not looked at, with no
    ``args`` otherwise the op takes none. Most patterns pass their arguments or ``any_args``."""
    ops = op if op is None or isinstance(op, str) else frozenset(op)
    return IsOp(ops, None if any_args else tuple(args), name)


def op_call(op: str | Iterable[str] | None, name: str | None = None) -> IsOp:
    """A call of ``op`` with any arguments."""
    return is_op(op, name=name, any_args=True)


def is_tuple(*fields: Pattern, name: str | None = None, any_fields: bool = False) -> IsTuple:
    return IsTuple(None if any_fields else tuple(fields), name)


def is_item(tuple_pattern: Pattern = Wildcard(), index: int | None = None, name: str | None = None) -> IsItem:
    return IsItem(tuple_pattern, index, name)


__all__ = [
    "Match",
    "MatchContext",
    "Pattern",
    "Predicate",
    "Wildcard",
    "IsConst",
    "IsVar",
    "IsOp",
    "IsTuple",
    "IsItem",
    "Named",
    "AnyOf",
    "AllOf",
    "Not",
    "Check",
    "HasDtype",
    "HasRank",
    "HasShape",
    "StaticShape",
    "DimIs",
    "HasAttrs",
    "AttrWhere",
    "Custom",
    "UsedBy",
    "SingleUse",
    "dim_holds",
    "resolve",
    "wildcard",
    "is_const",
    "is_var",
    "is_op",
    "op_call",
    "is_tuple",
    "is_item",
]
