"""Primitives that change where a block accumulates: decompose_reduction, cache_write, rfactor.

Each is a pure function ``TensorFunc -> TensorFunc`` that addresses a block by name and a loop
around it by var or name, and refuses with a ``ScheduleError`` what it cannot prove correct.
"""

from __future__ import annotations

from tilework.errors import ScheduleError
from tilework.ir import sym
from tilework.ir.loop import (
    Allocate,
    Binary,
    Block,
    Buffer,
    For,
    IfThenElse,
    IterVar,
    Load,
    PExpr,
    Scalar,
    Stmt,
    SeqStmt,
    Store,
    TensorFunc,
    walk_stmts,
)
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.schedule.analysis import (
    block_stores,
    identity,
    is_bounds_guard,
    is_reduction,
    loads_of,
    reducer_of,
    spatial_vars,
)
from tilework.schedule.tree import (
    LeafCtx,
    LoopRef,
    block_ctx,
    block_names,
    conj,
    conjuncts,
    dim_vars,
    find_loop,
    fresh_name,
    get_at,
    guard_leaves,
    inner_ctx,
    leaves,
    less_than,
    map_stmt_scalars,
    new_loop_var,
    renew_iter_vars,
    replace_at,
    scalar_equal,
    scalar_vars,
    seq,
    splice_at,
    subst_dim,
    subst_scalar,
    subst_stmt,
    used_names,
    walk,
)


def _loop_in(ctx: LeafCtx, f: For, what: str) -> int:
    for k, g in enumerate(ctx.loops):
        if g is f:
            return k
    name = ctx.leaf.name if isinstance(ctx.leaf, Block) else "?"
    raise ScheduleError(f"{what}: loop {f.var.name!r} does not enclose block {name!r}")


def _binding_loops(block: Block, kind: str) -> set[SymVar]:
    out: set[SymVar] = set()
    for iv in block.iter_vars:
        if iv.kind == kind:
            out |= dim_vars(iv.binding)
    return out


def _touches(ctx: LeafCtx, bufs: set[Buffer]) -> bool:
    leaf = ctx.leaf
    stores = block_stores(leaf) if isinstance(leaf, Block) else [leaf]
    xs: list[Scalar] = list(ctx.guards)
    for s in stores:
        assert isinstance(s, Store)
        if s.buffer in bufs:
            return True
        xs.extend((*s.indices, s.value))
    return any(ld.buffer in bufs for x in xs for ld in loads_of(x))


def _others_touch(func: TensorFunc, lpath: tuple, ctx: LeafCtx, bufs: set[Buffer]) -> str:
    """The name of another leaf under the loop at ``lpath`` that accesses ``bufs`` ('' if none)."""
    rel = ctx.path[len(lpath) :]
    for c in leaves(get_at(func.body, lpath)):
        if c.path != rel and _touches(c, bufs):
            return f"block {c.leaf.name!r}" if isinstance(c.leaf, Block) else "a store outside blocks"
    return ""


# -- decompose_reduction ------------------------------------------------------------------------


