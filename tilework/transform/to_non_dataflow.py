"""to_non_dataflow: turn dataflow blocks into ordinary blocks and dataflow vars into vars.

Requires a well-formed module. Guarantees the same program with no ``DataflowBlock`` and no
``DataflowVar`` left, so that later lowering passes (explicit allocation, memory planning) can
treat every binding alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilework.ir.graph import BindingBlock, DataflowVar, SeqExpr, Var
from tilework.ir.module import IRModule
from tilework.ir.visitor import ExprMutator
from tilework.transform.base import Pass


class _Converter(ExprMutator):
    """Binds a plain Var for each DataflowVar (reads follow through ``var_map``) and merges
    the blocks of every SeqExpr into one plain block."""

    def mutate_var_def(self, v: Var) -> Var:
        if not isinstance(v, DataflowVar):
            return v
        new = Var(v.name, v.info)
        self.var_map[v] = new
        return new

    def mutate_seq_expr(self, e: SeqExpr) -> SeqExpr:
        s = super().mutate_seq_expr(e)
        blocks = (BindingBlock(tuple(b for blk in s.blocks for b in blk.bindings)),) if s.blocks else ()
        return SeqExpr(blocks, s.body, s.info)


@dataclass(frozen=True)
class ToNonDataflow(Pass):
    name: str = "to_non_dataflow"

    def run(self, mod: IRModule) -> IRModule:
        out = mod
        for name, f in mod.graph_funcs():
            out = out.with_func(name, f.replace(body=_Converter().mutate_seq_expr(f.body)))
        return out


def to_non_dataflow(mod: IRModule) -> IRModule:
    return ToNonDataflow()(mod)
