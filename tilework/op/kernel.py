"""What op legalizations share: te placeholders for a call's arguments, symbolic broadcast
indexing, compute dtypes, the index maps of shape-changing copies, and the pieces of
hand-built kernels (loops, named blocks, the kernel with its fusion label) for ops that
``te`` cannot express well (attention's online softmax).

A legalization builds its kernel over the *caller's* dims (the same ``SymVar`` objects as the
call's struct info), so the kernel's sym vars are the caller's and the graph passes their
values straight through; a row count that no other dim shares may instead be the kernel's own
var (``own_rows``), bound to the caller's expression where the call is lowered. Where
inference left a fact to a run-time check (a ``DimCheck``), the kernel is written to be right
for every value the check allows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from tilework import te
from tilework.errors import UnsupportedError
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.graph import Attrs, Call, Expr, Tuple, TupleGetItem
from tilework.ir.info import StructInfo, TensorInfo, TupleInfo
from tilework.ir.loop import (
    Block,
    Buffer,
    For,
    Load,
    PExpr,
    Scalar,
    SeqStmt,
    Stmt,
    Store,
    TensorFunc,
    stmt_scalars,
    free_sym_vars,
    walk_scalars,
    walk_stmts,
)
from tilework.ir.dtype import compute_dtype
from tilework.ir.sym import Dim, SymVar

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

Index = tuple[Scalar, ...]


def op_name(call: Call) -> str:
    return getattr(call.callee, "name", "op")


def known_tensor(info: StructInfo, call: Call, what: str) -> tuple[tuple[Dim, ...], str]:
    """Shape and dtype of a tensor info that legalization needs to know exactly."""
    if not isinstance(info, TensorInfo) or info.shape is None or info.dtype is None:
        raise UnsupportedError(f"{op_name(call)}: cannot legalize: {what} has no known shape and dtype ({info})")
    return info.shape, info.dtype


def arg(call: Call, i: int, name: str) -> te.Tensor:
    """A placeholder for tensor argument ``i`` with the caller's shape and dtype."""
    shape, dtype = known_tensor(call.args[i].info, call, f"argument {i}")
    return te.placeholder(shape, dtype, name)


def own_rows(dim: Dim) -> Dim:
    """The kernel's own sym var ``rows`` for a row count ``dim`` that no other dim of the kernel
    depends on (a product's rows): its lower bound, no upper one. One kernel then serves every
    caller, whatever product of vars its rows are (an LLM's decode step has ``batch`` rows, its
    prefill ``batch * seq``: one kernel where two were built), and the schedule's cases of a
    fixed row count substitute a var (``schedule.rules.matmul``), which they cannot do for a
    product. Any other ``dim`` stays as it is: a static one, or one that tells the schedule
    more than a var would (``batch * 3136``, the pixels of a convolution's images: a multiple
    of 8, no partial tile of rows)."""
    if isinstance(dim, int) or not sym.prove_eq(dim, sym.product(sym_walk.free_vars(dim))):
        return dim
    lo = sym.bounds(dim)[0]
    return SymVar("rows", max(lo or 0, 0))


def out_tensor(call: Call) -> tuple[tuple[Dim, ...], str]:
    """The call's output shape and dtype (its inferred struct info)."""
    return known_tensor(call.info, call, "the result")


def tuple_fields(call: Call, i: int, ctx: "LegalizeCtx") -> list[Expr]:
    """The tensors of tuple argument ``i`` as graph values (a tuple var is taken apart)."""
    value = call.args[i]
    if isinstance(value, Tuple):
        return list(value.fields)
    info = value.info
    if not isinstance(info, TupleInfo):
        raise UnsupportedError(f"{op_name(call)}: cannot legalize: argument {i} is not a tuple of known size ({info})")
    return [ctx.bb.emit(TupleGetItem(value, k)) for k in range(len(info.fields))]


def upcast(x: Scalar, dtype: str) -> PExpr:
    """``x`` (of storage dtype ``dtype``) in its compute dtype."""
    return te.cast(x, compute_dtype(dtype))


# -- broadcasting ---------------------------------------------------------------------------


def bcast_dim_index(i: Scalar, d: Dim, o: Dim) -> Scalar:
    """The index into an operand dim ``d`` for output index ``i`` along output dim ``o``,
    where ``d`` is 1 or equal to ``o`` (statically, or by a run-time check). When neither is
    provable, ``min(i, d - 1)`` is right for both cases (0 when ``d`` is 1, ``i`` when ``d`` is
    ``o``) and stays a symbolic index."""
    if d is o or sym.prove_eq(d, o):
        return i
    if isinstance(d, int) and d == 1:
        return 0
    if isinstance(i, (int, sym.SymExpr)):
        return sym.min_(i, sym.sub(d, 1))
    return te.minimum(i, sym.sub(d, 1))