def decompose_reduction(func: TensorFunc, block: str, loop: LoopRef) -> TensorFunc:
    """Move the ``init`` of reduction ``block`` out into a block ``<block>_init`` placed just
    before ``loop``, under copies (``<loop>_init``) of the loops from ``loop`` inward that
    bind spatial iter vars; the reduction block keeps only its update.

    Requires: ``loop`` encloses the block, no loop outside ``loop`` binds a reduction iter var
    (else the init would rerun), no loop binds both kinds, nothing else under ``loop``
    accesses what the block writes, and no guard mixes spatial and reduction loops.
    """
    what = "decompose_reduction"
    ctx = block_ctx(func, block, what)
    b = ctx.leaf
    assert isinstance(b, Block)
    if not is_reduction(b) or b.init is None:
        raise ScheduleError(f"{what}: block {block!r} is not a reduction with an init")
    lpath, lp = find_loop(func, loop, what)
    p = _loop_in(ctx, lp, what)
    red, spa = _binding_loops(b, "reduce"), _binding_loops(b, "spatial")
    for g in ctx.loops[:p]:
        if g.var in red:
            raise ScheduleError(
                f"{what}: loop {g.var.name!r} outside {lp.var.name!r} binds a reduction iter var of "
                f"block {block!r}; the init would rerun on every iteration"
            )
    inner = ctx.loops[p:]
    for g in inner:
        if g.var in red and g.var in spa:
            raise ScheduleError(f"{what}: loop {g.var.name!r} binds both spatial and reduction iter vars of {block!r}")
    writes = {s.buffer for s in block_stores(b)}
    who = _others_touch(func, lpath, ctx, writes)
    if who:
        raise ScheduleError(f"{what}: {who} under loop {lp.var.name!r} accesses the output of block {block!r}")
    used = used_names(func)
    bnames = block_names(func)
    mapping: dict[SymVar, Dim] = {}
    init_loops: list[tuple[SymVar, Dim, str]] = []
    for g in inner:
        if g.var in spa:
            ext = subst_dim(g.extent, mapping)
            v = new_loop_var(fresh_name(used, f"{g.var.name}_init"), ext)
            mapping[g.var] = v
            init_loops.append((v, ext, g.kind))
    keep: list[Scalar] = []
    inner_red = {g.var for g in inner if g.var in red}
    inner_spa = {g.var for g in inner if g.var in spa}
    for cond in inner_ctx(func.body, lpath, ctx.path).guards:
        for c in conjuncts(cond):
            vs = scalar_vars(c)
            if vs & inner_red and vs & inner_spa:
                raise ScheduleError(f"{what}: block {block!r} runs under a condition that mixes spatial and reduction loops")
            if not vs & inner_red:
                keep.append(subst_scalar(c, mapping))
    ivs = tuple(
        IterVar(iv.var, iv.extent, iv.kind, subst_dim(iv.binding, mapping)) for iv in spatial_vars(b)
    )
    init_stores = [x for x in walk_stmts(b.init) if isinstance(x, Store)]
    reads = tuple({ld.buffer: None for x in init_stores for e in (*x.indices, x.value) for ld in loads_of(e)})
    init_body = subst_stmt(b.init, mapping)  # a body may use loop vars directly
    init_block: Stmt = renew_iter_vars(
        Block(fresh_name(bnames, f"{b.name}_init"), ivs, reads, b.writes, init_body, None), used
    )
    if keep:
        init_block = IfThenElse(conj(keep), init_block)
    nest = init_block
    for v, ext, kind in reversed(init_loops):
        nest = For(v, ext, nest, kind)
    update = Block(b.name, b.iter_vars, b.reads, b.writes, b.body, None)
    body = replace_at(func.body, ctx.path, update)
    new_loop = get_at(body, lpath)
    return func.replace(body=splice_at(body, lpath, [nest, new_loop]))


def init_empty_reductions(func: TensorFunc) -> TensorFunc:
    """Make every reduction whose domain may be empty at run time (a reduce extent not
    provably >= 1, e.g. ``sum`` over a symbolic axis that is 0, or matmul with K = 0) still
    run its ``init``: the block's init moves out (``decompose_reduction``) to just before the
    outermost loop that binds one of its reduce iter vars, so it runs once per spatial point
    whether or not a reduction step follows. Codegen applies this to every kernel. A block
    ``decompose_reduction`` refuses (a loop binding both kinds of iter var, a guard mixing
    them, another block under the loop touching its output: no default schedule rule makes
    one) keeps its init inside; the kernel then raises a ``RuntimeCheckError`` when that
    reduction's extent is 0 (``LoopEmitter.empty_reduction_checks``)."""
    todo = [
        b.name
        for _, b in walk(func.body)
        if isinstance(b, Block) and b.init is not None and not _nonempty_reduction(b)
    ]
    for name in todo:
        ctx = block_ctx(func, name, "init_empty_reductions")
        b = ctx.leaf
        assert isinstance(b, Block)
        red = _binding_loops(b, "reduce")
        outer = next((g for g in ctx.loops if g.var in red), None)
        if outer is None:
            continue
        try:
            func = decompose_reduction(func, name, outer.var)
        except ScheduleError:
            continue
    return func


def _nonempty_reduction(b: Block) -> bool:
    return all(sym.prove_ge(iv.extent, 1) for iv in b.iter_vars if iv.kind == "reduce")


# -- cache_write -------------------------------------------------------------------------------


