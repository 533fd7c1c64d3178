"""inline_scalar_constants: a one-element constant passed to a kernel becomes a literal in it.

torch's decompositions make the numbers of an epilogue graph constants (hardswish divides by a
``6.0`` tensor, adds ``0.5``, clamps to ``0.0`` and ``1.0``); passed to the fused kernel as
buffers, they are read at run time: the C compiler folds nothing, and a NaN-propagating max or
min against them takes the general two-select form (a dozen mask operations per vector after a
depthwise conv) where a literal bound takes one compare and one select
(``tilework.codegen.c.prelude``: ``tw_maxc``/``tw_minc``).

Each argument of a ``call_tensor`` that is a graph constant of one element, of a float or
integer dtype, is replaced in the kernel by its value (every load of the buffer becomes the
literal) and dropped from the call, when that call is the kernel's only caller (a kernel shared
by several calls is left as it is). Runs after fusion, before the schedule. Guarantees: the same
values (a load of a one-element constant buffer is its element).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tilework.ir.dtype import is_float_dtype
from tilework.ir.graph import Binding, Call, Constant, Expr, GlobalVar, OpRef, Tuple
from tilework.ir.loop import Block, Buffer, Const, Load, PExpr, Scalar, Stmt, TensorFunc, const
from tilework.ir.module import IRModule
from tilework.ir.rewrite import FuncRewriter
from tilework.schedule.tree import children, map_stmt_scalars, with_children
from tilework.transform.base import Pass

_DTYPES = ("float32", "float64", "int32", "int64")


def _is_call_tensor(e: Expr) -> bool:
    return isinstance(e, Call) and isinstance(e.callee, OpRef) and e.callee.name == "call_tensor" and isinstance(e.args[0], GlobalVar)


def _scalar(e: Expr) -> Const | None:
    """The literal of a one-element constant of a dtype kept as a literal, else None."""
    if not isinstance(e, Constant) or e.data.size != 1 or str(e.data.dtype) not in _DTYPES:
        return None
    dtype = str(e.data.dtype)
    value = e.data.reshape(()).item()
    return const(value, dtype) if is_float_dtype(dtype) or isinstance(value, int) else None


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


class _Rewriter(FuncRewriter):
    def __init__(self, mod: IRModule, callers: Counter[str]) -> None:
        super().__init__(mod)
        self.callers = callers
        self.kernels: dict[str, TensorFunc] = {}

    def rewrite_value(self, binding: Binding, value: Expr) -> Expr:
        if not _is_call_tensor(value) or not isinstance(value, Call):
            return value
        gv, args = value.args[0], value.args[1]
        assert isinstance(gv, GlobalVar)
        func = self.mod[gv.name]
        if not isinstance(func, TensorFunc) or self.callers[gv.name] != 1 or not isinstance(args, Tuple):
            return value
        values = {i: c for i, a in enumerate(args.fields) if (c := _scalar(a)) is not None and isinstance(func.params[i], Buffer)}
        values = {i: c for i, c in values.items() if func.params[i].dtype == c.dtype}  # type: ignore[union-attr]
        if not values:
            return value
        self.kernels[gv.name] = inline_into(func, values)
        kept = Tuple(tuple(a for i, a in enumerate(args.fields) if i not in values))
        return Call(value.callee, (gv, kept, *value.args[2:]), value.attrs, value.sinfo_args, value.info)


@dataclass(frozen=True)
class InlineScalarConstants(Pass):
    name: str = "inline_scalar_constants"

    def run(self, mod: IRModule) -> IRModule:
        callers: Counter[str] = Counter()
        for _, f in mod.graph_funcs():
            for block in f.body.blocks:
                for b in block.bindings:
                    v = b.value
                    if isinstance(b, Binding) and isinstance(v, Call) and _is_call_tensor(v) and isinstance(v.args[0], GlobalVar):
                        callers[v.args[0].name] += 1
        rewriter = _Rewriter(mod, callers)
        out = rewriter.run()
        for name, func in rewriter.kernels.items():
            out = out.with_func(name, func)
        return out


__all__ = ["InlineScalarConstants", "inline_into"]
