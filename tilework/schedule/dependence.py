"""Which loops carry a dependence: the legality test behind ``parallel``, ``vectorize`` and
``reorder``.

A loop is *independent* when two of its iterations never touch the same element of a buffer
that one of them writes; it is a *reduction* loop when the only such conflicts are the
updates of a reduction block to its own accumulator (commutative, so their order does not
matter, but they cannot run at the same time); otherwise it *carries* a dependence.

The test is conservative (it may call a loop carried that is not) and relies on one invariant
that ``te`` and every schedule primitive keep: a block's iter var bindings map distinct loop
iterations to distinct iter var values. For a loop ``v`` it checks, on indices written in terms
of loop vars (iter vars replaced by their bindings):

* every block write not of a reduction over ``v`` is *pinned* by ``v``: each spatial iter var
  bound through ``v`` is a plain index of the store, and the loops behind those bindings bind
  no reduction iter var; a store outside blocks needs ``v`` itself as an index;
* every other access to a written buffer agrees with each write on the index positions where
  the write depends on ``v`` (the same expression), so it touches only this iteration's data;
* a buffer reduced over ``v`` is accessed by its reduction block alone.

Buffers allocated inside the loop are private to an iteration and never conflict.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.loop import Block, Buffer, For, Load, Scalar, Store, TensorFunc, stmt_scalars, walk_scalars, walk_stmts
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.schedule.analysis import block_stores
from tilework.schedule.tree import LeafCtx, LoopRef, dim_vars, find_loop, leaves, scalar_equal, scalar_vars, subst_scalar

INDEPENDENT = "independent"
REDUCTION = "reduction"
CARRIED = "carried"


@dataclass(frozen=True)
class Dependence:
    kind: str  # INDEPENDENT | REDUCTION | CARRIED
    reason: str = ""  # why the loop is not independent


@dataclass(frozen=True)
class Access:
    buffer: Buffer
    indices: tuple[Scalar, ...]  # in terms of loop vars
    write: bool
    leaf: int
    what: str  # "block B" or "a store"


def _accesses(i: int, ctx: LeafCtx) -> list[Access]:
    leaf = ctx.leaf
    out: list[Access] = []
    binds: dict[SymVar, Dim] = {}
    stmts: list = []
    if isinstance(leaf, Block):
        binds = {iv.var: iv.binding for iv in leaf.iter_vars}
        what = f"block {leaf.name!r}"
        for body in (leaf.init, leaf.body):
            if body is not None:
                stmts.extend(walk_stmts(body))
    else:
        what = "a store outside blocks"
        stmts.append(leaf)
    scalars: list[Scalar] = list(ctx.guards)
    for s in stmts:
        if isinstance(s, Store):
            idx = tuple(subst_scalar(x, binds) for x in s.indices)
            out.append(Access(s.buffer, idx, True, i, what))
        scalars.extend(stmt_scalars(s))
    for x in scalars:
        for e in walk_scalars(x):
            if isinstance(e, Load):
                idx = tuple(subst_scalar(y, binds) for y in e.indices)
                out.append(Access(e.buffer, idx, False, i, what))
    return out


def _reduces_over(block: Block, v: SymVar) -> bool:
    return any(iv.kind == "reduce" and v in dim_vars(iv.binding) for iv in block.iter_vars)


def _separates(x: Scalar, v: SymVar, inner: set[SymVar]) -> bool:
    """Whether index ``x`` (in loop vars) differs between any two iterations of loop ``v``:
    ``x = c * v + r`` with ``c`` a nonzero constant and the part of ``r`` that loops inside
    ``v`` vary staying in ``[0, |c|)``."""
    if not isinstance(x, (int, SymExpr)) or v not in dim_vars(x):
        return False
    r = sym_walk.substitute(x, {v: 0})
    c = sym.sub(sym_walk.substitute(x, {v: 1}), r)
    if not isinstance(c, int) or c == 0 or not sym.prove_eq(x, sym.add(sym.mul(c, v), r)):
        return False
    r_inner = sym.sub(r, sym_walk.substitute(r, {u: 0 for u in inner}))
    if not dim_vars(r_inner) <= inner:
        return False
    lo, hi = sym.bounds(r_inner)
    return lo is not None and hi is not None and lo >= 0 and hi < abs(c)


def _pinned(ctx: LeafCtx, v: SymVar) -> str:
    """Why the writes of leaf ``ctx`` are not pinned by loop ``v`` ('' when they are)."""
    leaf = ctx.leaf
    inner = {g.var for g in ctx.loops}
    if isinstance(leaf, Store):
        if any(_separates(x, v, inner) for x in leaf.indices):
            return ""
        return f"a store to {leaf.buffer.name!r} outside blocks has no index that separates iterations of loop {v.name!r}"
    assert isinstance(leaf, Block)
    binds = {iv.var: iv.binding for iv in leaf.iter_vars}
    stores = [
        s
        for s in block_stores(leaf)
        if not any(_separates(subst_scalar(x, binds), v, inner) for x in s.indices)
    ]
    if not stores:
        return ""
    # Through iter vars: each spatial iter var bound to ``v`` indexes the store.
    sv = [iv for iv in leaf.iter_vars if iv.kind == "spatial" and v in dim_vars(iv.binding)]
    if not sv:
        names = ", ".join(sorted({s.buffer.name for s in stores}))
        return (
            f"block {leaf.name!r} does not depend on loop {v.name!r}: every iteration writes "
            f"the same elements of {names}"
        )
    for s in stores:
        for iv in sv:
            if not any(x is iv.var for x in s.indices):
                return (
                    f"block {leaf.name!r} writes {s.buffer.name!r} at indices that do not include "
                    f"its iter var {iv.var.name!r} (bound to loop {v.name!r})"
                )
    spatial_loops: set[SymVar] = set().union(*(dim_vars(iv.binding) for iv in sv))
    for iv in leaf.iter_vars:
        if iv.kind == "reduce" and dim_vars(iv.binding) & spatial_loops:
            return f"block {leaf.name!r} binds spatial and reduction iter vars to the same loops"
    return ""


def loop_dependence(func: TensorFunc, loop: LoopRef) -> Dependence:
    """Classify loop ``loop`` of ``func`` as independent, a reduction loop, or carried."""
    _, f = find_loop(func, loop)
    return dependence_of(f)


def dependence_of(f: For) -> Dependence:
    """Classify the loop statement ``f`` (see the module doc)."""
    v = f.var
    if isinstance(f.extent, int) and f.extent <= 1:
        return Dependence(INDEPENDENT)
    ctxs = leaves(f.body)
    accesses = [a for i, c in enumerate(ctxs) for a in _accesses(i, c)]
    reducing = {
        i for i, c in enumerate(ctxs) if isinstance(c.leaf, Block) and _reduces_over(c.leaf, v)
    }
    # A buffer allocated inside the loop is private to one iteration.
    private: set[Buffer] = {b for c in ctxs for b in c.allocs}
    written = [a for a in accesses if a.write and a.buffer not in private]
    for i, c in enumerate(ctxs):
        if i in reducing or not any(a.write and a.leaf == i for a in written):
            continue
        why = _pinned(c, v)
        if why:
            return Dependence(CARRIED, why)
    for buf in dict.fromkeys(a.buffer for a in written):
        accs = [a for a in accesses if a.buffer is buf]
        owners = {a.leaf for a in accs if a.write and a.leaf in reducing}
        if owners:
            others = [a for a in accs if a.leaf not in owners]
            if len(owners) > 1 or others:
                who = others[0].what if others else "another block"
                return Dependence(
                    CARRIED,
                    f"{who} accesses {buf.name!r} while the reduction over loop {v.name!r} "
                    f"into it is in progress",
                )
            continue
        for w in (a for a in accs if a.write):
            for a in accs:
                if a is w or len(a.indices) != len(w.indices):
                    continue
                for wi, ai in zip(w.indices, a.indices):
                    if v in scalar_vars(wi) and not scalar_equal(wi, ai):
                        kind = "writes" if a.write else "reads"
                        return Dependence(
                            CARRIED,
                            f"{a.what} {kind} {buf.name!r} at [{_fmt(a.indices)}] while {w.what} "
                            f"writes [{_fmt(w.indices)}]: iterations of loop {v.name!r} overlap",
                        )
    return Dependence(REDUCTION if reducing else INDEPENDENT)


def _fmt(idx: tuple[Scalar, ...]) -> str:
    return ", ".join(sym.to_str(x) if isinstance(x, (int, sym.SymExpr)) else "..." for x in idx)
