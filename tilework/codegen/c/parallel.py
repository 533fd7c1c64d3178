"""Which loops of a kernel may run their iterations apart, and which are worth a fork: the
emitter asks ``loop_conflict`` before it makes a loop parallel or vectorized, and puts
``parallel_work`` into the ``if(...)`` of a parallel loop, compared at run time with
``TW_PARALLEL_MIN_WORK`` (a fork/join costs microseconds, more on a loaded machine), and
into the size of the chunks its threads take (``tw_chunk``: chunks of ``TW_CHUNK_MIN_WORK`` at
least, so that taking one costs little beside its work; ``tw_shares_take`` hands them out).
"""

from __future__ import annotations

from tilework.ir import sym, sym_walk
from tilework.ir.loop import Allocate, Block, Buffer, For, IfThenElse, Intrin, Load, SeqStmt, Stmt, Store, index_dims, stmt_scalars, walk_scalars, walk_stmts
from tilework.ir.sym import Dim, SymVar


def loop_conflict(loop: For) -> str | None:
    """Why the iterations of ``loop`` may write the same element, or None. A store outside
    scratch allocated in the loop whose indices do not depend on the loop var conflicts."""
    bindings: dict[SymVar, Dim] = {}
    local: set[Buffer] = set()
    for s in walk_stmts(loop.body):
        if isinstance(s, Block):
            bindings.update((iv.var, iv.binding) for iv in s.iter_vars)
        elif isinstance(s, Allocate):
            local.add(s.buffer)

    def depends(d: Dim, seen: int = 0) -> bool:
        for v in sym_walk.free_vars(d):
            if v is loop.var or (v in bindings and seen < 8 and depends(bindings[v], seen + 1)):
                return True
        return False

    for s in walk_stmts(loop.body):
        if not isinstance(s, Store) or s.buffer in local:
            continue
        dims = index_dims(s.indices)
        if dims is None:
            continue
        if not any(depends(i) for i in dims):
            return f"every iteration writes the same element of {s.buffer.name}"
    return None


# Intrinsics that cost many times a multiply-add (a vectorized exp is a polynomial and a
# scaling, ~15 operations): each counts COSTLY_WORK more towards a parallel loop's work, so
# that an elementwise silu or softmax forks at fewer elements than a copy does.
COSTLY = frozenset({"exp", "log", "tanh", "erf", "sigmoid", "sin", "cos", "atan", "asin", "acos", "log1p", "expm1"})
COSTLY_WORK = 15
# A statement that reads many elements (a depthwise conv's taps, summed in one expression) is
# that many times a copy's work: it counts one per LOADS_PER_WORK loads (at least one), so a
# 5x5 depthwise conv of 14 x 14 x 240 forks at batch 1 (MobileNetV3-Small batch 1 1.2x, as
# with every small kernel forking); an elementwise op of up to 3 inputs counts as before.
LOADS_PER_WORK = 2


def parallel_work(loop: For) -> Dim | None:
    """An upper estimate of the work of ``loop`` and everything nested in it, as a dim of the
    vars in scope at the loop: its statements' iterations, a statement counting one per
    ``LOADS_PER_WORK`` loads (at least one) plus ``COSTLY_WORK`` for each costly intrinsic it
    evaluates; an inner extent that depends on an inner loop var (a triangular loop) is taken
    at that var's largest value. None when no
    estimate is possible (a data-dependent extent)."""

    def count(st: Stmt, top: dict[SymVar, Dim]) -> Dim | None:
        if isinstance(st, For):
            ext = sym_walk.substitute(st.extent, top)
            inner = count(st.body, {**top, st.var: sym.sub(ext, 1)})
            return None if inner is None else sym.mul(ext, inner)
        if isinstance(st, SeqStmt):
            total: Dim = 0
            for x in st.stmts:
                c = count(x, top)
                if c is None:
                    return None
                total = sym.add(total, c)
            return total
        if isinstance(st, Block):
            inner_top = dict(top)
            for iv in st.iter_vars:
                inner_top[iv.var] = sym.sub(sym_walk.substitute(iv.extent, top), 1)
            return count(st.body, inner_top)
        if isinstance(st, Allocate):
            return count(st.body, top)
        if isinstance(st, IfThenElse):
            return count(st.then_body, top)
        scalars = [e for x in stmt_scalars(st) for e in walk_scalars(x)]
        loads = sum(isinstance(e, Load) for e in scalars)
        return max(1, loads // LOADS_PER_WORK) + COSTLY_WORK * sum(isinstance(e, Intrin) and e.name in COSTLY for e in scalars)

    inner_vars = {st.var for st in walk_stmts(loop) if isinstance(st, For)}
    for st in walk_stmts(loop):
        if isinstance(st, Block):
            inner_vars.update(iv.var for iv in st.iter_vars)
    try:
        total = count(loop, {})
    except Exception:  # an extent the symbolic arithmetic refuses: no estimate, stay parallel
        return None
    if total is None or any(v in inner_vars for v in sym_walk.free_vars(total)):
        return None
    return total


__all__ = ["COSTLY", "COSTLY_WORK", "LOADS_PER_WORK", "loop_conflict", "parallel_work"]
