"""The ``If`` converter.

A condition known at conversion time (a constant, or a comparison of dims that the importer
could prove) selects its branch, which is inlined. Otherwise both branches are converted into
an ``If`` expression; each result whose shape differs between the branches is bound to fresh
sym vars by a ``match_cast`` after it.
"""

from __future__ import annotations

from onnx import GraphProto

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.registry import Result, converter
from tilework.frontend.onnx.values import Value
from tilework.ir.graph import Expr, Tuple, TupleGetItem
from tilework.op import manipulate


def _known_condition(v: Value) -> bool | None:
    if v.const is not None and v.const.size == 1:
        return bool(v.const.reshape(()))
    if v.elems is not None and len(v.elems) == 1 and isinstance(v.elems[0], bool):
        return v.elems[0]
    return None


@converter("If", 1, 25)
def _if(ctx: NodeCtx) -> Result:
    imp = ctx.imp
    then_g, else_g = ctx.attr("then_branch"), ctx.attr("else_branch")
    known = _known_condition(ctx.value(0))
    if known is not None:
        return imp.convert_subgraph(then_g if known else else_g)
    if imp.dataflow:
        raise ctx.unsupported("internal: a data-dependent If inside a dataflow block")
    cond = ctx.expr(0)
    if ctx.rank(0) != 0:
        cond = ctx.emit(manipulate.reshape(cond, ()))

    def branch(graph: GraphProto) -> Expr:
        outs = [imp.materialize(v) for v in imp.convert_subgraph(graph)]
        return outs[0] if len(outs) == 1 else Tuple(tuple(outs))

    n = len(ctx.node.output)
    result = imp.bb.emit_if(cond, lambda: branch(then_g), lambda: branch(else_g))
    if n == 1:
        return ctx.refine(result)
    return [ctx.refine(ctx.emit(TupleGetItem(result, i))) for i in range(n)]
