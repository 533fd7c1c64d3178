"""inline_scalar_constants: a one-element constant passed to a kernel becomes a literal in it.

torch's decompositions make the numbers of an epilogue graph constants (hardswish divides by a
``6.0`` tensor, adds ``0.5``, clamps to ``0.0`` and ``1.0``); passed to the fused kernel as
buffers, they are read at run time: the C compiler folds nothing, and a NaN-propagating max or
min against them takes the general two-select form (a dozen mask operations per vector after a
depthwise conv) where a literal bound takes one compare and one select
(``tilework.codegen.c.prelude``: ``tw_maxc``/``tw_minc``).

Each param of a kernel that every ``call_tensor`` of it passes the same graph constant of one
element (of a float or integer dtype: the same dtype and bytes) is replaced in the kernel by
that value (every load of the buffer becomes the literal) and dropped from the calls; a param
its callers pass different values stays a param (MobileNetV3's repeated blocks share their
kernels and their hardswish constants). Only kernels that nothing refers to but such calls, each
a binding of a graph function's body, are touched. Runs after fusion, before the schedule.
Guarantees: the same values (a load of a one-element constant buffer is its element).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tilework.ir.graph import Binding, Call, Constant, Expr, GlobalVar, Tuple
from tilework.ir.loop import Block, Buffer, Const, Load, PExpr, Scalar, Stmt, TensorFunc, const
from tilework.ir.module import IRModule
from tilework.ir.rewrite import FuncRewriter
from tilework.ir.visitor import ExprVisitor
from tilework.schedule.tree import children, map_stmt_scalars, with_children
from tilework.transform.base import Pass
from tilework.transform.fuse_tensor import is_call_tensor

_DTYPES = ("float32", "float64", "int32", "int64")


def _is_call_tensor(e: Expr) -> bool:
    return is_call_tensor(e) and isinstance(e.args[0], GlobalVar)  # type: ignore[attr-defined]


def _scalar(e: Expr) -> Const | None:
    """The literal of a one-element constant of a dtype kept as a literal, else None."""
    if not isinstance(e, Constant) or e.data.size != 1 or str(e.data.dtype) not in _DTYPES:
        return None
    return const(e.data.reshape(()).item(), str(e.data.dtype))


def inline_into(func: TensorFunc, values: dict[int, Const]) -> TensorFunc:
    """``func`` with params ``values`` (by position) read as those literals and removed."""
    bufs: dict[Buffer, Const] = {}
    for i, c in values.items():
        p = func.params[i]
        assert isinstance(p, Buffer)
        bufs[p] = c

    def literal(x: PExpr) -> Scalar | None:
        return bufs.get(x.buffer) if isinstance(x, Load) else None

    body = _drop_reads(map_stmt_scalars(func.body, literal), set(bufs))
    params = tuple(p for i, p in enumerate(func.params) if i not in values)
    return TensorFunc(params, body, func.num_outputs, func.attrs)


def _drop_reads(s: Stmt, gone: set[Buffer]) -> Stmt:
    """``s`` with ``gone`` out of its blocks' read lists."""
    s = with_children(s, [_drop_reads(c, gone) for c in children(s)])
    if isinstance(s, Block) and any(b in gone for b in s.reads):
        return Block(s.name, s.iter_vars, tuple(b for b in s.reads if b not in gone), s.writes, s.body, s.init)
    return s


class _References(ExprVisitor):
    """Every reference to a module function, and the ``call_tensor`` calls among them."""

    def __init__(self) -> None:
        self.refs: Counter[str] = Counter()
        self.calls: list[Call] = []

    def visit_global_var(self, e: GlobalVar) -> None:
        self.refs[e.name] += 1

    def visit_call(self, e: Call) -> None:
        if _is_call_tensor(e):
            self.calls.append(e)
        super().visit_call(e)


def _callers(mod: IRModule) -> dict[str, list[Call]]:
    """Each kernel's ``call_tensor`` calls, for the kernels that are referenced by those calls
    alone, each a binding of a graph function's body (not inside a branch)."""
    seen = _References()
    top: set[int] = set()
    for _, f in mod.graph_funcs():
        seen.visit(f.body)
        top |= {id(b.value) for block in f.body.blocks for b in block.bindings if isinstance(b, Binding)}
    by_kernel: dict[str, list[Call]] = {}
    for call in seen.calls:
        by_kernel.setdefault(call.args[0].name, []).append(call)  # type: ignore[attr-defined]
    return {name: calls for name, calls in by_kernel.items() if seen.refs[name] == len(calls) and all(id(c) in top and isinstance(c.args[1], Tuple) for c in calls)}


def _shared_literals(func: TensorFunc, calls: list[Call]) -> dict[int, Const]:
    """The params of ``func`` that every one of its ``calls`` passes the same one-element
    constant (the same dtype and bytes) as, with their literals."""
    first = calls[0].args[1].fields  # type: ignore[attr-defined]
    out: dict[int, Const] = {}
    for i, a in enumerate(first):
        c, p = _scalar(a), func.params[i]
        if c is not None and isinstance(p, Buffer) and p.dtype == c.dtype and all(_same(call.args[1].fields[i], a) for call in calls[1:]):  # type: ignore[attr-defined]
            out[i] = c
    return out


def _same(a: Expr, b: Expr) -> bool:
    return isinstance(a, Constant) and isinstance(b, Constant) and a.data.dtype == b.data.dtype and a.data.tobytes() == b.data.tobytes()


class _Rewriter(FuncRewriter):
    def __init__(self, mod: IRModule, drop: dict[str, dict[int, Const]]) -> None:
        super().__init__(mod)
        self.drop = drop

    def rewrite_value(self, binding: Binding, value: Expr) -> Expr:
        values = self.drop.get(value.args[0].name) if isinstance(value, Call) and _is_call_tensor(value) else None  # type: ignore[attr-defined]
        if not values:
            return value
        assert isinstance(value, Call)
        kept = Tuple(tuple(a for i, a in enumerate(value.args[1].fields) if i not in values))  # type: ignore[attr-defined]
        return Call(value.callee, (value.args[0], kept, *value.args[2:]), value.attrs, value.sinfo_args, value.info)


@dataclass(frozen=True)
class InlineScalarConstants(Pass):
    name: str = "inline_scalar_constants"

    def run(self, mod: IRModule) -> IRModule:
        callers = _callers(mod)
        kernels = {name: func for name in callers if isinstance(func := mod[name], TensorFunc)}
        drop = {name: values for name, func in kernels.items() if (values := _shared_literals(func, callers[name]))}
        if not drop:
            return mod
        out = _Rewriter(mod, drop).run()
        for name, values in drop.items():
            out = out.with_func(name, inline_into(kernels[name], values))
        return out


__all__ = ["InlineScalarConstants", "inline_into"]
