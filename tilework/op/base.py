"""The operator registry.

An operator is defined in exactly one place (a file per family under ``tilework/op``): its name,
its attributes with defaults, its struct-info inference rule, its op pattern and, in later
layers, its legalization and backend lowerings. ``register`` adds it to the one registry; the
constructor function that builds a ``Call`` lives beside it.

Inference never drops a symbolic dim. When a fact cannot be proved (``(2, 3) + (2, n)`` needs
``n`` in {1, 3}) the rule records a ``DimCheck`` on the context; ``infer_with_checks`` returns
those checks, and lowering turns them into run-time assertions with the op's name in the message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tilework.errors import InferenceError, ShapeError
from tilework.ir import sym
from tilework.ir.graph import EMPTY_ATTRS, Attrs, Call, Expr, OpRef
from tilework.ir.info import AnyInfo, StructInfo, TensorInfo, shape_str
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
    an equal dim), ``ge`` (``a >= b``), ``divides`` (``a % b == 0``).
    """

    kind: str
    dims: tuple[Dim, ...]
    message: str

    def holds(self, env: Mapping[SymVar, int]) -> bool:
        vals = [sym.evaluate(d, env) for d in self.dims]
        if self.kind == "eq":
            return all(v == vals[0] for v in vals)
        if self.kind == "broadcast":
            a, b = vals
            return a == b or (a == 1 and b >= 1) or (b == 1 and a >= 1)
        if self.kind == "ge":
            return vals[0] >= vals[1]
        if self.kind == "divides":
            return vals[1] != 0 and vals[0] % vals[1] == 0
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


def set_legalize(name: str, fn: Callable[..., Any]) -> None:
    """Attach the loop-level lowering of an op (used by ``tilework.op`` families' legalize)."""
    op = get(name)
    object.__setattr__(op, "legalize", fn)


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


# -- helpers shared by inference rules ----------------------------------------------------


def tensor_arg(call: Call, i: int, ctx: InferCtx) -> TensorInfo:
    """Argument ``i`` as a tensor; an unknown-typed argument is a tensor of unknown rank."""
    if i >= len(call.args):
        raise ctx.error(f"expects at least {i + 1} argument(s), got {len(call.args)}")
    info = call.args[i].info
    if isinstance(info, TensorInfo):
        return info
    if isinstance(info, AnyInfo):
        return TensorInfo(None, None, -1)
    raise ctx.error(f"argument {i} must be a tensor, got {type(info).__name__}")


def normalize_axis(axis: int, ndim: int, ctx: InferCtx) -> int:
    if not -ndim <= axis < max(ndim, 1) or (ndim == 0 and axis not in (0, -1)):
        raise ctx.error(f"axis {axis} is out of range for a tensor of rank {ndim}")
    return axis + ndim if axis < 0 else axis


def broadcast_dims(a: Dim, b: Dim, ctx: InferCtx, sa: Sequence[Dim], sb: Sequence[Dim]) -> Dim:
    """The broadcast of two dims; records a run-time check when it cannot be proved."""
    if a is b or sym.prove_eq(a, b):
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ctx.shape_error(f"shapes {shape_str(tuple(sa))} and {shape_str(tuple(sb))} do not broadcast ({a} vs {b})")
    ctx.require("broadcast", (a, b), f"dims {sym.to_str(a)} and {sym.to_str(b)} of shapes {shape_str(tuple(sa))} and {shape_str(tuple(sb))} must be equal or 1")
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    return sym.max_(a, b)


def broadcast_shapes(sa: Sequence[Dim], sb: Sequence[Dim], ctx: InferCtx) -> tuple[Dim, ...]:
    n = max(len(sa), len(sb))
    pa = (1,) * (n - len(sa)) + tuple(sa)
    pb = (1,) * (n - len(sb)) + tuple(sb)
    return tuple(broadcast_dims(x, y, ctx, sa, sb) for x, y in zip(pa, pb))


def require_equal(a: Dim, b: Dim, ctx: InferCtx, what: str) -> Dim:
    """Two dims that must be equal: an error when provably different, a check when unknown."""
    if a is b or sym.prove_eq(a, b):
        return a
    if sym.prove_ne(a, b):
        raise ctx.shape_error(f"{what}: {sym.to_str(a)} != {sym.to_str(b)}")
    ctx.require("eq", (a, b), f"{what}: {sym.to_str(a)} must equal {sym.to_str(b)}")
    return a if isinstance(a, int) or not isinstance(b, int) else b


def unify_dtype(dtypes: Sequence[str | None], ctx: InferCtx) -> str | None:
    """The common dtype of arguments that must agree; an unknown one takes the known one's."""
    known = {d for d in dtypes if d is not None}
    if len(known) > 1:
        raise ctx.error(f"dtypes disagree: {', '.join(sorted(known))}")
    return known.pop() if known else None


__all__ = [
    "OpPattern",
    "DimCheck",
    "InferCtx",
    "Op",
    "register",
    "get",
    "lookup",
    "all_ops",
    "make_call",
    "infer_with_checks",
    "tensor_arg",
    "normalize_axis",
    "broadcast_shapes",
    "broadcast_dims",
    "require_equal",
    "unify_dtype",
]
