"""Block primitives: compute_inline, reverse_compute_inline and cache_read.

Each is a pure function ``TensorFunc -> TensorFunc`` that addresses blocks by name and
refuses, with a ``ScheduleError`` naming the block and the reason, any rewrite it cannot
prove keeps the program's meaning. Blocks, loops and buffers they create get fresh names
derived from the old ones, given in each docstring.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from tilework.errors import ScheduleError
from tilework.ir import sym
from tilework.ir.loop import (
    Allocate,
    Block,
    Buffer,
    For,
    IfThenElse,
    IterVar,
    Load,
    PExpr,
    Scalar,
    Stmt,
    Store,
    TensorFunc,
    walk_stmts,
)
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.schedule.analysis import (
    block_stores,
    is_bounds_guard,
    is_reduction,
    loads_of,
    single_store,
)
from tilework.schedule.tree import (
    LeafCtx,
    block_ctx,
    conjuncts,
    dim_vars,
    fresh_name,
    get_at,
    leaves,
    map_dims,
    map_scalars,
    map_stmt_scalars,
    new_loop_var,
    remove_at,
    replace_at,
    scalar_equal,
    scalar_vars,
    seq,
    subst_dim,
    subst_scalar,
    used_names,
    walk,
)

# -- shared helpers ---------------------------------------------------------------------------


def _writes(ctx: LeafCtx) -> set[Buffer]:
    leaf = ctx.leaf
    if isinstance(leaf, Store):
        return {leaf.buffer}
    assert isinstance(leaf, Block)
    return {s.buffer for s in block_stores(leaf)}


def _reads(ctx: LeafCtx) -> set[Buffer]:
    leaf = ctx.leaf
    xs: list[Scalar] = list(ctx.guards)
    if isinstance(leaf, Store):
        xs.extend((*leaf.indices, leaf.value))
    else:
        assert isinstance(leaf, Block)
        for s in block_stores(leaf):
            xs.extend((*s.indices, s.value))
        xs.extend(_block_conds(leaf))
    return {ld.buffer for x in xs for ld in loads_of(x)}


def _block_conds(block: Block) -> list[Scalar]:
    out: list[Scalar] = []
    for body in (block.init, block.body):
        if body is not None:
            out.extend(s.cond for s in walk_stmts(body) if isinstance(s, IfThenElse))
    return out


def _drop_alloc_if_unused(body: Stmt, buf: Buffer) -> Stmt:
    """``body`` without the ``Allocate`` of ``buf`` when nothing accesses ``buf`` any more."""
    for c in leaves(body):
        if buf in _writes(c) or buf in _reads(c):
            return body
    for p, s in walk(body):
        if isinstance(s, Allocate) and s.buffer is buf:
            return replace_at(body, p, s.body)
    return body


def _is_param(func: TensorFunc, buf: Buffer) -> bool:
    return any(p is buf for p in func.params)


def _subst_any(x: Scalar, m: Mapping[SymVar, Scalar], what: str) -> Scalar:
    """``x`` with vars replaced by scalars that may be data-dependent expressions; a var mapped
    to such an expression may only appear as a whole index or operand, not inside arithmetic
    on dims."""
    dims = {v: e for v, e in m.items() if isinstance(e, (int, SymExpr))}
    exprs = {v: e for v, e in m.items() if not isinstance(e, (int, SymExpr))}

    def fix(e: Dim) -> Scalar:
        if isinstance(e, SymVar) and e in exprs:
            return exprs[e]
        if dim_vars(e) & set(exprs):
            raise ScheduleError(f"{what}: an index computed from data is used inside index arithmetic")
        return subst_dim(e, dims)

    return map_dims(x, fix)


def _block_reads(old: tuple[Buffer, ...], drop: Buffer | None, add: Sequence[Buffer]) -> tuple[Buffer, ...]:
    out: dict[Buffer, None] = {b: None for b in old if b is not drop}
    for b in add:
        if b is not drop:
            out[b] = None
    return tuple(out)


def _producer_store(func: TensorFunc, ctx: LeafCtx, what: str) -> Store:
    """The store of an inlinable producer block: one store at its distinct spatial iter vars."""
    block = ctx.leaf
    assert isinstance(block, Block)
    if is_reduction(block) or block.init is not None:
        raise ScheduleError(f"{what}: block {block.name!r} is a reduction; only a block without reduction iter vars can be inlined")
    st = single_store(block)
    if st is None:
        n = len(block_stores(block))
        raise ScheduleError(f"{what}: block {block.name!r} must be exactly one store, it has {n} store(s) or a condition")
    ivs = [iv.var for iv in block.iter_vars]
    if len(st.indices) != len(ivs) or {id(x) for x in st.indices} != {id(v) for v in ivs}:
        raise ScheduleError(
            f"{what}: block {block.name!r} writes {st.buffer.name!r} at indices that are not exactly its iter vars"
        )
    if any(ld.buffer is st.buffer for ld in loads_of(st.value)):
        raise ScheduleError(f"{what}: block {block.name!r} reads the buffer {st.buffer.name!r} it writes")
    if _is_param(func, st.buffer):
        raise ScheduleError(f"{what}: block {block.name!r} writes {st.buffer.name!r}, an output of the function")
    return st


def _only_own_vars(func: TensorFunc, block: Block, st: Store, what: str) -> None:
    """Refuse a store that uses loop vars directly: moved elsewhere, they would be out of scope."""
    allowed = {iv.var for iv in block.iter_vars} | set(func.sym_params)
    for b in func.buffers:
        for d in b.shape:
            allowed |= dim_vars(d)
    stray = (scalar_vars(st.value) | set().union(*(scalar_vars(i) for i in st.indices))) - allowed
    if stray:
        names = sorted(v.name for v in stray)
        raise ScheduleError(f"{what}: block {block.name!r} uses loop var {names[0]!r} directly, not through an iter var")


# -- compute_inline -------------------------------------------------------------------------------


def compute_inline(func: TensorFunc, block: str) -> TensorFunc:
    """Inline producer ``block`` into its consumers: every load of the buffer it writes is
    replaced by the value it stores, and the block (with loops left empty) is removed, and the
    buffer's allocation too.

    Requires: the block is not a reduction, is one store ``T[iter vars] = value`` to a scratch
    buffer ``T`` that no other block writes, every reader of ``T`` comes after it, and no buffer
    it reads is written between it and its last reader.
    """
    what = "compute_inline"
    ctx = block_ctx(func, block, what)
    st = _producer_store(func, ctx, what)
    assert isinstance(ctx.leaf, Block)
    _only_own_vars(func, ctx.leaf, st, what)  # its value moves into other loops
    t = st.buffer
    ls = leaves(func.body)
    me = next(i for i, c in enumerate(ls) if c.path == ctx.path)
    others = [i for i, c in enumerate(ls) if i != me and t in _writes(c)]
    if others:
        raise ScheduleError(f"{what}: buffer {t.name!r} of block {block!r} is also written by {_name(ls[others[0]])}")
    readers = [i for i, c in enumerate(ls) if t in _reads(c)]
    if any(i < me for i in readers):
        raise ScheduleError(f"{what}: {_name(ls[min(readers)])} reads {t.name!r} before block {block!r} writes it")
    srcs = list(dict.fromkeys(ld.buffer for ld in loads_of(st.value)))
    last = max(readers, default=me)
    for i in range(me + 1, last + 1):
        clash = set(srcs) & _writes(ls[i])
        if clash:
            raise ScheduleError(
                f"{what}: {_name(ls[i])} writes {sorted(b.name for b in clash)[0]!r}, which block "
                f"{block!r} reads, before the last use of {t.name!r}"
            )
    assert isinstance(ctx.leaf, Block)
    ivs = [iv.var for iv in ctx.leaf.iter_vars]
    pos = {x: d for d, x in enumerate(st.indices)}

    def inline(n: PExpr) -> Scalar | None:
        if isinstance(n, Load) and n.buffer is t:
            m = {v: n.indices[pos[v]] for v in ivs}
            return _subst_any(st.value, m, what)
        return None

    body = remove_at(func.body, ctx.path)
    body = map_stmt_scalars(body, inline)
    body = _fix_reads(body, t, srcs)
    return func.replace(body=_drop_alloc_if_unused(body, t))


def _fix_reads(body: Stmt, old: Buffer, new: Sequence[Buffer]) -> Stmt:
    """Blocks listing ``old`` among their reads read ``new`` instead."""
    for p, s in walk(body):
        if isinstance(s, Block) and old in s.reads:
            nb = Block(s.name, s.iter_vars, _block_reads(s.reads, old, new), s.writes, s.body, s.init)
            body = replace_at(body, p, nb)
    return body


def _name(ctx: LeafCtx) -> str:
    return f"block {ctx.leaf.name!r}" if isinstance(ctx.leaf, Block) else "a store outside blocks"


# -- reverse_compute_inline -----------------------------------------------------------------------


def reverse_compute_inline(func: TensorFunc, block: str) -> TensorFunc:
    """Inline elementwise consumer ``block`` into the block that produces its input: the
    producer stores the consumer's result straight into the consumer's output, and the
    consumer (and the intermediate buffer) go away.

    Requires: the consumer is one store, not a reduction, reading the producer's buffer ``T``
    at one index that is a permutation of all its iter vars over the same extents; the
    producer is not a reduction (the consumer would see partial sums), is one store to ``T``,
    and is ``T``'s only writer; the consumer is ``T``'s only reader; and nothing between the
    two touches the consumer's output or writes what the consumer reads.
    """
    what = "reverse_compute_inline"
    cctx = block_ctx(func, block, what)
    cons = cctx.leaf
    assert isinstance(cons, Block)
    if is_reduction(cons) or cons.init is not None:
        raise ScheduleError(f"{what}: block {block!r} is a reduction, not an elementwise consumer")
    cst = single_store(cons)
    if cst is None:
        raise ScheduleError(f"{what}: block {block!r} must be exactly one store")
    ls = leaves(func.body)
    me = next(i for i, c in enumerate(ls) if c.path == cctx.path)
    loaded = {ld.buffer for ld in loads_of(cst.value)}
    producers = [(i, c) for i, c in enumerate(ls[:me]) if _writes(c) & loaded and isinstance(c.leaf, Block)]
    if len(producers) != 1:
        raise ScheduleError(f"{what}: block {block!r} has {len(producers)} producer blocks; it needs exactly one")
    pi, pctx = producers[0]
    prod = pctx.leaf
    assert isinstance(prod, Block)
    if is_reduction(prod):
        raise ScheduleError(
            f"{what}: producer {prod.name!r} of block {block!r} is a reduction: the consumer would "
            f"run on partial results"
        )
    pst = _producer_store(func, pctx, what)
    t = pst.buffer
    if any(t in _writes(c) for i, c in enumerate(ls) if i != pi):
        raise ScheduleError(f"{what}: buffer {t.name!r} has more than one writer")
    if any(t in _reads(c) for i, c in enumerate(ls) if i != me):
        raise ScheduleError(f"{what}: buffer {t.name!r} is read by blocks other than {block!r}")
    t_loads = [ld for ld in loads_of(cst.value) if ld.buffer is t]
    idx = t_loads[0].indices
    if any(not all(scalar_equal(a, b) for a, b in zip(ld.indices, idx)) for ld in t_loads):
        raise ScheduleError(f"{what}: block {block!r} reads {t.name!r} at more than one index")
    _only_own_vars(func, cons, cst, what)
    civs = {iv.var: iv for iv in cons.iter_vars}
    if len(idx) != len(civs) or {id(x) for x in idx} != {id(v) for v in civs}:
        raise ScheduleError(
            f"{what}: block {block!r} reads {t.name!r} at indices that are not a permutation of its iter vars"
        )
    pivs = {iv.var: iv for iv in prod.iter_vars}
    m: dict[SymVar, Dim] = {}
    for d, x in enumerate(idx):
        assert isinstance(x, SymVar)
        pv = pst.indices[d]
        assert isinstance(pv, SymVar)
        if not sym.prove_eq(civs[x].extent, pivs[pv].extent):
            raise ScheduleError(
                f"{what}: block {block!r} covers {sym.to_str(civs[x].extent)} elements of dim {d} of "
                f"{t.name!r} but {prod.name!r} writes {sym.to_str(pivs[pv].extent)}"
            )
        m[x] = pv
    for g in cctx.guards:
        if all(is_bounds_guard(c, cons) is None for c in conjuncts(g)):
            raise ScheduleError(f"{what}: block {block!r} runs under a condition that the producer does not share")
    outb = cst.buffer
    others = (loaded - {t}) | {outb}
    for i in range(pi + 1, me):
        clash = (others & _writes(ls[i])) | ({outb} & _reads(ls[i]))
        if clash:
            raise ScheduleError(
                f"{what}: {_name(ls[i])} touches {sorted(b.name for b in clash)[0]!r} between "
                f"producer {prod.name!r} and consumer {block!r}"
            )
    value = map_scalars(cst.value, lambda n: pst.value if isinstance(n, Load) and n.buffer is t else None)
    value = subst_scalar(value, m)
    new_idx = tuple(subst_scalar(x, m) for x in cst.indices)
    reads = _block_reads(prod.reads, None, [b for b in cons.reads if b is not t])
    new_prod = Block(prod.name, prod.iter_vars, reads, (outb,), Store(outb, new_idx, value), None)
    body = replace_at(func.body, pctx.path, new_prod)  # first: removal may reshape paths
    body = remove_at(body, cctx.path)
    return func.replace(body=_drop_alloc_if_unused(body, t))


# -- cache_read ---------------------------------------------------------------------------------


def cache_read(func: TensorFunc, block: str, buffer: str, order: Sequence[int] | None = None) -> TensorFunc:
    """Make ``block`` read input ``buffer`` through a copy ``<buffer>_cache`` that a new block
    (also ``<buffer>_cache``, loops ``<buffer>_cache_0, ...``) fills just before the outermost
    loop around ``block``. With ``order``, dim ``d`` of the copy is dim ``order[d]`` of the
    buffer (``(1, 0)`` transposes a matrix), so a block that walks a column of the buffer walks
    a row of the copy.

    Requires: the block reads the buffer, ``order`` is a permutation of its dims, and nothing
    in the function writes the buffer (the copy is made once).
    """
    what = "cache_read"
    ctx = block_ctx(func, block, what)
    b = ctx.leaf
    assert isinstance(b, Block)
    found = [r for r in b.reads if r.name == buffer]
    if not found:
        raise ScheduleError(f"{what}: block {block!r} reads no buffer named {buffer!r}")
    src = found[0]
    nd = len(src.shape)
    perm = tuple(range(nd)) if order is None else tuple(order)
    if sorted(perm) != list(range(nd)):
        raise ScheduleError(f"{what}: order {list(perm)} is not a permutation of the {nd} dims of {buffer!r}")
    for c in leaves(func.body):
        if src in _writes(c):
            raise ScheduleError(f"{what}: {_name(c)} writes {buffer!r}; only a buffer nothing writes can be copied once")
    used = used_names(func)
    copy = Buffer(fresh_name(used, f"{src.name}_cache"), tuple(src.shape[o] for o in perm), src.dtype)
    loops = [new_loop_var(fresh_name(used, f"{copy.name}_{d}"), copy.shape[d]) for d in range(nd)]
    ivs = [IterVar(SymVar(fresh_name(used, f"v{copy.name}_{d}")), copy.shape[d], "spatial", loops[d]) for d in range(nd)]
    src_idx: list[Scalar] = [0] * nd
    for d, o in enumerate(perm):
        src_idx[o] = ivs[d].var
    fill = Store(copy, tuple(iv.var for iv in ivs), Load(src, tuple(src_idx)))
    bnames = {s.name for _, s in walk(func.body) if isinstance(s, Block)}
    nest: Stmt = Block(fresh_name(bnames, f"{src.name}_cache"), tuple(ivs), (src,), (copy,), fill, None)
    for d in reversed(range(nd)):
        nest = For(loops[d], copy.shape[d], nest)

    def through_copy(n: PExpr) -> Scalar | None:
        if isinstance(n, Load) and n.buffer is src:
            return Load(copy, tuple(n.indices[o] for o in perm))
        return None

    nb = map_stmt_scalars(b, through_copy)
    assert isinstance(nb, Block)
    reads = tuple(copy if r is src else r for r in nb.reads)
    body = replace_at(func.body, ctx.path, Block(nb.name, nb.iter_vars, reads, nb.writes, nb.body, nb.init))
    top = next((p for p in (ctx.path[:k] for k in range(len(ctx.path) + 1)) if isinstance(get_at(body, p), For)), ctx.path)
    return func.replace(body=replace_at(body, top, Allocate(copy, seq([nest, get_at(body, top)]))))