def cache_write(func: TensorFunc, block: str, loop: LoopRef) -> TensorFunc:
    """Make ``block`` accumulate into a scratch buffer ``<out>_local`` allocated inside
    ``loop`` and sized to the region of its output that one iteration of ``loop`` writes;
    after the block's loops (still inside ``loop``) a block ``<block>_store`` copies the region
    out (loops ``<out>_c0, <out>_c1, ...``), clipped to the output's bounds.

    Requires: the block writes one buffer, at indices affine in the loops inside ``loop`` with
    constant non-negative coefficients; all its reduction loops are inside ``loop``; it has an
    init if it reduces (and does not read its output otherwise); nothing else under ``loop``
    accesses that buffer; its guards inside ``loop`` are bounds checks on its output,
    conditions on reduction loops, or conditions on loops outside ``loop``.
    """
    what = "cache_write"
    ctx = block_ctx(func, block, what)
    b = ctx.leaf
    assert isinstance(b, Block)
    lpath, lp = find_loop(func, loop, what)
    p = _loop_in(ctx, lp, what)
    stores = block_stores(b)
    outs = {s.buffer for s in stores}
    if len(outs) != 1:
        raise ScheduleError(f"{what}: block {block!r} writes {len(outs)} buffers; it must write one")
    (o,) = outs
    red = _binding_loops(b, "reduce")
    for g in ctx.loops[: p + 1]:
        if g.var in red:
            raise ScheduleError(
                f"{what}: reduction loop {g.var.name!r} of block {block!r} is not inside loop "
                f"{lp.var.name!r}; partial results would be copied out"
            )
    reads_o = any(ld.buffer is o for s in stores for x in (*s.indices, s.value) for ld in loads_of(x))
    if is_reduction(b) and b.init is None:
        raise ScheduleError(f"{what}: reduction block {block!r} has no init; it accumulates into existing values")
    if not is_reduction(b) and reads_o:
        raise ScheduleError(f"{what}: block {block!r} reads its own output {o.name!r}")
    who = _others_touch(func, lpath, ctx, {o})
    if who:
        raise ScheduleError(f"{what}: {who} under loop {lp.var.name!r} also accesses {o.name!r}")
    binds = {iv.var: iv.binding for iv in b.iter_vars}
    e0 = tuple(subst_scalar(x, binds) for x in stores[0].indices)
    accesses = [s.indices for s in stores] + [
        ld.indices for s in stores for x in (*s.indices, s.value) for ld in loads_of(x) if ld.buffer is o
    ]
    for idx in accesses:
        ex = tuple(subst_scalar(x, binds) for x in idx)
        if len(ex) != len(e0) or not all(scalar_equal(x, y) for x, y in zip(ex, e0)):
            raise ScheduleError(f"{what}: block {block!r} accesses {o.name!r} at more than one index")
    inner = ctx.loops[p + 1 :]
    ivars = [g.var for g in inner]
    zero: dict[SymVar, Dim] = {v: 0 for v in ivars}
    base: list[Dim] = []
    extents: list[Dim] = []
    local_idx: list[Dim] = []
    for d, ed in enumerate(e0):
        if not isinstance(ed, (int, SymExpr)):
            raise ScheduleError(f"{what}: block {block!r} writes {o.name!r} at an index computed from data")
        e: Dim = ed
        b0 = subst_dim(e, zero)
        affine: Dim = b0
        ext: Dim = 1
        for g in inner:
            coef = sym.sub(subst_dim(e, {**zero, g.var: 1}), b0)
            if not isinstance(coef, int) or coef < 0:
                raise ScheduleError(
                    f"{what}: index {d} of {o.name!r} in block {block!r} is not affine in loop "
                    f"{g.var.name!r} with a constant non-negative coefficient"
                )
            affine = sym.add(affine, sym.mul(coef, g.var))
            ext = sym.add(ext, sym.mul(coef, sym.sub(g.extent, 1)))
        if not sym.prove_eq(affine, e):
            raise ScheduleError(f"{what}: index {d} of {o.name!r} in block {block!r} is not affine in the loops inside {lp.var.name!r}")
        base.append(b0)
        extents.append(ext)
        local_idx.append(sym.sub(e, b0))
    # Guards inside the loop: which ones the copy-out must repeat.
    red_inner = {g.var for g in inner if g.var in red}
    copy_conds: list[Scalar] = []
    clipped: set[int] = set()
    for cond in inner_ctx(func.body, lpath, ctx.path).guards:
        for c in conjuncts(cond):
            vs = scalar_vars(c)
            inner_used = vs & set(ivars)
            if inner_used and inner_used <= red_inner:
                continue  # a condition on reduction loops: every output element is still written
            if not vs & set(ivars):
                copy_conds.append(c)  # decided outside the region: the copy must follow it
                continue
            iv = is_bounds_guard(c, b)
            dims = [d for d, x in enumerate(stores[0].indices) if iv is not None and x is iv.var]
            if not dims:
                raise ScheduleError(f"{what}: block {block!r} runs under a condition that the copy-out cannot repeat")
            clipped.update(dims)
    used = used_names(func)
    bnames = block_names(func)
    local = Buffer(fresh_name(used, f"{o.name}_local"), tuple(extents), o.dtype)
    lidx = tuple(local_idx)

    def to_local(n: PExpr) -> Scalar | None:
        if isinstance(n, Load) and n.buffer is o:
            return Load(local, lidx)
        return None

    body = map_stmt_scalars(b.body, to_local)
    init = None if b.init is None else map_stmt_scalars(b.init, to_local)
    body, init = _retarget(body, o, local, lidx), None if init is None else _retarget(init, o, local, lidx)
    reads = tuple(local if r is o else r for r in b.reads)
    nb = Block(b.name, b.iter_vars, reads, (local,), body, init)
    # The copy-out nest.
    cloops = [new_loop_var(fresh_name(used, f"{o.name}_c{d}"), extents[d]) for d in range(len(e0))]
    civs = [
        IterVar(SymVar(fresh_name(used, f"v{o.name}_c{d}")), o.shape[d], "spatial", sym.add(base[d], cloops[d]))
        for d in range(len(e0))
    ]
    src = Load(local, tuple(sym.sub(iv.var, base[d]) for d, iv in enumerate(civs)))
    copy: Stmt = Block(fresh_name(bnames, f"{b.name}_store"), tuple(civs), (local,), (o,), Store(o, tuple(iv.var for iv in civs), src), None)
    conds = copy_conds + [less_than(sym.add(base[d], cloops[d]), o.shape[d]) for d in sorted(clipped)]
    if conds:
        copy = IfThenElse(conj(conds), copy)
    for d in reversed(range(len(e0))):
        copy = For(cloops[d], extents[d], copy, "serial")
    new_body = replace_at(func.body, ctx.path, nb)
    inside = get_at(new_body, lpath)
    assert isinstance(inside, For)
    new_loop = For(inside.var, inside.extent, Allocate(local, seq([inside.body, copy])), inside.kind)
    return func.replace(body=replace_at(new_body, lpath, new_loop))


