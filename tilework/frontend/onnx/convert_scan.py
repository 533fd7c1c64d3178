"""The ``Scan`` converter: the scan is unrolled at conversion time.

Like ``Loop`` (``convert_control``), the body graph is converted once per step through
``Importer.convert_subgraph``, the state variables threaded from one step to the next. Step
``t`` sees element ``t`` of each scan input (counted from the end for a reverse input); each
scan output stacks the body's per-step values along its output axis (prepended, for a reverse
output). The scan length must be known at conversion time: a symbolic one is refused, naming
the dim.

Schema version 8 carries a leading batch axis on every state and scan input and an optional
``sequence_lens``; each batch row is scanned on its own (without ``sequence_lens``, or with
one equal to the full length) and the results are stacked back along the batch axis.
"""

from __future__ import annotations

from typing import Sequence

from onnx import GraphProto

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_control import MAX_UNROLL
from tilework.frontend.onnx.registry import Result, converter
from tilework.frontend.onnx.values import Value
from tilework.ir.graph import Expr
from tilework.op import manipulate


def _flags(ctx: NodeCtx, name: str, count: int) -> tuple[int, ...]:
    """Attribute ``name`` (one int per scan input or output), 0 where it is omitted."""
    given = tuple(int(v) for v in ctx.attr(name, ()))
    if len(given) > count:
        raise ctx.unsupported(f"attribute {name!r} has {len(given)} entries for {count} scan value(s)")
    return given + (0,) * (count - len(given))


def _axis(ctx: NodeCtx, axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        raise ctx.unsupported(f"{what}: axis {axis} is out of range for rank {rank}")
    return axis % rank


def _element(ctx: NodeCtx, x: Expr, axis: int, i: int) -> Expr:
    """``x`` indexed at ``i`` along ``axis`` (that axis removed)."""
    part = ctx.emit(manipulate.strided_slice(x, (axis,), (i,), (i + 1,)))
    return ctx.emit(manipulate.squeeze(part, axis))


def _scan(ctx: NodeCtx, body: GraphProto, states: list[Value], xs: list[Expr], names: Sequence[str]) -> list[Value]:
    """One scan of ``xs`` (no batch axis) from ``states``: the final states, then the scan
    outputs."""
    m = len(xs)
    in_axes = _flags(ctx, "scan_input_axes", m) if ctx.version >= 9 else (0,) * m
    in_dirs = _flags(ctx, "scan_input_directions" if ctx.version >= 9 else "directions", m)
    axes = [_axis(ctx, a, len(ctx.shape_of(x)), f"scan input {names[i]!r}") for i, (x, a) in enumerate(zip(xs, in_axes))]
    length = ctx.shape_of(xs[0])[axes[0]]
    if not isinstance(length, int):
        raise ctx.unsupported(
            f"the scan length (dim {axes[0]} of scan input {names[0]!r}) is the symbolic dim {length}: "
            "Scan is unrolled and needs its length known at conversion time"
        )
    for i, (x, a) in enumerate(zip(xs, axes)):
        other = ctx.shape_of(x)[a]
        if other != length:
            raise ctx.unsupported(f"scan input {names[i]!r} has length {other} along axis {a}, the first has {length}")
    if length > MAX_UNROLL:
        raise ctx.unsupported(f"a scan length of {length} (at most {MAX_UNROLL} steps are unrolled)")
    n_out = len(body.output) - len(states)
    if n_out < 0:
        raise ctx.unsupported(f"the body has {len(body.output)} output(s) for {len(states)} state variable(s)")
    if n_out and length == 0:
        raise ctx.unsupported("scan outputs of a scan of length 0")
    steps: list[list[Expr]] = [[] for _ in range(n_out)]
    for t in range(length):
        elems = [Value.of_expr(_element(ctx, x, a, length - 1 - t if d else t)) for x, a, d in zip(xs, axes, in_dirs)]
        outs = ctx.imp.convert_subgraph(body, [*states, *elems], ctx)
        states = outs[: len(states)]
        for k, v in enumerate(outs[len(states) :]):
            steps[k].append(ctx.imp.materialize(v))
    out_axes = _flags(ctx, "scan_output_axes", n_out) if ctx.version >= 9 else (0,) * n_out
    out_dirs = _flags(ctx, "scan_output_directions", n_out) if ctx.version >= 9 else (0,) * n_out
    stacked: list[Value] = []
    for k, parts in enumerate(steps):
        axis = _axis(ctx, out_axes[k], len(ctx.shape_of(parts[0])) + 1, f"scan output {k}")
        parts = [ctx.emit(manipulate.expand_dims(p, axis)) for p in (reversed(parts) if out_dirs[k] else parts)]
        stacked.append(Value.of_expr(parts[0] if len(parts) == 1 else ctx.emit(manipulate.concat(parts, axis))))
    return [*states, *stacked]


@converter("Scan", 9, 25)
def _scan9(ctx: NodeCtx) -> Result:
    body: GraphProto = ctx.attr("body")
    m = int(ctx.attr("num_scan_inputs"))
    n = ctx.num_inputs - m
    if m <= 0 or n < 0:
        raise ctx.unsupported(f"num_scan_inputs={m} with {ctx.num_inputs} operand(s)")
    states = [ctx.value(i) for i in range(n)]
    xs = [ctx.expr(i) for i in range(n, ctx.num_inputs)]
    return _scan(ctx, body, states, xs, ctx.node.input[n:])


@converter("Scan", 8, 8)
def _scan8(ctx: NodeCtx) -> Result:
    body: GraphProto = ctx.attr("body")
    m = int(ctx.attr("num_scan_inputs"))
    n = ctx.num_inputs - 1 - m
    if m <= 0 or n < 0:
        raise ctx.unsupported(f"num_scan_inputs={m} with {ctx.num_inputs} operand(s)")
    operands = [ctx.expr(i) for i in range(1, ctx.num_inputs)]
    batch = ctx.shape_of(operands[0])[0]
    if not isinstance(batch, int):
        raise ctx.unsupported(f"the batch size (dim 0 of {ctx.node.input[1]!r}) is the symbolic dim {batch}: Scan-8 is unrolled per batch row")
    if ctx.has_input(0):
        full = ctx.shape_of(operands[n])[1]
        lens = ctx.const(0)
        if lens is None or not all(int(v) == full for v in lens.reshape(-1)):
            raise ctx.unsupported("sequence_lens other than the full length of every sequence")
    rows: list[list[Value]] = []
    for b in range(batch):
        row = [_element(ctx, e, 0, b) for e in operands]
        rows.append(_scan(ctx, body, [Value.of_expr(e) for e in row[:n]], row[n:], ctx.node.input[1 + n :]))
    results: list[Expr] = []
    for k in range(len(rows[0]) if rows else 0):
        parts = [ctx.emit(manipulate.expand_dims(ctx.imp.materialize(r[k]), 0)) for r in rows]
        results.append(parts[0] if len(parts) == 1 else ctx.emit(manipulate.concat(parts, 0)))
    return results
