"""The reduction rule: row-wise reductions (sum over the last axis, softmax, layer_norm).

0. A scratch tensor of the output's shape that the output is computed from element by
   element, and that other blocks read first (softmax's ``exp``), is stored in the output
   itself (``compute_into_output``): no scratch, and no second evaluation by inlining.
1. Scratch producers are inlined into their consumers.
2. Sibling loop nests over the same rows are merged level by level (``merge_loops``), so
   each row's blocks (max, sum, normalize ...) run together and the row stays in cache.
3. The row loops of each nest (the independent ones around everything) are fused and run
   in parallel.
4. A reduction whose innermost loop walks memory contiguously is split by a multiple of the
   vector width and ``rfactor``-ed: the partial results (several vector accumulators) update
   in a vectorized loop, then are combined pairwise in halving steps (a tree: six short
   vector steps instead of a chain of 64 dependent scalar adds). A reduction over outer axes
   instead (the mean of ``[N, H, W, C]`` over ``H, W``: the innermost loop, a reduction one,
   strides by ``C``) has, before step 3, the spatial loop just outside its reduction loops
   moved inside them when that loop walks memory contiguously: its init split out, it runs
   vectorized, each step adding a vector of inputs into a vector of outputs. Elementwise
   blocks vectorize their innermost loop.
5. Per-row scratch (the row max, sum, mean ...) that only one row loop touches, each
   iteration at its own row, becomes one element allocated inside that loop: a value the C
   compiler keeps in a register, instead of a shared array whose loads it cannot move out of
   the vector loops (inside an OpenMP region it cannot prove that they do not alias the
   output).
"""

from __future__ import annotations

from tilework.errors import ScheduleError
from tilework.ir import sym
from tilework.ir import sym_walk
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
    SeqStmt,
    Stmt,
    Store,
    TensorFunc,
    index_dims,
    stmt_scalars,
    walk_scalars,
    walk_stmts,
)
from tilework.ir.sym import SymVar
from tilework.schedule import loop_primitives as lp
from tilework.schedule.analysis import (
    FuncKind,
    classify,
    is_reduction,
    loads_of,
    reducer_of,
    single_store,
    update_store,
)
from tilework.schedule.reduction_primitives import decompose_reduction, rfactor
from tilework.schedule.rules.common import (
    attempt,
    block_loops,
    chain,
    lanes,
    loop,
    new_blocks,
    out_dtype,
    parallel_rows,
    top_nests,
    vectorize_innermost,
)
from tilework.schedule.rules.inline import inline_producers
from tilework.schedule.tree import (
    block_names,
    blocks_of,
    children,
    dim_vars,
    fresh_name,
    leaves,
    map_scalars,
    new_loop_var,
    replace_at,
    scalar_equal,
    seq,
    subst_dim,
    subst_scalar,
    used_names,
    walk,
    with_children,
)

NAME = "reduction"


def apply(func: TensorFunc) -> TensorFunc | None:
    # Also the backup for products the matmul and GEMV rules decline.
    if classify(func) not in (FuncKind.REDUCTION, FuncKind.MATMUL, FuncKind.GEMV):
        return None
    return schedule_reduction(func)


def schedule_reduction(func: TensorFunc) -> TensorFunc:
    """Steps 0-5 above on any function (also used by the GEMV and matmul rules)."""
    func = inline_producers(compute_into_output(func))
    merged = merge_rows(func, None)
    if _rows_shared(merged):
        func = merged
    for name in [b.name for b in blocks_of(func) if is_reduction(b)]:
        func = _column_reduce(func, name)
    for top in top_nests(func):
        func = parallel_rows(func, top)
    for name in [b.name for b in blocks_of(func)]:  # the blocks rfactor adds are done
        if is_reduction(_block(func, name)):
            func = _vector_reduce(func, name)
        else:
            func = _vector_inner(func, name)
    return localize_rows(func)


def _block(func: TensorFunc, name: str) -> Block:
    return next(b for b in blocks_of(func) if b.name == name)


