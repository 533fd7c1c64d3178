"""Inlining that several rules start with: a block that only feeds others (one store to a
scratch buffer, no reduction) is inlined into its consumers when that is valid and does not
multiply its work: a producer whose element a consumer reuses across some of its iterations
(``mean[i]`` read for every ``j`` of a row) is inlined only when it is cheap, since the
consumer would compute it again on each of those iterations."""

from __future__ import annotations

from tilework.ir.loop import Binary, Block, Intrin, TensorFunc, stmt_scalars, walk_scalars, walk_stmts
from tilework.schedule.analysis import is_reduction, loads_of, single_store
from tilework.schedule.block_primitives import compute_inline
from tilework.schedule.rules.common import attempt
from tilework.schedule.tree import blocks_of, scalar_vars

EXPENSIVE = ("/", "//", "%", "pow")
CHEAP_INTRINSICS = ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitcast")  # one instruction each


def inline_producers(func: TensorFunc) -> TensorFunc:
    """``func`` with every inlinable non-reduction producer block inlined (see above)."""
    params = {id(p) for p in func.params}
    for b in blocks_of(func):
        if is_reduction(b) or any(id(w) in params for w in b.writes):
            continue
        if repeats_work(func, b):
            continue
        func = attempt(func, compute_inline, b.name)
    return func


def repeats_work(func: TensorFunc, producer: Block) -> bool:
    """Whether inlining ``producer`` would compute its costly value again on several
    iterations of a consumer (reused, and not cheap): such a block stays a block of its own.
    Fusion (``transform.fuse_tensor``) asks it too, so that a group's broadcast operand (a
    squeeze-excite's ``sigmoid`` of ``[N, 1, C]`` scaling ``[N, HW, C]``) is computed once."""
    return _reused(func, producer) and not _cheap(producer)


def _reused(func: TensorFunc, producer: Block) -> bool:
    """Whether some consumer reads the producer's buffer at indices that leave out some of
    its own iter vars (the same element serves several of its iterations)."""
    out = producer.writes[0] if producer.writes else None
    for c in blocks_of(func):
        if c is producer or out not in c.reads:
            continue
        own = {iv.var for iv in c.iter_vars}
        for part in (c.init, c.body):
            if part is None:
                continue
            for x in (x for st in walk_stmts(part) for x in stmt_scalars(st)):
                for ld in loads_of(x):
                    used: set = set().union(*(scalar_vars(i) for i in ld.indices))
                    if ld.buffer is out and not own <= used:
                        return True
    return False


def _cheap(b: Block) -> bool:
    """A value without intrinsics or divisions."""
    st = single_store(b)
    if st is None:
        return False
    for e in walk_scalars(st.value):
        if (isinstance(e, Intrin) and e.name not in CHEAP_INTRINSICS) or (isinstance(e, Binary) and e.op in EXPENSIVE):
            return False
    return True