def _retarget(s: Stmt, old: Buffer, new: Buffer, idx: tuple[Dim, ...]) -> Stmt:
    """``s`` with stores to ``old`` made stores to ``new`` at ``idx``."""
    if isinstance(s, Store):
        return Store(new, idx, s.value) if s.buffer is old else s
    if isinstance(s, IfThenElse):
        els = None if s.else_body is None else _retarget(s.else_body, old, new, idx)
        return IfThenElse(s.cond, _retarget(s.then_body, old, new, idx), els)
    if isinstance(s, SeqStmt):
        return SeqStmt(tuple(_retarget(c, old, new, idx) for c in s.stmts))
    return s


# -- rfactor ------------------------------------------------------------------------------------


def rfactor(func: TensorFunc, block: str, loop: LoopRef) -> TensorFunc:
    """Split reduction ``block`` over reduction loop ``loop``: a block ``<block>_rf``
    accumulates one partial result per iteration of ``loop`` into a scratch buffer
    ``<out>_rf`` (``loop`` becomes a spatial loop of that block, so it can be vectorized or
    parallelized), after ``<block>_rf_init`` set the partials to the reducer's identity; then
    ``block`` reduces the partials into the output (loops ``<loop>_init`` and ``<loop>_wb``).
    The partial buffer is allocated inside the loops around the reduction, so it holds only
    ``extent(loop)`` elements.

    Requires: the block's body is ``out[i] = out[i] op value`` with ``op`` one of ``+ * max
    min`` (possibly under a condition, which the partial update keeps) and it has an init;
    ``loop`` binds only reduction iter vars; the block's loops are spatial loops then
    reduction loops, perfectly nested down to the block.
    """
    what = "rfactor"
    ctx = block_ctx(func, block, what)
    b = ctx.leaf
    assert isinstance(b, Block)
    red = reducer_of(b)
    if red is None or b.init is None:
        raise ScheduleError(
            f"{what}: block {block!r} is not a reduction update out = out op value (op in + * max min) with an init"
        )
    lpath, lp = find_loop(func, loop, what)
    _loop_in(ctx, lp, what)
    rl, sl = _binding_loops(b, "reduce"), _binding_loops(b, "spatial")
    if lp.var not in rl:
        raise ScheduleError(f"{what}: loop {lp.var.name!r} binds no reduction iter var of block {block!r}")
    if lp.var in sl:
        raise ScheduleError(f"{what}: loop {lp.var.name!r} binds spatial iter vars of block {block!r} too")
    p0 = next(k for k, g in enumerate(ctx.loops) if g.var in rl)
    chain = ctx.loops[p0:]
    for g in chain:
        if g.var in sl:
            raise ScheduleError(
                f"{what}: spatial loop {g.var.name!r} is inside reduction loop {chain[0].var.name!r}; "
                f"reorder the reduction loops innermost first"
            )
    cpath = next(q for q, x in walk(func.body) if x is chain[0])
    stay: list[Scalar] = []
    hoist: list[Scalar] = []
    s: Stmt = chain[0]
    while s is not b:
        if isinstance(s, For):
            s = s.body
        elif isinstance(s, IfThenElse) and s.else_body is None:
            for c in conjuncts(s.cond):
                (stay if scalar_vars(c) & {g.var for g in chain} else hoist).append(c)
            s = s.then_body
        else:
            raise ScheduleError(
                f"{what}: the loops of block {block!r} from {chain[0].var.name!r} inward are not perfectly nested"
            )
    used = used_names(func)
    bnames = block_names(func)
    new_ivs: dict[SymVar, IterVar] = {}
    for g in chain:
        if g.var in rl:
            kind = "spatial" if g is lp else "reduce"
            new_ivs[g.var] = IterVar(SymVar(fresh_name(used, f"v{g.var.name}")), g.extent, kind, g.var)
    to_iv = {v: iv.var for v, iv in new_ivs.items()}
    k_map = {iv.var: subst_dim(iv.binding, to_iv) for iv in b.iter_vars if iv.kind == "reduce"}
    rhs = subst_scalar(red.rhs, k_map)
    o = red.store.buffer
    dtype = red.store.value.dtype if isinstance(red.store.value, PExpr) else o.dtype
    rf = Buffer(fresh_name(used, f"{o.name}_rf"), (lp.extent,), o.dtype)
    riv = new_ivs[lp.var]
    update_rf: Stmt = Store(rf, (riv.var,), Binary(red.op, Load(rf, (riv.var,)), rhs, dtype))
    if red.cond is not None:  # a conditional update stays conditional; skipped lanes keep identity
        update_rf = IfThenElse(subst_scalar(red.cond, k_map), update_rf)
    rf_block: Stmt = renew_iter_vars(
        Block(
            fresh_name(bnames, f"{b.name}_rf"),
            tuple(spatial_vars(b)) + tuple(new_ivs.values()),
            tuple(r for r in b.reads if r is not o) + (rf,),
            (rf,),
            update_rf,
            None,
        ),
        used,
    )
    if stay:
        rf_block = IfThenElse(conj(stay), rf_block)
    update = rf_block
    for g in reversed(chain):
        update = For(g.var, g.extent, update, g.kind)
    v0 = new_loop_var(fresh_name(used, f"{lp.var.name}_init"), lp.extent)
    i0 = IterVar(SymVar(fresh_name(used, f"v{lp.var.name}_init")), lp.extent, "spatial", v0)
    init_block = Block(fresh_name(bnames, f"{b.name}_rf_init"), (i0,), (), (rf,), Store(rf, (i0.var,), identity(red.op, o.dtype)), None)
    init_nest = For(v0, lp.extent, init_block, "serial")
    v1 = new_loop_var(fresh_name(used, f"{lp.var.name}_wb"), lp.extent)
    i1 = IterVar(SymVar(fresh_name(used, f"v{lp.var.name}_wb")), lp.extent, "reduce", v1)
    idx = red.store.indices
    wb_block = Block(
        b.name,
        tuple(spatial_vars(b)) + (i1,),
        (o, rf),
        (o,),
        Store(o, idx, Binary(red.op, Load(o, idx), Load(rf, (i1.var,)), dtype)),
        b.init,
    )
    wb_nest = For(v1, lp.extent, wb_block, "serial")
    result: Stmt = Allocate(rf, seq([init_nest, update, wb_nest]))
    if hoist:
        result = guard_leaves(result, conj(hoist))
    return func.replace(body=replace_at(func.body, cpath, result))
