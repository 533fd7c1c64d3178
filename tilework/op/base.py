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
from tilework.ir.graph import EMPTY_ATTRS, Attrs, Call, Expr, OpRef, ShapeExpr
from tilework.ir.dtype import DTYPES, is_float_dtype
from tilework.ir.info import AnyInfo, ShapeInfo, StructInfo, TensorInfo, shape_str
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


def normalize_axes(axes: Sequence[int], ndim: int, ctx: InferCtx) -> tuple[int, ...]:
    """``axes`` mapped into ``[0, ndim)`` in the given order; a repeated axis is an error."""
    out = tuple(normalize_axis(a, ndim, ctx) for a in axes)
    if len(set(out)) != len(out):
        raise ctx.error(f"repeated axis in {tuple(axes)} for a tensor of rank {ndim}")
    return out


def may_be_float(dtype: str | None) -> bool:
    """True for floating-point dtypes and for an unknown dtype (which may be one)."""
    return dtype is None or is_float_dtype(dtype)


def require_float(t: TensorInfo, ctx: InferCtx, what: str = "input") -> None:
    if not may_be_float(t.dtype):
        raise ctx.error(f"{what} must be a floating-point tensor, got {t.dtype}")


def shape_arg(call: Call, i: int, ctx: InferCtx) -> ShapeInfo:
    """Argument ``i`` as a shape value; an unknown-typed argument is a shape of unknown rank."""
    if i >= len(call.args):
        raise ctx.error(f"expects at least {i + 1} argument(s), got {len(call.args)}")
    info = call.args[i].info
    if isinstance(info, ShapeInfo):
        return info
    if isinstance(info, AnyInfo):
        return ShapeInfo(None, -1)
    raise ctx.error(f"argument {i} must be a shape, got {type(info).__name__}")


def to_shape_expr(shape: Expr | Sequence[Dim], op_name: str) -> Expr:
    """A constructor's shape argument: an expression is used as is, dims become a ShapeExpr."""
    if isinstance(shape, Expr):
        return shape
    values = tuple(shape)
    for d in values:
        if isinstance(d, bool) or not isinstance(d, (int, sym.SymExpr)):
            raise InferenceError(f"{op_name}: shape entries must be ints or symbolic dims, got {d!r}")
    return ShapeExpr(values)


def require_nonneg(shape: Sequence[Dim], ctx: InferCtx, what: str) -> None:
    """Dims of a requested shape: a provably negative one is an error, an unprovable one a check."""
    for d in shape:
        if sym.prove_ge(d, 0):
            continue
        if isinstance(d, int) or sym.prove_le(d, -1):
            raise ctx.shape_error(f"{what} {shape_str(tuple(shape))} has a negative dim {sym.to_str(d)}")
        ctx.require("ge", (d, 0), f"dim {sym.to_str(d)} of {what} {shape_str(tuple(shape))} must be >= 0")


def require_expands(src: Sequence[Dim], dst: Sequence[Dim], ctx: InferCtx, what: str) -> None:
    """``src`` (the shape of ``what``) broadcasts one way to ``dst``: right-aligned, each dim
    equal or 1."""
    s, d = shape_str(tuple(src)), shape_str(tuple(dst))
    if len(src) > len(dst):
        raise ctx.shape_error(f"cannot broadcast {what} {s} to {d}: too many dims")
    for a, b in zip(reversed(tuple(src)), reversed(tuple(dst))):
        if a == 1 or a is b or sym.prove_eq(a, b):
            continue
        if sym.prove_ne(a, b) and sym.prove_ne(a, 1):
            raise ctx.shape_error(f"cannot broadcast {what} {s} to {d} ({sym.to_str(a)} vs {sym.to_str(b)})")
        ctx.require("expands", (a, b), f"dim {sym.to_str(a)} of {what} {s} must be 1 or {sym.to_str(b)} to broadcast to {d}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def int_attr(call: Call, name: str, ctx: InferCtx) -> int:
    v = call.attrs[name]
    if not _is_int(v):
        raise ctx.error(f"attribute {name} must be an int, got {v!r}")
    return int(v)


def axes_attr(call: Call, name: str, ctx: InferCtx) -> tuple[int, ...] | None:
    """An axes attribute: None, an int (one axis) or a tuple of ints."""
    v = call.attrs[name]
    if v is None:
        return None
    if _is_int(v):
        return (int(v),)
    if isinstance(v, tuple) and all(_is_int(a) for a in v):
        return tuple(int(a) for a in v)
    raise ctx.error(f"attribute {name} must be None, an int or a tuple of ints, got {v!r}")


def bool_attr(call: Call, name: str, ctx: InferCtx) -> bool:
    v = call.attrs[name]
    if not isinstance(v, bool):
        raise ctx.error(f"attribute {name} must be a bool, got {v!r}")
    return v


def dtype_attr(call: Call, name: str, ctx: InferCtx) -> str | None:
    """A dtype attribute; None means "not given" (the op's rule decides)."""
    v = call.attrs[name]
    if v is None:
        return None
    if v not in DTYPES:
        raise ctx.error(f"attribute {name}: unknown dtype {v!r}; expected one of {', '.join(DTYPES)}")
    return str(v)


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
    "normalize_axes",
    "may_be_float",
    "require_float",
    "shape_arg",
    "to_shape_expr",
    "require_nonneg",
    "require_expands",
    "int_attr",
    "axes_attr",
    "bool_attr",
    "dtype_attr",
]
