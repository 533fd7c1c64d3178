"""The reduction rule: row-wise reductions (sum over the last axis, softmax, layer_norm).

1. Scratch producers are inlined into their consumers.
2. Sibling loop nests over the same rows are merged level by level (``merge_loops``), so
   each row's blocks (max, sum, normalize ...) run together and the row stays in cache.
3. The row loops of each nest (the independent ones around everything) are fused and run
   in parallel.
4. A reduction whose innermost loop walks memory contiguously is split by a multiple of the
   vector width and ``rfactor``-ed: the partial results (several vector accumulators) update
   in a vectorized loop, then are summed. Elementwise blocks vectorize their innermost loop.
"""

from __future__ import annotations

from tilework.errors import ScheduleError
from tilework.ir import sym
from tilework.ir.loop import Allocate, Block, For, SeqStmt, Stmt, TensorFunc
from tilework.ir.sym import SymVar
from tilework.schedule import loop_primitives as lp
from tilework.schedule.analysis import FuncKind, classify, is_reduction, loads_of, reducer_of, update_store
from tilework.schedule.reduction_primitives import rfactor
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
from tilework.schedule.tree import blocks_of, dim_vars, subst_scalar, walk

NAME = "reduction"


def apply(func: TensorFunc) -> TensorFunc | None:
    # Also the backup for products the matmul and GEMV rules decline.
    if classify(func) not in (FuncKind.REDUCTION, FuncKind.MATMUL, FuncKind.GEMV):
        return None
    return schedule_reduction(func)


def schedule_reduction(func: TensorFunc) -> TensorFunc:
    """Steps 1-4 above on any function (also used by the GEMV and matmul rules)."""
    func = inline_producers(func)
    merged = merge_rows(func, None)
    if _rows_shared(merged):
        func = merged
    for top in top_nests(func):
        func = parallel_rows(func, top)
    for name in [b.name for b in blocks_of(func)]:  # the blocks rfactor adds are done
        if is_reduction(_block(func, name)):
            func = _vector_reduce(func, name)
        else:
            func = _vector_inner(func, name)
    return func


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
    return attempt(h, lp.partition, ko)  # whole vectors without the bounds test


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
        r = sym.substitute(last, {v: 0})
        if sym.prove_eq(sym.sub(sym.substitute(last, {v: 1}), r), 1):
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