def merge_rows(func: TensorFunc, parent: SymVar | None) -> TensorFunc:
    """Merge consecutive sibling loops under ``parent`` (the top level for None) wherever
    ``merge_loops`` allows, then recurse into the merged loops."""
    i = 0
    while True:
        sibs = _siblings(func, parent)
        if i + 1 >= len(sibs):
            break
        try:
            func = lp.merge_loops(func, sibs[i], sibs[i + 1])
        except ScheduleError:
            i += 1
    for v in _siblings(func, parent):
        if isinstance(loop(func, v).body, SeqStmt):
            func = merge_rows(func, v)
    return func


def _rows_shared(func: TensorFunc) -> bool:
    """Whether merging left one nest whose shared loops bind every spatial iter var of every
    reduction: then the rows run in parallel as a whole. (Merging only the outer dims, say
    the batch of an attention, would leave just those to run in parallel.)"""
    tops = top_nests(func)
    if len(tops) != 1:
        return False
    shared = {f.var for f in chain(tops[0])}
    for b in blocks_of(func):
        if is_reduction(b):
            for iv in b.iter_vars:
                if iv.kind == "spatial" and not dim_vars(iv.binding) <= shared:
                    return False
    return True


def _siblings(func: TensorFunc, parent: SymVar | None) -> list[SymVar]:
    body: Stmt = func.body if parent is None else loop(func, parent).body
    while isinstance(body, Allocate):
        body = body.body
    stmts = body.stmts if isinstance(body, SeqStmt) else (body,)
    return [s.var for s in stmts if isinstance(s, For)]


def _vector_reduce(func: TensorFunc, name: str) -> TensorFunc:
    """Split and rfactor the innermost reduction loop of block ``name`` when it reads memory
    contiguously, and vectorize the partial-result loops."""
    loops = block_loops(func, name)
    if not loops or loops[-1].kind != "serial":
        return func
    block = _block(func, name)
    inner = loops[-1]
    red_loops: set[SymVar] = set()
    for iv in block.iter_vars:
        if iv.kind == "reduce":
            red_loops |= dim_vars(iv.binding)
    if inner.var not in red_loops or not _contiguous(block, inner.var):
        return _vector_inner(func, name)
    dtype = block.writes[0].dtype if block.writes else out_dtype(func)
    width = lanes(dtype) * 4
    if isinstance(inner.extent, int) and inner.extent <= lanes(dtype):
        return func
    if reducer_of(block) is None or block.init is None:
        return func
    try:
        g, (ko, ki) = lp.split_vars(func, inner.var, [None, width])
        h = rfactor(g, name, ki)
    except ScheduleError:
        return func
    h = attempt(h, lp.vectorize, ki)
    for made in new_blocks(func, h):
        if not is_reduction(_block(h, made)):  # the block setting the partials to identity
            h = attempt(h, lp.vectorize, block_loops(h, made)[-1].var)
    h = tree_writeback(h, name)
    return attempt(h, lp.partition, ko)  # whole vectors without the bounds test


def _column_reduce(func: TensorFunc, name: str) -> TensorFunc:
    """Step 4's reduction over outer axes, before the rows go parallel: when the innermost
    loop of block ``name`` is a reduction loop that does not walk memory contiguously, the
    spatial loop around its trailing reduction loops becomes the innermost, vectorized, if a
    load of the block and its store both move by one element per iteration of it (else
    ``func`` unchanged)."""
    loops = block_loops(func, name)
    block = _block(func, name)
    red_loops: set[SymVar] = set()
    for iv in block.iter_vars:
        if iv.kind == "reduce":
            red_loops |= dim_vars(iv.binding)
    if not loops or loops[-1].var not in red_loops or _contiguous(block, loops[-1].var):
        return func
    k = len(loops)
    while k > 0 and loops[k - 1].var in red_loops:
        k -= 1
    if k == 0 or loops[k - 1].kind != "serial":
        return func
    sp, reds = loops[k - 1], loops[k:]
    if not _contiguous(block, sp.var) or not _store_contiguous(block, sp.var):
        return func
    before = func
    try:
        g = decompose_reduction(func, name, sp.var)
        init = new_blocks(before, g)
        g = lp.reorder(g, *(f.var for f in reds), sp.var)
        g = lp.vectorize(g, sp.var)
    except ScheduleError:
        return func
    for made in init:
        g = attempt(g, lp.vectorize, block_loops(g, made)[-1].var)
    return g