def bcast_index(idx: Sequence[Scalar], shape: Sequence[Dim], out_shape: Sequence[Dim]) -> Index:
    """The index into an operand of ``shape`` broadcast (right-aligned) to ``out_shape``."""
    lead = len(out_shape) - len(shape)
    return tuple(bcast_dim_index(idx[lead + k], d, out_shape[lead + k]) for k, d in enumerate(shape))


# -- copies that change the shape -----------------------------------------------------------


def _same(a: Dim, b: Dim) -> bool:
    return a is b or sym.prove_eq(a, b)


def reshape_index(idx: Sequence[Scalar], out_shape: Sequence[Dim], in_shape: Sequence[Dim]) -> Index:
    """The input index holding the element at ``idx`` of a row-major reshape to ``out_shape``.

    Leading and trailing dims the two shapes share map one to one; only the middle goes
    through a flat offset, so ``(b, s, 768) -> (b, s, 12, 64)`` indexes ``i2 * 64 + i3``.
    """
    lo = 0
    while lo < min(len(out_shape), len(in_shape)) and _same(out_shape[lo], in_shape[lo]):
        lo += 1
    hi = 0
    while hi < min(len(out_shape), len(in_shape)) - lo and _same(out_shape[-1 - hi], in_shape[-1 - hi]):
        hi += 1
    mid_out = list(range(lo, len(out_shape) - hi))
    mid_in = list(range(lo, len(in_shape) - hi))
    flat: Scalar = 0
    for k in mid_out:
        flat = flat * out_shape[k] + idx[k]
    inner: list[Scalar] = []
    stride: Dim = 1
    for pos, k in enumerate(reversed(mid_in)):
        q = flat if pos == 0 else flat // stride
        inner.append(q if pos == len(mid_in) - 1 else q % in_shape[k])
        stride = sym.mul(stride, in_shape[k])
    inner.reverse()
    tail = [idx[len(out_shape) - hi + k] for k in range(hi)]
    return tuple(idx[:lo]) + tuple(inner) + tuple(tail)


# -- hand-built loop nests -------------------------------------------------------------------


def serial_var(name: str, extent: Dim) -> SymVar:
    """A loop var over ``[0, extent)`` (bounded above when the extent's bound is known)."""
    hi = sym.bounds(extent)[1]
    return SymVar(name, 0, hi - 1 if hi is not None and hi >= 1 else None)


def named_loop(names: set[str], name: str, extent: Dim, body: Callable[[SymVar], Stmt], kind: str = "serial") -> For:
    """A loop of ``kind`` over ``body(var)`` whose var is named ``name`` (or ``name_<k>``) unique
    among ``names``, which it joins: a hand-built kernel's names survive printing."""
    base, k = name, 0
    while name in names:
        k += 1
        name = f"{base}_{k}"
    names.add(name)
    var = serial_var(name, extent)
    return For(var, extent, body(var), kind)


def block(name: str, body: Stmt) -> Block:
    """A block named ``name`` without iter vars around ``body``, its reads and writes listed:
    the unit a hand-built kernel names its steps by (fusion inlines producers into its loads)."""
    reads: dict[Buffer, None] = {}
    writes: dict[Buffer, None] = {}
    for st in walk_stmts(body):
        if isinstance(st, Store):
            writes[st.buffer] = None
        for x in stmt_scalars(st):
            for e in walk_scalars(x):
                if isinstance(e, Load):
                    reads[e.buffer] = None
    return Block(name, (), tuple(reads), tuple(writes), body)


def seq(stmts: Sequence[Stmt]) -> Stmt:
    """``stmts`` in order as one statement (nested sequences flattened)."""
    flat: list[Stmt] = []
    for st in stmts:
        flat.extend(st.stmts if isinstance(st, SeqStmt) else (st,))
    return flat[0] if len(flat) == 1 else SeqStmt(tuple(flat))


def hand_kernel(params: Sequence[Buffer | SymVar], body: Stmt, pattern: str) -> TensorFunc:
    """A hand-built TensorFunc (outputs: the last buffer) whose blocks the op-pattern
    analysis cannot label; ``pattern`` is the label fusion should use."""
    return TensorFunc(tuple(params), body, 1, Attrs({"op_pattern": pattern}))


def free_syms(body: Stmt, buffers: Sequence[Buffer]) -> list[SymVar]:
    """The sym vars ``body`` and the buffer shapes use that the body does not bind and no
    buffer has as a bare dim: the extra sym params of a hand-built kernel."""
    supplied = {d for b in buffers for d in b.shape if isinstance(d, SymVar)}
    return [v for v in free_sym_vars(body, buffers) if v not in supplied]


__all__ = [
    "Index",
    "block",
    "named_loop",
    "free_syms",
    "hand_kernel",
    "seq",
    "serial_var",
    "op_name",
    "known_tensor",
    "arg",
    "out_tensor",
    "tuple_fields",
    "compute_dtype",
    "upcast",
    "bcast_dim_index",
    "bcast_index",
    "reshape_index",
]
