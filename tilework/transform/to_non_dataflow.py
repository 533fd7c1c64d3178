"""to_non_dataflow: turn dataflow blocks into ordinary blocks and dataflow vars into vars.

Requires a well-formed module. Guarantees the same program with no ``DataflowBlock`` and no
``DataflowVar`` left, so that later lowering passes (explicit allocation, memory planning) can
treat every binding alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilework.ir.graph import (
    AnyBinding,
    Binding,
    BindingBlock,
    Call,
    DataflowVar,
    Expr,
    If,
    MatchCast,
    SeqExpr,
    Tuple,
    TupleGetItem,
    Var,
)
from tilework.ir.module import IRModule
from tilework.transform.base import Pass


class _Converter:
    def __init__(self) -> None:
        self.vars: dict[Var, Var] = {}

    def var(self, v: Var) -> Var:
        if isinstance(v, DataflowVar):
            nv = self.vars.get(v)
            if nv is None:
                nv = Var(v.name, v.info)
                self.vars[v] = nv
            return nv
        return v

    def expr(self, e: Expr) -> Expr:
        if isinstance(e, Var):
            return self.var(e)
        if isinstance(e, Call):
            return Call(self.expr(e.callee), tuple(self.expr(a) for a in e.args), e.attrs, e.sinfo_args, e.info)
        if isinstance(e, Tuple):
            return Tuple(tuple(self.expr(f) for f in e.fields), e.info)
        if isinstance(e, TupleGetItem):
            return TupleGetItem(self.expr(e.tuple_value), e.index, e.info)
        if isinstance(e, If):
            return If(self.expr(e.cond), self.seq(e.then_branch), self.seq(e.else_branch), e.info)
        if isinstance(e, SeqExpr):
            return self.seq(e)
        return e

    def binding(self, b: AnyBinding) -> AnyBinding:
        if isinstance(b, MatchCast):
            return MatchCast(self.var(b.var), self.expr(b.value), b.cast_info)
        return Binding(self.var(b.var), self.expr(b.value))

    def seq(self, s: SeqExpr) -> SeqExpr:
        blocks = [BindingBlock(tuple(self.binding(b) for b in blk.bindings)) for blk in s.blocks]
        merged = [BindingBlock(tuple(b for blk in blocks for b in blk.bindings))] if blocks else []
        return SeqExpr(tuple(merged), self.expr(s.body), s.info)


@dataclass(frozen=True)
class ToNonDataflow(Pass):
    name: str = "to_non_dataflow"

    def run(self, mod: IRModule) -> IRModule:
        out = mod
        for name, f in mod.graph_funcs():
            out = out.with_func(name, f.replace(body=_Converter().seq(f.body)))
        return out


def to_non_dataflow(mod: IRModule) -> IRModule:
    return ToNonDataflow()(mod)