def _store_contiguous(block: Block, v: SymVar) -> bool:
    """Whether the update store of ``block`` moves by one element per iteration of loop
    ``v`` in its last index (its earlier indices not moving with ``v``)."""
    up = update_store(block)
    if up is None or not up[0].indices:
        return False
    binds = {iv.var: iv.binding for iv in block.iter_vars}
    idx = [d for d in (subst_scalar(i, binds) for i in up[0].indices) if isinstance(d, (int, sym.SymExpr))]
    if len(idx) != len(up[0].indices) or any(v in dim_vars(i) for i in idx[:-1]):
        return False
    last = idx[-1]
    return sym.prove_eq(sym.sub(sym_walk.substitute(last, {v: 1}), sym_walk.substitute(last, {v: 0})), 1)


def _contiguous(block: Block, v: SymVar) -> bool:
    """Whether some load of ``block`` moves by one element per iteration of loop ``v`` in its
    last index."""
    binds = {iv.var: iv.binding for iv in block.iter_vars}
    up = update_store(block)
    if up is None:
        return False
    st = up[0]
    for ld in loads_of(st.value):
        if ld.buffer is st.buffer or not ld.indices:
            continue
        last = subst_scalar(ld.indices[-1], binds)
        if not isinstance(last, (int, sym.SymExpr)) or v not in dim_vars(last):
            continue
        r = sym_walk.substitute(last, {v: 0})
        if sym.prove_eq(sym.sub(sym_walk.substitute(last, {v: 1}), r), 1):
            return True
    return False


def _vector_inner(func: TensorFunc, name: str) -> TensorFunc:
    """Vectorize the innermost loop of block ``name`` when it is serial and independent."""
    loops = block_loops(func, name)
    if not loops or loops[-1].kind != "serial":
        return func
    if any(isinstance(s, For) for _, s in walk(loops[-1].body)):
        return func
    return vectorize_innermost(func, loops[-1].var)


def tree_writeback(func: TensorFunc, name: str) -> TensorFunc:
    """After ``rfactor``: instead of folding the ``w`` partials into the output one by one
    (``for k in w: out = out op rf[k]``, a chain of dependent operations), combine them in
    place in halving steps (``rf[k] = rf[k] op rf[k + h]`` for ``k < h``, ``h = w/2 .. 1``,
    each step a vector loop) and fold ``rf[0]`` alone. Needs ``w`` a static power of two;
    the function is returned unchanged otherwise."""
    hits = [(p, s) for p, s in walk(func.body) if isinstance(s, For) and isinstance(s.body, Block) and s.body.name == name]
    if len(hits) != 1:
        return func
    path, wb = hits[0]
    block = wb.body
    assert isinstance(block, Block)
    red = reducer_of(block)
    width = wb.extent
    if red is None or red.cond is not None or not isinstance(width, int) or width < 2 or width & (width - 1):
        return func
    part = red.rhs
    reds = [iv for iv in block.iter_vars if iv.kind == "reduce"]
    if not isinstance(part, Load) or len(part.indices) != 1 or len(reds) != 1 or reds[0].binding is not wb.var:
        return func
    if part.indices[0] is not reds[0].var or part.buffer.shape != (width,):
        return func
    rf = part.buffer
    dtype = red.store.value.dtype if isinstance(red.store.value, PExpr) else rf.dtype
    used, bnames = used_names(func), block_names(func)
    steps: list[Stmt] = []
    half = width // 2
    while half >= 1:
        v = new_loop_var(fresh_name(used, f"{wb.var.name}_h{half}"), half)
        iv = IterVar(SymVar(fresh_name(used, f"v{v.name}"), 0, half - 1), half, "spatial", v)
        pair = Binary(red.op, Load(rf, (iv.var,)), Load(rf, (sym.add(iv.var, half),)), dtype)
        step = Block(fresh_name(bnames, f"{name}_tree{half}"), (iv,), (rf,), (rf,), Store(rf, (iv.var,), pair), None)
        steps.append(For(v, half, step, "vectorized" if half > 1 else "serial"))
        half //= 2
    last = IterVar(reds[0].var, 1, "reduce", 0)
    ivs = tuple(last if iv is reds[0] else iv for iv in block.iter_vars)
    steps.append(Block(block.name, ivs, block.reads, block.writes, block.body, block.init))
    return func.replace(body=replace_at(func.body, path, seq(steps)))


