"""Converters of ONNX sequences and optionals: ``SequenceConstruct``, ``SequenceEmpty``,
``SequenceInsert``, ``SequenceErase``, ``SequenceAt``, ``SequenceLength``, ``SplitToSequence``,
``ConcatFromSequence``, ``SequenceMap``, ``Optional``, ``OptionalHasElement`` and
``OptionalGetElement``.

A sequence is a ``SeqValue``: its tensors, whose number and order are fixed at conversion time;
an optional is an ``OptValue`` whose element is present or not at conversion time (see
``values``). So these ops emit no bindings of their own, except the tensor ops that split and
join: positions must be known at conversion time (static operands), ``SequenceLength`` is a
constant, ``SequenceMap`` converts its body once per element. An op whose result's layout would
depend on run-time data (a position computed at run time, a split into a run-time number of
pieces) is refused with an error that names it.
"""

from __future__ import annotations

import numpy as np
from onnx import GraphProto

from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.convert_shape import norm_axis, split_at
from tilework.frontend.onnx.registry import Result, converter
from tilework.frontend.onnx.values import AnyValue, OptValue, SeqValue, Value, dtype_name, kind_of, static_ints
from tilework.ir.sym import Dim
from tilework.op import manipulate


def _position(ctx: NodeCtx, i: int, n: int, at_end: bool) -> int:
    """Operand ``i``, a position in a sequence of ``n`` tensors: ``-n .. n - 1`` (``n`` too when
    ``at_end``: inserting after the last), as an index from the front."""
    v = ctx.value(i)
    if v.const is None:
        raise ctx.unsupported(f"the position (operand {i}, {ctx.node.input[i]!r}) is known only at run time; a sequence's layout is fixed at conversion time, so it must be a constant")
    if v.const.size != 1:
        raise ctx.unsupported(f"the position must hold one value, got shape {list(v.const.shape)}")
    p = int(v.const.reshape(()))
    hi = n if at_end else n - 1
    if not -n <= p <= hi:
        raise ctx.unsupported(f"position {p} is out of range [{-n}, {hi}] for a sequence of {n} tensor(s)")
    return p + n if p < 0 else p


@converter("SequenceConstruct", 11, 11)
def _sequence_construct(ctx: NodeCtx) -> Result:
    items = tuple(ctx.value(i) for i in range(ctx.num_inputs))
    return SeqValue(items, items[0].dtype if items else None)


@converter("SequenceEmpty", 11, 11)
def _sequence_empty(ctx: NodeCtx) -> Result:
    return SeqValue((), ctx.dtype_attr("dtype", 1))  # default: float


@converter("SequenceInsert", 11, 11, static_inputs=(2,))
def _sequence_insert(ctx: NodeCtx) -> Result:
    s, t = ctx.seq(0), ctx.value(1)
    if s.dtype is not None and t.dtype is not None and s.dtype != t.dtype:
        raise ctx.unsupported(f"inserting a {t.dtype} tensor into a sequence of {s.dtype} tensors")
    n = len(s.items)
    p = _position(ctx, 2, n, at_end=True) if ctx.has_input(2) else n
    return SeqValue(s.items[:p] + (t,) + s.items[p:], s.dtype or t.dtype)


@converter("SequenceErase", 11, 11, static_inputs=(1,))
def _sequence_erase(ctx: NodeCtx) -> Result:
    s = ctx.seq(0)
    n = len(s.items)
    if n == 0:
        raise ctx.unsupported("erasing from an empty sequence")
    p = _position(ctx, 1, n, at_end=False) if ctx.has_input(1) else n - 1
    return SeqValue(s.items[:p] + s.items[p + 1 :], s.dtype)


@converter("SequenceAt", 11, 11, static_inputs=(1,))
def _sequence_at(ctx: NodeCtx) -> Result:
    s = ctx.seq(0)
    return s.items[_position(ctx, 1, len(s.items), at_end=False)]


@converter("SequenceLength", 11, 11)
def _sequence_length(ctx: NodeCtx) -> Result:
    return Value.of_const(np.asarray(len(ctx.seq(0).items), np.int64))


