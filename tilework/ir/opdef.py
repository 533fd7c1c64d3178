"""The operator registry: what an op is, as the IR sees it.

An ``Op`` is a name, its attributes with defaults, a struct-info inference rule, an op pattern
(how its kernel composes under fusion) and, filled in by the op families, its legalization.
The registry lives at the IR level so that the builder and the verifier can infer and check op
calls; the op families (``tilework.op``, one file each) register into it.

Inference never drops a symbolic dim. When a fact cannot be proved (``(2, 3) + (2, n)`` needs
``n`` in {1, 3}) the rule records a ``DimCheck`` on the context; ``infer_with_checks`` returns
those checks, and lowering turns them into run-time assertions with the op's name in the message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tilework.errors import InferenceError, ShapeError
from tilework.ir import sym_walk
from tilework.ir.graph import EMPTY_ATTRS, Attrs, Call, Expr, OpRef
from tilework.ir.info import StructInfo
from tilework.ir.sym import Dim, SymVar


class OpPattern(enum.IntEnum):
    """How an op's kernel composes under fusion (the order matters: higher is less fusable)."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCTION = 3
    OUT_EWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8


@dataclass(frozen=True, slots=True)
class DimCheck:
    """A fact about dims that inference assumed and run time must check.

    kinds: ``eq`` (all dims equal), ``broadcast`` (``a == b`` or either is 1; 0 only against
    an equal dim), ``ge`` (``a >= b``), ``divides`` (``a % b == 0``), ``expands`` (``a``
    broadcasts one way to ``b``: ``a == b`` or ``a == 1``).
    """

    kind: str
    dims: tuple[Dim, ...]
    message: str

    def holds(self, env: Mapping[SymVar, int]) -> bool:
        vals = [sym_walk.evaluate(d, env) for d in self.dims]
        if self.kind == "eq":
            return all(v == vals[0] for v in vals)
        if self.kind == "broadcast":
            a, b = vals
            return a == b or (a == 1 and b >= 1) or (b == 1 and a >= 1)
        if self.kind == "ge":
            return vals[0] >= vals[1]
        if self.kind == "divides":
            return vals[1] != 0 and vals[0] % vals[1] == 0
        if self.kind == "expands":
            return vals[0] == vals[1] or vals[0] == 1
        raise InferenceError(f"unknown dim check kind {self.kind!r}")


@dataclass
class InferCtx:
    """What an inference rule may use besides the call: a place to record dim checks."""

    op_name: str
    checks: list[DimCheck] = field(default_factory=list)

    def require(self, kind: str, dims: Sequence[Dim], message: str) -> None:
        self.checks.append(DimCheck(kind, tuple(dims), f"{self.op_name}: {message}"))

    def error(self, message: str) -> InferenceError:
        return InferenceError(f"{self.op_name}: {message}")

    def shape_error(self, message: str) -> ShapeError:
        return ShapeError(f"{self.op_name}: {message}")


InferFn = Callable[[Call, InferCtx], StructInfo]


@dataclass(frozen=True, slots=True)
class Op:
    """A registered operator.

    ``attrs`` lists every attribute the op accepts with its default; constructors fill in the
    defaults so that printed IR is explicit and parsed IR compares equal.
    ``legalize`` is filled in by the loop level (op -> TensorFunc), ``None`` until then.
    """

    name: str
    infer: InferFn
    pattern: OpPattern = OpPattern.OPAQUE
    attrs: Mapping[str, Any] = field(default_factory=dict)
    num_args: int | None = None  # None: variadic
    pure: bool = True
    legalize: Callable[..., Any] | None = None
    effect: bool = False  # a run-time check: never removed as dead code, though pure

    def ref(self) -> OpRef:
        return _REFS[self.name]


_REGISTRY: dict[str, Op] = {}
_REFS: dict[str, OpRef] = {}


def register(op: Op) -> Op:
    if op.name in _REGISTRY:
        raise InferenceError(f"op {op.name!r} is registered twice")
    _REGISTRY[op.name] = op
    _REFS[op.name] = OpRef(op.name)
    return op


def get(name: str) -> Op:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise InferenceError(f"unknown op {name!r}") from None


def lookup(name: str) -> Op | None:
    return _REGISTRY.get(name)


def all_ops() -> dict[str, Op]:
    return dict(_REGISTRY)


def make_call(name: str, args: Sequence[Expr], attrs: Mapping[str, Any] | None = None, **kw: Any) -> Call:
    """A call of op ``name`` with its declared attribute defaults filled in."""
    op = get(name)
    given = dict(attrs or {})
    given.update(kw)
    unknown = set(given) - set(op.attrs)
    if unknown:
        raise InferenceError(f"{name}: unknown attribute(s) {', '.join(sorted(unknown))}; accepts {', '.join(op.attrs) or 'none'}")
    full = {k: given.get(k, d) for k, d in op.attrs.items()}
    if op.num_args is not None and len(args) != op.num_args:
        raise InferenceError(f"{name} takes {op.num_args} argument(s), got {len(args)}")
    return Call(_REFS[name], tuple(args), Attrs(full) if full else EMPTY_ATTRS)


def infer_with_checks(call: Call) -> tuple[StructInfo, list[DimCheck]]:
    """The struct info of an op call and the dim facts to check at run time."""
    assert isinstance(call.callee, OpRef)
    op = get(call.callee.name)
    ctx = InferCtx(op.name)
    return op.infer(call, ctx), ctx.checks


__all__ = ["OpPattern", "DimCheck", "InferCtx", "InferFn", "Op", "register", "get", "lookup", "all_ops", "make_call", "infer_with_checks"]