def localize_rows(func: TensorFunc) -> TensorFunc:
    """Step 5 of the module doc: every scratch buffer allocated around the whole body whose
    accesses all lie in one top-level loop ``L`` and use one index, which enumerates ``L``
    (its row-major flat offset simplifies to ``L``'s var, so each iteration has an element of
    its own), is replaced by a one-element buffer allocated inside ``L``."""
    allocs: list[Buffer] = []
    inner = func.body
    while isinstance(inner, Allocate):
        allocs.append(inner.buffer)
        inner = inner.body
    tops = list(inner.stmts) if isinstance(inner, SeqStmt) else [inner]
    moved: dict[Buffer, int] = {}
    for buf in allocs:
        where = [k for k, t in enumerate(tops) if _accesses(t, buf, {})]
        if len(where) != 1 or not isinstance(tops[where[0]], For):
            continue
        top = tops[where[0]]
        assert isinstance(top, For)
        idx = _accesses(top, buf, {})
        first = idx[0]
        if not all(len(i) == len(first) and all(scalar_equal(a, b) for a, b in zip(i, first)) for i in idx):
            continue
        dims = index_dims(first)
        if dims is None or not all(dim_vars(d) <= {top.var} for d in dims):
            continue
        flat: sym.Dim = 0
        for d, ext in zip(dims, buf.shape):
            flat = sym.add(sym.mul(flat, ext), d)
        if not sym.prove_eq(flat, top.var):
            continue
        moved[buf] = where[0]
    if not moved:
        return func
    for buf, k in moved.items():
        top = tops[k]
        assert isinstance(top, For)
        one = Buffer(buf.name, (1,), buf.dtype)
        tops[k] = For(top.var, top.extent, Allocate(one, _retarget(top.body, buf, one)), top.kind)
    body: Stmt = seq(tops)
    for buf in reversed(allocs):
        if buf not in moved:
            body = Allocate(buf, body)
    return func.replace(body=body)


def _accesses(s: Stmt, buf: Buffer, binds: dict[SymVar, sym.Dim]) -> list[tuple[Scalar, ...]]:
    """The indices of every access to ``buf`` in ``s``, block iter vars replaced by their
    bindings (so in terms of loop vars)."""
    out: list[tuple[Scalar, ...]] = []

    def scan(x: Scalar, env: dict[SymVar, sym.Dim]) -> None:
        for e in walk_scalars(x):
            if isinstance(e, Load) and e.buffer is buf:
                out.append(tuple(subst_scalar(i, env) for i in e.indices))

    def go(t: Stmt, env: dict[SymVar, sym.Dim]) -> None:
        if isinstance(t, Store):
            if t.buffer is buf:
                out.append(tuple(subst_scalar(i, env) for i in t.indices))
            for x in (*t.indices, t.value):
                scan(x, env)
        elif isinstance(t, Block):
            inner = dict(env)
            inner.update({iv.var: subst_dim(iv.binding, env) for iv in t.iter_vars})
            for part in (t.init, t.body):
                if part is not None:
                    go(part, inner)
        elif isinstance(t, IfThenElse):
            scan(t.cond, env)
            go(t.then_body, env)
            if t.else_body is not None:
                go(t.else_body, env)
        else:
            for c in children(t):
                go(c, env)

    go(s, binds)
    return out


