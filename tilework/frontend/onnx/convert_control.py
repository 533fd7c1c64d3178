"""The ``If`` and ``Loop`` converters.

A condition known at conversion time (a constant, or a comparison of dims that the importer
could prove) selects its branch, which is inlined. Otherwise both branches are converted into
an ``If`` expression; each result whose shape differs between the branches is bound to fresh
sym vars by a ``match_cast`` after it. Sequences and optionals pass through either form; with a
run-time condition both branches must give them the same layout (as many tensors, an optional's
element present in both or in neither), which the ``If`` carries as tuples.
"""

from __future__ import annotations

import numpy as np
from onnx import GraphProto

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.registry import Result, converter
from tilework.frontend.onnx.values import AnyValue, Value, kind_of, layout_of
from tilework.ir.graph import Expr, Tuple, TupleGetItem
from tilework.op import manipulate


def _known_condition(v: AnyValue) -> bool | None:
    if not isinstance(v, Value):
        return None
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
        return imp.convert_subgraph_any(then_g if known else else_g)
    if imp.dataflow:
        raise ctx.unsupported("internal: a data-dependent If inside a dataflow block")
    cond = ctx.expr(0)
    if ctx.rank(0) != 0:
        cond = ctx.emit(manipulate.reshape(cond, ()))

    given: list[list[AnyValue]] = []  # each branch's results

    def branch(graph: GraphProto) -> Expr:
        values = imp.convert_subgraph_any(graph)
        given.append(values)
        if len(given) == 2:
            for i, (a, b) in enumerate(zip(*given)):
                if layout_of(a) != layout_of(b):
                    raise ctx.unsupported(f"output {i}: the then branch gives {kind_of(a)}, the else branch {kind_of(b)}; with a condition known only at run time both must give the same")
        outs = [imp.carry(v) for v in values]
        return outs[0] if len(outs) == 1 else Tuple(tuple(outs))

    n = len(ctx.node.output)
    result = imp.bb.emit_if(cond, lambda: branch(then_g), lambda: branch(else_g))
    hint = ctx.op_type.lower()
    if n == 1:
        return imp.unpack(result, given[0][0], hint)
    return [imp.unpack(ctx.emit(TupleGetItem(result, i)), given[0][i], hint) for i in range(n)]


MAX_UNROLL = 256  # iterations a Loop with a trip count known at conversion time is unrolled to


def _run_body(ctx: NodeCtx, body: GraphProto, inputs: list[AnyValue]) -> list[AnyValue]:
    """The body graph converted once with its inputs bound to ``inputs`` (a nested scope)."""
    return ctx.imp.convert_subgraph_any(body, inputs, ctx)


@converter("Loop", 1, 25, static_inputs=(0, 1))
def _loop(ctx: NodeCtx) -> Result:
    """A ``Loop`` whose trip count (and condition, when given) is known at conversion time is
    unrolled: the body is converted once per iteration, the loop-carried values threaded
    through, and each scan output stacked along a new first axis. A loop that runs on a
    condition computed at run time is refused."""
    body: GraphProto = ctx.attr("body")
    trips = ctx.ints(0, "the trip count M")[0] if ctx.has_input(0) else None
    cond = _known_condition(ctx.value(1)) if ctx.has_input(1) else True
    if cond is None:
        raise ctx.unsupported("a loop condition computed at run time")
    if trips is None or trips > MAX_UNROLL:
        raise ctx.unsupported(f"a trip count that is unknown at conversion time or above {MAX_UNROLL} (got {trips})")
    carried = [ctx.any_value(i) for i in range(2, ctx.num_inputs)]
    n_scan = len(body.output) - 1 - len(carried)
    scans: list[list[Expr]] = [[] for _ in range(n_scan)]
    i = 0
    while cond and i < trips:
        outs = _run_body(ctx, body, [Value.of_const(np.asarray(i, np.int64)), Value.of_const(np.asarray(True)), *carried])
        cond = _known_condition(outs[0])
        if cond is None:
            raise ctx.unsupported("a loop condition computed at run time")
        carried = outs[1 : 1 + len(carried)]
        for k, v in enumerate(outs[1 + len(carried) :]):
            if not isinstance(v, Value):
                raise ctx.unsupported(f"scan output {k} is {kind_of(v)}; scan outputs must be tensors")
            scans[k].append(ctx.emit(manipulate.expand_dims(ctx.imp.materialize(v), 0)))
        i += 1
    if n_scan and i == 0:
        raise ctx.unsupported("scan outputs of a loop that runs no iteration")
    stacked = [parts[0] if len(parts) == 1 else ctx.emit(manipulate.concat(parts, 0)) for parts in scans]
    return [*carried, *stacked]