@converter("SplitToSequence", 11, 24, static_inputs=(1,))
def _split_to_sequence(ctx: NodeCtx) -> Result:
    shape = ctx.known_shape(0)
    axis = norm_axis(ctx, int(ctx.attr("axis", 0)), len(shape))
    d = shape[axis]
    keepdims = bool(ctx.attr("keepdims", 1))
    sizes: tuple[Dim, ...]
    if ctx.has_input(1) and ctx.rank(1) == 1:
        sizes = ctx.dims(1, "split")
    else:
        chunk = ctx.scalar(1, "split") if ctx.has_input(1) else 1
        if not isinstance(d, int) or not isinstance(chunk, int):
            raise ctx.unsupported(f"the number of pieces (axis {axis} of size {d} in chunks of {chunk}) is known only at run time; a sequence's length is fixed at conversion time")
        if chunk <= 0:
            raise ctx.unsupported(f"split must be positive, got {chunk}")
        sizes = tuple(min(chunk, d - k) for k in range(0, d, chunk))
    known = static_ints(sizes)
    if isinstance(d, int) and known is not None and sum(known) != d:
        raise ctx.unsupported(f"the split sizes {list(sizes)} do not add up to axis {axis} of size {d}")
    if not sizes:
        return SeqValue((), ctx.dtype(0))
    x = ctx.expr(0)
    squeeze = not keepdims and not ctx.has_input(1)
    pieces = split_at(ctx, x, sizes, axis)
    if squeeze:
        pieces = [ctx.emit(manipulate.squeeze(p, [axis])) for p in pieces]
    return SeqValue(tuple(Value.of_expr(p) for p in pieces), ctx.dtype(0))


@converter("ConcatFromSequence", 11, 11)
def _concat_from_sequence(ctx: NodeCtx) -> Result:
    s = ctx.seq(0)
    if not s.items:
        raise ctx.unsupported("concatenating an empty sequence (its result's shape is not defined)")
    new_axis = bool(ctx.attr("new_axis", 0))
    shape = s.items[0].info.shape
    if shape is None:
        raise ctx.unsupported("the rank of the sequence's tensors is not known")
    rank = len(shape)
    axis = norm_axis(ctx, int(ctx.attr("axis")), rank + 1 if new_axis else rank)
    parts = [ctx.imp.materialize(v) for v in s.items]
    if new_axis:
        parts = [ctx.emit(manipulate.expand_dims(p, axis)) for p in parts]
    return parts[0] if len(parts) == 1 else ctx.emit(manipulate.concat(parts, axis))


@converter("SequenceMap", 17, 17)
def _sequence_map(ctx: NodeCtx) -> Result:
    """The body converted once per element of the input sequence: a sequence operand gives its
    element at that position, a tensor operand itself."""
    body: GraphProto = ctx.attr("body")
    operands = [ctx.any_value(i) for i in range(ctx.num_inputs)]
    n = len(ctx.seq(0).items)
    for i, v in enumerate(operands):
        if isinstance(v, OptValue) or isinstance(v, SeqValue) and len(v.items) != n:
            raise ctx.unsupported(f"operand {i} is {kind_of(v)}; SequenceMap takes sequences of the first one's length ({n}) and tensors")
    results: list[list[Value]] = [[] for _ in body.output]
    for k in range(n):
        inputs: list[AnyValue] = [v.items[k] if isinstance(v, SeqValue) else v for v in operands]
        for j, out in enumerate(ctx.imp.convert_subgraph(body, inputs, ctx)):
            results[j].append(out)
    dtypes = [dtype_name(o.type.tensor_type.elem_type) if o.type.HasField("tensor_type") else None for o in body.output]
    return [SeqValue(tuple(items), items[0].dtype if items else dt) for items, dt in zip(results, dtypes)]


# -- optionals ------------------------------------------------------------------------------------


@converter("Optional", 15, 28)
def _optional(ctx: NodeCtx) -> Result:
    if not ctx.has_input(0):
        return OptValue(None)
    v = ctx.any_value(0)
    if isinstance(v, OptValue):
        raise ctx.unsupported("an optional of an optional")
    return OptValue(v)


@converter("OptionalHasElement", 15, 28)
def _optional_has_element(ctx: NodeCtx) -> Result:
    if not ctx.has_input(0):  # from version 18 the input may be left out: an empty optional
        if ctx.version < 18:
            raise ctx.unsupported("operand 0 is required")
        has = False
    else:
        v = ctx.any_value(0)
        if not isinstance(v, OptValue) and ctx.version < 18:
            raise ctx.unsupported(f"operand 0 must be an optional, got {kind_of(v)}")
        has = not isinstance(v, OptValue) or v.elem is not None
    return Value.of_const(np.asarray(has))


@converter("OptionalGetElement", 15, 28)
def _optional_get_element(ctx: NodeCtx) -> Result:
    v = ctx.any_value(0)
    if not isinstance(v, OptValue):
        if ctx.version < 18:
            raise ctx.unsupported(f"operand 0 must be an optional, got {kind_of(v)}")
        return v  # from version 18 a tensor or a sequence is its own element
    if v.elem is None:
        raise ctx.unsupported("the optional is empty (known at conversion time): it has no element to get")
    return v.elem


__all__: list[str] = []
