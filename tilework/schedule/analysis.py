"""What a tensor program computes: op patterns and the shapes that schedule rules look for.

``op_pattern`` labels a ``TensorFunc`` for fusion (elementwise < broadcast < injective <
reduction < out-elementwise-fusable < opaque, the ``OpPattern`` order). ``classify`` names the
kind a schedule rule cares about (``FuncKind``): the same labels plus ``matmul`` and ``gemv``.
Both read only block structure: a block's single store, its iter vars and the indices of its
loads. Helpers that the primitives share (a block's store, its reducer) live here too.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from tilework.ir import sym
from tilework.ir.loop import (
    Binary,
    Block,
    Cast,
    Const,
    IterVar,
    IfThenElse,
    Load,
    Scalar,
    Store,
    TensorFunc,
    walk_scalars,
    walk_stmts,
)
from tilework.ir.sym import SymExpr, SymVar
from tilework.op.base import OpPattern
from tilework.schedule.tree import blocks_of, leaves, scalar_equal, scalar_vars

REDUCERS = ("+", "*", "max", "min")


class FuncKind(str, enum.Enum):
    ELEMWISE = "elementwise"
    BROADCAST = "broadcast"
    INJECTIVE = "injective"
    REDUCTION = "reduction"
    MATMUL = "matmul"
    GEMV = "gemv"
    OPAQUE = "opaque"


# -- block helpers ----------------------------------------------------------------------------


def block_stores(block: Block) -> list[Store]:
    """The stores of ``block`` (init and body)."""
    out: list[Store] = []
    for body in (block.init, block.body):
        if body is not None:
            out.extend(s for s in walk_stmts(body) if isinstance(s, Store))
    return out


def single_store(block: Block) -> Store | None:
    """The body of ``block`` when it is exactly one store (no conditions), else None."""
    return block.body if isinstance(block.body, Store) else None


def is_reduction(block: Block) -> bool:
    return any(iv.kind == "reduce" for iv in block.iter_vars)


def spatial_vars(block: Block) -> list[IterVar]:
    return [iv for iv in block.iter_vars if iv.kind == "spatial"]


def reduce_vars(block: Block) -> list[IterVar]:
    return [iv for iv in block.iter_vars if iv.kind == "reduce"]


@dataclass(frozen=True)
class Reducer:
    """``out[idx] = out[idx] <op> rhs``, only where ``cond`` holds when there is one: the
    update of a reduction block."""

    op: str
    store: Store
    rhs: Scalar
    cond: Scalar | None = None


def update_store(block: Block) -> tuple[Store, Scalar | None] | None:
    """The body of ``block`` as one store and the condition it runs under (None: always):
    the body is a store, or ``if cond: store``."""
    body = block.body
    if isinstance(body, Store):
        return body, None
    if isinstance(body, IfThenElse) and body.else_body is None and isinstance(body.then_body, Store):
        return body.then_body, body.cond
    return None


def reducer_of(block: Block) -> Reducer | None:
    """The reduction update of ``block``: one store (maybe under a condition that reads
    nothing it writes) combining the element it writes with a value by ``+``, ``*``, ``max``
    or ``min``."""
    up = update_store(block)
    if up is None:
        return None
    st, cond = up
    if not isinstance(st.value, Binary) or st.value.op not in REDUCERS:
        return None
    if cond is not None and _reads(cond, st.buffer):
        return None
    own = Load(st.buffer, st.indices)
    a, b = st.value.a, st.value.b
    if scalar_equal(a, own) and not _reads(b, st.buffer):
        return Reducer(st.value.op, st, b, cond)
    if scalar_equal(b, own) and not _reads(a, st.buffer):
        return Reducer(st.value.op, st, a, cond)
    return None


def _reads(x: Scalar, buf: object) -> bool:
    return any(isinstance(e, Load) and e.buffer is buf for e in walk_scalars(x))


def identity(op: str, dtype: str) -> Const:
    """The identity element of reducer ``op`` in ``dtype``."""
    floating = dtype.startswith(("float", "bfloat"))
    if op == "+":
        return Const(0.0 if floating else (False if dtype == "bool" else 0), dtype)
    if op == "*":
        return Const(1.0 if floating else (True if dtype == "bool" else 1), dtype)
    if floating:
        return Const(-math.inf if op == "max" else math.inf, dtype)
    if dtype == "bool":
        return Const(op == "min", dtype)
    info = np.iinfo(np.dtype(dtype))
    return Const(int(info.min) if op == "max" else int(info.max), dtype)


def loads_of(x: Scalar) -> list[Load]:
    return [e for e in walk_scalars(x) if isinstance(e, Load)]


def _plain_index(x: Scalar, ivs: set[SymVar]) -> bool:
    return isinstance(x, SymVar) and x in ivs


def _strip_cast(x: Scalar) -> Scalar:
    while isinstance(x, Cast):
        x = x.value
    return x


# -- op pattern ----------------------------------------------------------------------------


def block_pattern(block: Block) -> OpPattern:
    """The op pattern of one block (see ``op_pattern``)."""
    up = update_store(block) if is_reduction(block) else None
    st = up[0] if up is not None else single_store(block)
    if st is None:
        return OpPattern.OPAQUE
    ivs = {iv.var for iv in block.iter_vars}
    sp = [iv.var for iv in spatial_vars(block)]
    out_idx = st.indices
    if not all(_plain_index(x, set(sp)) for x in out_idx) or len({id(x) for x in out_idx}) != len(out_idx):
        return OpPattern.OPAQUE
    if set(out_idx) != set(sp):
        return OpPattern.OPAQUE
    if is_reduction(block):
        red = reducer_of(block)
        if red is None or block.init is None:
            return OpPattern.OPAQUE
        if matmul_parts(block) is not None:
            return OpPattern.OUT_EWISE_FUSABLE
        return OpPattern.REDUCTION
    loads = loads_of(st.value)
    if any(ld.buffer is st.buffer for ld in loads):
        return OpPattern.OPAQUE
    value_vars = scalar_vars(st.value)
    index_vars: set[SymVar] = set()
    for ld in loads:
        for x in ld.indices:
            index_vars |= scalar_vars(x)
    direct = (value_vars - index_vars) & ivs  # an iter var used as a value (iota-like)
    if direct:
        return OpPattern.INJECTIVE
    if all(len(ld.indices) == len(out_idx) and all(a is b for a, b in zip(ld.indices, out_idx)) for ld in loads):
        return OpPattern.ELEMWISE
    if all(_is_broadcast(ld.indices, out_idx) for ld in loads):
        return OpPattern.BROADCAST
    return OpPattern.INJECTIVE


def _is_broadcast(idx: tuple[Scalar, ...], out_idx: tuple[Scalar, ...]) -> bool:
    """``idx`` picks iter vars of the output in order, with constant 0 for size-1 dims."""
    pos = 0
    for x in idx:
        if isinstance(x, int) and not isinstance(x, bool) and x == 0:
            continue
        while pos < len(out_idx) and out_idx[pos] is not x:
            pos += 1
        if pos == len(out_idx):
            return False
        pos += 1
    return True


def op_pattern(func: TensorFunc) -> OpPattern:
    """The fusion label of ``func``: the highest pattern among its blocks; opaque when it
    has stores outside blocks or blocks with conditions or several stores."""
    ls = leaves(func.body)
    if not ls or any(not isinstance(c.leaf, Block) for c in ls):
        return OpPattern.OPAQUE
    pats = [block_pattern(c.leaf) for c in ls if isinstance(c.leaf, Block)]
    return max(pats)


# -- matmul and gemv -------------------------------------------------------------------------


@dataclass(frozen=True)
class MatmulParts:
    """A block ``out[b.., i.., j] += a[.., i.., k] * b[.., k, j]`` (any index order), or with
    ``b`` packed in column panels, ``b[.., j // panel, k, j % panel]``.

    ``j`` is the output's last dim (the column), which only ``b`` uses; ``i`` are the spatial
    iter vars only ``a`` uses (the rows: none, one or several); ``batch`` the others (both
    use them, or ``b`` alone: ``a`` is broadcast over them); ``k`` is the one reduction iter
    var.
    """

    block: Block
    a: Load
    b: Load
    batch: tuple[IterVar, ...]
    i: tuple[IterVar, ...]
    j: tuple[IterVar, ...]
    k: IterVar
    panel: int | None = None  # b packed in column panels: b[.., j // panel, k, j % panel]


def matmul_parts(block: Block) -> MatmulParts | None:
    """The matmul structure of ``block`` (a sum of products of two loads over one reduction
    iter var, each load indexed by plain iter vars), or None."""
    red = reducer_of(block)
    rv = reduce_vars(block)
    if red is None or red.op != "+" or red.cond is not None or len(rv) != 1 or block.init is None:
        return None
    rhs = _strip_cast(red.rhs)
    if not isinstance(rhs, Binary) or rhs.op != "*":
        return None
    a, b = _strip_cast(rhs.a), _strip_cast(rhs.b)
    if not isinstance(a, Load) or not isinstance(b, Load):
        return None
    k = rv[0]
    ivs = {iv.var: iv for iv in block.iter_vars}
    packed = {id(ld): _panel(ld, set(ivs)) for ld in (a, b)}
    idx = {id(ld): ld.indices if packed[id(ld)] is None else ld.indices[:-3] + (ld.indices[-2], packed[id(ld)][0]) for ld in (a, b)}  # type: ignore[index]
    for ld in (a, b):
        if not all(_plain_index(x, set(ivs)) or isinstance(x, int) for x in idx[id(ld)]):
            return None
        if sum(x is k.var for x in idx[id(ld)]) != 1:
            return None
    out_idx = set(red.store.indices)
    va = {x for x in idx[id(a)] if isinstance(x, SymVar)} - {k.var}
    vb = {x for x in idx[id(b)] if isinstance(x, SymVar)} - {k.var}
    if not (va | vb) <= out_idx:
        return None
    order = [iv for iv in block.iter_vars if iv.kind == "spatial"]
    if any(iv.var not in va | vb for iv in order):
        return None  # an output dim that neither operand uses
    # The column is the output's last (contiguous) dim; the operand it indexes goes right.
    col = red.store.indices[-1] if red.store.indices else None
    if col in va and col not in vb:
        a, b, va, vb = b, a, vb, va
    if col not in vb or col in va:
        return None
    panel = packed[id(b)]
    if packed[id(a)] is not None or (panel is not None and (panel[0] is not col or idx[id(b)][-2] is not k.var)):
        return None  # only the right operand may be packed, by the column, around k
    i = tuple(iv for iv in order if iv.var in va and iv.var not in vb)
    j = tuple(iv for iv in order if iv.var is col)
    batch = tuple(iv for iv in order if iv.var in vb and iv.var is not col)  # both, or b only
    return MatmulParts(block, a, b, batch, i, j, k, None if panel is None else panel[1])


def _panel(ld: Load, ivs: set[SymVar]) -> tuple[SymVar, int] | None:
    """``(j, c)`` when the last three indices of ``ld`` are ``j // c, <index>, j % c`` for an
    iter var ``j`` and a constant ``c > 1`` (a weight packed in column panels), else None."""
    if len(ld.indices) < 3:
        return None
    d, m = ld.indices[-3], ld.indices[-1]
    if not isinstance(d, sym.FloorDiv) or not isinstance(m, sym.FloorMod):
        return None
    if not (d.a is m.a and isinstance(d.a, SymVar) and d.a in ivs and isinstance(d.b, int) and d.b == m.b and d.b > 1):
        return None
    return d.a, d.b


def is_gemv(parts: MatmulParts) -> bool:
    """A matrix-vector product: the left operand has no free dims, or they all have extent 1."""
    return sym.prove_eq(sym.product(iv.extent for iv in parts.i), 1)


def main_block(func: TensorFunc) -> Block | None:
    """The one reduction block of ``func`` when there is exactly one, else None."""
    reds = [b for b in blocks_of(func) if is_reduction(b)]
    return reds[0] if len(reds) == 1 else None


def classify(func: TensorFunc) -> FuncKind:
    """The kind of computation ``func`` is, for choosing a schedule rule."""
    pat = op_pattern(func)
    if pat == OpPattern.OPAQUE:
        return FuncKind.OPAQUE
    if pat <= OpPattern.INJECTIVE:
        return {
            OpPattern.ELEMWISE: FuncKind.ELEMWISE,
            OpPattern.BROADCAST: FuncKind.BROADCAST,
            OpPattern.INJECTIVE: FuncKind.INJECTIVE,
        }[pat]
    mb = main_block(func)
    parts = None if mb is None else matmul_parts(mb)
    if parts is not None:
        return FuncKind.GEMV if is_gemv(parts) else FuncKind.MATMUL
    return FuncKind.REDUCTION


def is_bounds_guard(cond: Scalar, block: Block) -> IterVar | None:
    """The spatial iter var of ``block`` that ``cond`` keeps in range, when ``cond`` is
    ``binding < extent`` for it (the guard ``split`` adds), else None."""
    if not isinstance(cond, Binary) or cond.op != "<":
        return None
    e, n = cond.a, cond.b
    if not isinstance(e, (int, SymExpr)) or not isinstance(n, (int, SymExpr)):
        return None
    for iv in spatial_vars(block):
        if sym.prove_eq(iv.binding, e) and sym.prove_eq(iv.extent, n):
            return iv
    return None


__all__ = [
    "FuncKind",
    "MatmulParts",
    "Reducer",
    "block_pattern",
    "block_stores",
    "classify",
    "identity",
    "is_bounds_guard",
    "is_gemv",
    "main_block",
    "matmul_parts",
    "op_pattern",
    "reducer_of",
    "single_store",
    "update_store",
]
