"""Split a nest at the boundaries of a concat's pieces, for the elementwise rule.

A concat legalizes to one select per piece, ``x0[..] if i < n0 else (x1[..] if i < n1 else
..)`` along its axis ``i``: every element walks the chain, and a vectorized loop evaluates
every side (a DenseNet layer's concat of 25 pieces, with its batch norm and ReLU, ran
5-10x slower than the copy it is). Here the loop of ``i`` moves outermost and is peeled at the
constant cut points (``loop_primitives.peel``), and in each piece the selects that its range
of ``i`` decides are replaced by the side they take: each piece becomes its own perfect nest
that reads one input, for ``spatial_nest`` to schedule like any other. Cut points that are
not constants (a piece of symbolic size) leave the nest as it is; where the split axis is
outside the vectorized loop, the C emitter then makes one copy of that loop per input
(``codegen.c.hoist.unswitch_plan``: unswitching on its loop-invariant selects).
"""

from __future__ import annotations

from tilework.errors import ScheduleError
from tilework.ir import sym
from tilework.ir.loop import Binary, Block, For, PExpr, Scalar, Select, Store, TensorFunc
from tilework.ir.sym import Dim, SymVar
from tilework.schedule import loop_primitives as lp
from tilework.schedule.rules.common import attempt, chain, lanes, leaf_of, loop, out_dtype, path_of, vectorize_innermost, worth_parallel
from tilework.schedule.tree import dim_vars, get_at, map_scalars, map_stmt_scalars, replace_at, walk

MAX_PIECES = 256  # more cuts than this: left as it is (each piece is a copy of the body)


def split_at_pieces(func: TensorFunc, top: For) -> tuple[TensorFunc, list[SymVar]]:
    """Split the perfect nest at ``top`` at the cuts of the selects along one of its loops
    (see the module docstring). Returns the function and the outermost loop var of every
    nest left to schedule: ``[top.var]`` and ``func`` as it was when there is nothing to
    split. Along the innermost loop (a channel-last concat) the pieces stay inside the outer
    loops, which are fused and run in parallel, and each piece's loop is vectorized: then
    nothing is left to schedule."""
    ch = chain(top)
    leaf = leaf_of(top)
    if len(ch) < 2 or not isinstance(leaf, Block) or not isinstance(leaf.body, Store):
        return func, [top.var]
    binds = {iv.var: iv.binding for iv in leaf.iter_vars}
    outer = {f.var: f for f in ch if isinstance(f.extent, int)}
    cuts: dict[SymVar, set[int]] = {}
    for s in _selects(leaf.body.value):
        found = _cut(s.cond, binds)
        if found is not None and found[0] in outer and 0 < found[1] < outer[found[0]].extent:  # type: ignore[operator]
            cuts.setdefault(found[0], set()).add(found[1])
    if not cuts:
        return func, [top.var]
    v = max(cuts, key=lambda k: len(cuts[k]))
    points = sorted(cuts[v])
    if len(points) >= MAX_PIECES:
        return func, [top.var]
    k = [f.var for f in ch].index(v)
    inner = k == len(ch) - 1
    extent = outer[v].extent
    assert isinstance(extent, int)
    if inner and min(b - a for a, b in zip([0, *points], [*points, extent])) < lanes(out_dtype(func)):
        return func, [top.var]  # pieces shorter than a vector: one nest (spatial_nest counts short rows)
    try:
        moved = lp.reorder(func, v, *(f.var for f in ch[:k])) if k and not inner else func
        out, pieces = lp.peel(moved, v, points)
    except ScheduleError:
        return func, [top.var]
    for p, lo in zip(pieces, [0, *points]):
        f = loop(out, p)
        path = path_of(out, f)
        piece = _Piece(p, lo, f.extent, {iv.var: iv.binding for _, b in walk(f) if isinstance(b, Block) for iv in b.iter_vars})
        out = out.replace(body=replace_at(out.body, path, For(f.var, f.extent, map_stmt_scalars(f.body, piece.decide), f.kind)))
    if not inner:
        return out, pieces
    outers = [f.var for f in ch[:-1]]
    if worth_parallel([f.extent for f in ch]):
        at = path_of(out, loop(out, outers[0]))
        out = attempt(out, lp.fuse, *outers) if len(outers) > 1 else out
        par = get_at(out.body, at)
        assert isinstance(par, For)
        out = attempt(out, lp.parallel, par.var)
    for p in pieces:
        out = vectorize_innermost(out, p)
    return out, []


def _selects(x: Scalar) -> list[Select]:
    found: list[Select] = []

    def visit(e: PExpr) -> None:
        if isinstance(e, Select):
            found.append(e)
        return None

    map_scalars(x, visit)
    return found


def _cut(cond: Scalar, binds: dict[SymVar, Dim]) -> tuple[SymVar, int] | None:
    """``(loop var, n)`` when ``cond`` is ``i < n`` with ``i`` an iter var bound to that loop
    var (or the loop var itself) and ``n`` a constant."""
    if not isinstance(cond, Binary) or cond.op != "<" or not isinstance(cond.b, int) or not isinstance(cond.a, SymVar):
        return None
    b = binds.get(cond.a, cond.a)
    return (b, cond.b) if isinstance(b, SymVar) else None


class _Piece:
    """The loop ``var`` of one piece, over ``[lo, lo + extent)`` of the split axis (from 0),
    with the bindings of the iter vars of the blocks under it."""

    def __init__(self, var: SymVar, lo: int, extent: Dim, binds: dict[SymVar, Dim]) -> None:
        self.var, self.lo, self.extent, self.binds = var, lo, extent, binds

    def decide(self, e: PExpr) -> Scalar | None:
        """The side of a select whose test ``i < c`` this piece's range of ``i`` decides."""
        if not isinstance(e, Select) or not isinstance(e.cond, Binary) or e.cond.op != "<" or not isinstance(e.cond.b, int):
            return None
        a = e.cond.a
        i = self.binds.get(a, a) if isinstance(a, SymVar) else None
        if i is None or not isinstance(self.extent, int) or self.var not in dim_vars(i) or not sym.prove_eq(i, sym.add(self.var, self.lo)):
            return None
        if self.lo + self.extent <= e.cond.b:
            return e.a
        if self.lo >= e.cond.b:
            return e.b
        return None