def _retarget(s: Stmt, old: Buffer, new: Buffer, keep_index: bool = False) -> Stmt:
    """``s`` with every access to ``old`` turned into an access to element 0 of ``new`` (to
    the same element of ``new`` with ``keep_index``)."""

    def load(n: PExpr) -> Scalar | None:
        if not isinstance(n, Load) or n.buffer is not old:
            return None
        return Load(new, tuple(map_scalars(i, load) for i in n.indices) if keep_index else (0,))

    def swap(bufs: tuple[Buffer, ...]) -> tuple[Buffer, ...]:
        return tuple(new if b is old else b for b in bufs)

    def go(t: Stmt) -> Stmt:
        if isinstance(t, Store):
            idx = (0,) if t.buffer is old and not keep_index else tuple(map_scalars(i, load) for i in t.indices)
            return Store(new if t.buffer is old else t.buffer, idx, map_scalars(t.value, load))
        if isinstance(t, Block):
            init = None if t.init is None else go(t.init)
            return Block(t.name, t.iter_vars, swap(t.reads), swap(t.writes), go(t.body), init)
        if isinstance(t, IfThenElse):
            els = None if t.else_body is None else go(t.else_body)
            return IfThenElse(map_scalars(t.cond, load), go(t.then_body), els)
        return with_children(t, [go(c) for c in children(t)])

    return go(s)


def compute_into_output(func: TensorFunc) -> TensorFunc:
    """Step 0 of the module doc. For an output ``out`` whose only writer is one store
    ``out[I] = f(t[I], ...)`` reading a scratch buffer ``t`` of ``out``'s shape and dtype at
    ``I`` alone: when other blocks read ``t`` before that store and nothing touches ``t`` after
    it, nor ``out`` before it, ``t`` lives in ``out`` (every access renamed, its allocation
    dropped). Each element of ``out`` then holds ``t``'s value until the store replaces it."""
    allocs: list[Buffer] = []
    inner = func.body
    while isinstance(inner, Allocate):
        allocs.append(inner.buffer)
        inner = inner.body
    order = leaves(func.body)
    touched = [_buffers_of(c.leaf) for c in order]
    for out in func.outputs:
        at = [k for k, (reads, writes) in enumerate(touched) if out in reads or out in writes]
        if len(at) != 1 or out not in touched[at[0]][1]:
            continue
        leaf = order[at[0]].leaf
        st = single_store(leaf) if isinstance(leaf, Block) and not is_reduction(leaf) else None
        if st is None or st.buffer is not out:
            continue
        for t in dict.fromkeys(ld.buffer for ld in loads_of(st.value)):
            if t not in allocs or t.dtype != out.dtype or len(t.shape) != len(out.shape):
                continue
            if not all(sym.prove_eq(a, b) for a, b in zip(t.shape, out.shape)):
                continue
            own = [ld for ld in loads_of(st.value) if ld.buffer is t]
            if not all(len(ld.indices) == len(st.indices) and all(scalar_equal(a, b) for a, b in zip(ld.indices, st.indices)) for ld in own):
                continue
            users = [k for k, (reads, writes) in enumerate(touched) if t in reads or t in writes]
            readers = [k for k in users if t in touched[k][0]]
            if max(users) != at[0] or len(readers) < 2:
                continue
            body: Stmt = _retarget(inner, t, out, keep_index=True)
            for buf in reversed(allocs):
                if buf is not t:
                    body = Allocate(buf, body)
            return compute_into_output(func.replace(body=body))
    return func


def _buffers_of(leaf: Stmt) -> tuple[set[Buffer], set[Buffer]]:
    """The buffers a leaf (a block or a store) reads and writes."""
    reads: set[Buffer] = set()
    writes: set[Buffer] = set()
    for st in walk_stmts(leaf):
        if isinstance(st, Store):
            writes.add(st.buffer)
        for x in stmt_scalars(st):
            reads.update(ld.buffer for ld in loads_of(x))
    return reads, writes
