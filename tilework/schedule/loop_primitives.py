"""Loop primitives: split, fuse, reorder, tile, merge_loops, peel, the loop kinds, and the last
steps of a schedule (partition, hoist_guards).

Each is a pure function ``TensorFunc -> TensorFunc``. Loops are named by their var or by its
name; new loops get fresh names derived from the old ones (``i`` split in two gives ``i_0``
and ``i_1``), so a schedule reads as a script of names. A primitive that would change the
program's meaning raises ``ScheduleError`` and says which loop and why.
"""

from __future__ import annotations

from typing import Sequence

from tilework.errors import ScheduleError
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.loop import Binary, Block, For, IfThenElse, SeqStmt, Stmt, TensorFunc
from tilework.ir.sym import Dim, SymVar
from tilework.schedule.analysis import loads_of
from tilework.schedule.dependence import CARRIED, INDEPENDENT, REDUCTION, dependence_of
from tilework.schedule.tree import (
    LoopRef,
    Path,
    ancestors,
    block_names,
    children,
    conj,
    conjuncts,
    dim_vars,
    find_loop,
    fresh_name,
    get_at,
    guard_leaves,
    less_than,
    new_loop_var,
    rebind,
    rename_blocks,
    replace_at,
    scalar_vars,
    seq,
    splice_at,
    subst_stmt,
    used_names,
    walk,
    with_children,
)


def _dims(d: Dim) -> str:
    return sym.to_str(d)


def split(func: TensorFunc, loop: LoopRef, factors: Sequence[Dim | None]) -> TensorFunc:
    """Split ``loop`` into ``len(factors)`` nested loops, outermost first, named
    ``<name>_0``, ``<name>_1``, ... The old var becomes ``sum(l_k * prod(factors[k+1:]))``.

    At most one factor may be ``None``: it is inferred as the ceiling quotient of the extent by
    the others. Factors must be positive (symbolic ones provably >= 1) and their product
    provably at least the extent. When the product is not provably equal to the extent, every
    block and store under the loop is guarded by ``old_var < extent``.
    """
    return split_vars(func, loop, factors)[0]


def split_vars(
    func: TensorFunc, loop: LoopRef, factors: Sequence[Dim | None]
) -> tuple[TensorFunc, list[SymVar]]:
    """``split``, also returning the new loop vars, outermost first."""
    path, f = find_loop(func, loop, "split")
    if len(factors) < 2:
        raise ScheduleError(f"split: loop {f.var.name!r} needs at least two factors, got {list(factors)}")
    if sum(x is None for x in factors) > 1:
        raise ScheduleError(f"split: at most one factor of loop {f.var.name!r} may be None")
    for x in factors:
        if x is None:
            continue
        if isinstance(x, bool) or not isinstance(x, (int, sym.SymExpr)):
            raise ScheduleError(f"split: factor {x!r} of loop {f.var.name!r} is not a dim")
        if not sym.prove_ge(x, 1):
            raise ScheduleError(
                f"split: factor {_dims(x)} of loop {f.var.name!r} is not positive"
                + ("" if isinstance(x, int) else " (not provably >= 1)")
            )
    known = sym.product(x for x in factors if x is not None)
    exts: list[Dim] = [sym.ceildiv(f.extent, known) if x is None else x for x in factors]
    total = sym.product(exts)
    if not sym.prove_ge(total, f.extent):
        raise ScheduleError(
            f"split: factors {[_dims(e) for e in exts]} of loop {f.var.name!r} cover "
            f"{_dims(total)} iterations, fewer than its extent {_dims(f.extent)}"
        )
    used = used_names(func)
    new_vars = [new_loop_var(fresh_name(used, f"{f.var.name}_{k}"), e) for k, e in enumerate(exts)]
    value: Dim = 0
    for v, e in zip(new_vars, exts):
        value = value * e + v
    body = subst_stmt(f.body, {f.var: value})
    if not sym.prove_eq(total, f.extent):
        body = guard_leaves(body, less_than(value, f.extent))
    out: Stmt = body
    for v, e in reversed(list(zip(new_vars, exts))):
        out = For(v, e, out, "serial")
    return func.replace(body=replace_at(func.body, path, out)), new_vars


def _chain(func: TensorFunc, refs: Sequence[LoopRef], what: str) -> tuple[Path, list[For]]:
    """The perfectly nested chain of loops from the outermost to the innermost of ``refs``."""
    found = [find_loop(func, r, what) for r in refs]
    if len({id(f) for _, f in found}) != len(found):
        raise ScheduleError(f"{what}: a loop is named twice in {[f.var.name for _, f in found]}")
    found.sort(key=lambda pf: len(pf[0]))
    top_path = found[0][0]
    for p, f in found[1:]:
        if p[: len(top_path)] != top_path:
            raise ScheduleError(
                f"{what}: loops {found[0][1].var.name!r} and {f.var.name!r} are not nested "
                f"in one another"
            )
    for (p1, f1), (p2, f2) in zip(found, found[1:]):
        if p2[: len(p1)] != p1:
            raise ScheduleError(
                f"{what}: loops {f1.var.name!r} and {f2.var.name!r} are not nested in one another"
            )
    chain: list[For] = []
    s: Stmt = found[0][1]
    last = found[-1][1]
    while True:
        if not isinstance(s, For):
            raise ScheduleError(
                f"{what}: loops {[f.var.name for _, f in found]} are not perfectly nested: the body "
                f"of loop {chain[-1].var.name!r} is not a single loop"
            )
        chain.append(s)
        if s is last:
            return top_path, chain
        s = s.body


def reorder(func: TensorFunc, *loops: LoopRef) -> TensorFunc:
    """Reorder perfectly nested loops: the loops named take, in the order given, the places
    that they hold in the nest; loops between them that are not named keep their places.

    Refused when the loops are not nested in one another, when something other than a single
    loop sits between them, or when a loop that moves carries a dependence (a reduction loop
    may move: its updates commute).
    """
    if len(loops) < 2:
        return func
    path, chain = _chain(func, loops, "reorder")
    named = [find_loop(func, r, "reorder")[1] for r in loops]
    slots = iter(named)
    new_order = [next(slots) if c in named else c for c in chain]
    for old, new in zip(chain, new_order):
        if old is new:
            continue
        dep = dependence_of(old)
        if dep.kind == CARRIED:
            raise ScheduleError(f"reorder: loop {old.var.name!r} cannot move: {dep.reason}")
    _check_extents(chain, new_order)
    inner: Stmt = chain[-1].body
    for f in reversed(new_order):
        inner = For(f.var, f.extent, inner, f.kind)
    return func.replace(body=replace_at(func.body, path, inner))


def _check_extents(old: list[For], new: list[For]) -> None:
    for k, f in enumerate(new):
        outer_vars = {g.var for g in new[:k]}
        needs = set() if isinstance(f.extent, int) else set(sym_walk.free_vars(f.extent))
        inner_loops = {g.var for g in old} - outer_vars
        bad = needs & inner_loops
        if bad:
            raise ScheduleError(
                f"reorder: the extent of loop {f.var.name!r} depends on loop "
                f"{sorted(v.name for v in bad)[0]!r}, which would no longer enclose it"
            )


def fuse(func: TensorFunc, *loops: LoopRef) -> TensorFunc:
    """Fuse adjacent, perfectly nested loops (outermost first, each the whole body of the one
    before) into one loop named ``<a>_<b>_fused`` whose extent is the product of theirs. Order
    of execution is unchanged. The loops must be serial (fuse before annotating)."""
    if len(loops) < 2:
        raise ScheduleError("fuse: needs at least two loops")
    fs = [find_loop(func, r, "fuse") for r in loops]
    for (p1, f1), (p2, f2) in zip(fs, fs[1:]):
        if f1.body is not f2:
            raise ScheduleError(
                f"fuse: loops {f1.var.name!r} and {f2.var.name!r} are not adjacent: the body of "
                f"{f1.var.name!r} is not exactly loop {f2.var.name!r}"
            )
    for _, f in fs:
        if f.kind != "serial":
            raise ScheduleError(f"fuse: loop {f.var.name!r} is {f.kind}; fuse before annotating")
        for _, g in fs:
            if not isinstance(g.extent, int) and f.var in sym_walk.free_vars(g.extent):
                raise ScheduleError(
                    f"fuse: the extent of loop {g.var.name!r} depends on loop {f.var.name!r}"
                )
    extents = [f.extent for _, f in fs]
    total = sym.product(extents)
    used = used_names(func)
    fused = new_loop_var(fresh_name(used, "_".join(f.var.name for _, f in fs) + "_fused"), total)
    mapping: dict[SymVar, Dim] = {}
    stride: Dim = 1
    for k in reversed(range(len(fs))):
        q = sym.floordiv(fused, stride)
        if sym.prove_eq(extents[k], 1):
            mapping[fs[k][1].var] = 0
        elif all(sym.prove_eq(e, 1) for e in extents[:k]):
            mapping[fs[k][1].var] = q  # the loops outside run once: no wrap-around
        else:
            mapping[fs[k][1].var] = sym.floormod(q, extents[k])
        stride = sym.mul(stride, extents[k])
    body = subst_stmt(fs[-1][1].body, mapping)
    return func.replace(body=replace_at(func.body, fs[0][0], For(fused, total, body, "serial")))


def tile(func: TensorFunc, loops: Sequence[LoopRef], factors: Sequence[Dim]) -> TensorFunc:
    """Split each of the perfectly nested ``loops`` by its inner ``factor`` and order the
    results outer tiles first: ``tile(f, [i, j], [8, 32])`` gives loops ``i_0, j_0, i_1, j_1``."""
    if len(loops) != len(factors):
        raise ScheduleError(f"tile: {len(loops)} loops but {len(factors)} factors")
    names = [find_loop(func, r, "tile")[1].var for r in loops]
    _chain(func, names, "tile")
    outers: list[SymVar] = []
    inners: list[SymVar] = []
    for v, fac in zip(names, factors):
        func, (outer, inner) = split_vars(func, v, [None, fac])
        outers.append(outer)
        inners.append(inner)
    return reorder(func, *outers, *inners)


_PRIMITIVE = {"parallel": "parallel", "vectorized": "vectorize", "unrolled": "unroll", "serial": "serial"}


def _set_kind(func: TensorFunc, loop: LoopRef, kind: str) -> TensorFunc:
    what = _PRIMITIVE[kind]
    path, f = find_loop(func, loop, what)
    if kind != "serial" and f.kind not in ("serial", kind):
        raise ScheduleError(f"{what}: loop {f.var.name!r} is already {f.kind} (make it serial first)")
    return func.replace(body=replace_at(func.body, path, For(f.var, f.extent, f.body, kind)))


def parallel(func: TensorFunc, loop: LoopRef) -> TensorFunc:
    """Run the iterations of ``loop`` on parallel threads. Refused when the loop carries a
    dependence or is a reduction loop, or when it is inside or around another parallel loop."""
    path, f = find_loop(func, loop, "parallel")
    for _, a in ancestors(func.body, path):
        if isinstance(a, For) and a.kind == "parallel":
            raise ScheduleError(f"parallel: loop {f.var.name!r} is inside parallel loop {a.var.name!r}")
    for _, s in walk(f.body):
        if isinstance(s, For) and s.kind == "parallel":
            raise ScheduleError(f"parallel: loop {f.var.name!r} encloses {s.kind} loop {s.var.name!r}")
    _require_independent(f, "parallel")
    return _set_kind(func, loop, "parallel")


def vectorize(func: TensorFunc, loop: LoopRef) -> TensorFunc:
    """Run the iterations of the innermost loop ``loop`` as SIMD lanes. Refused when the loop
    carries a dependence or is a reduction loop (``rfactor`` first), or is not innermost; an
    unrolled loop of a constant extent inside it does not count (the compiler unrolls it
    before it vectorizes: each lane runs its copies, as in an unroll-and-jam)."""
    _, f = find_loop(func, loop, "vectorize")
    for _, s in walk(f.body):
        if isinstance(s, For) and not (s.kind == "unrolled" and isinstance(s.extent, int)):
            raise ScheduleError(f"vectorize: loop {f.var.name!r} is not innermost (it encloses loop {s.var.name!r})")
    _require_independent(f, "vectorize")
    return _set_kind(func, loop, "vectorized")


def _require_independent(f: For, what: str) -> None:
    dep = dependence_of(f)
    if dep.kind == REDUCTION:
        raise ScheduleError(
            f"{what}: loop {f.var.name!r} is a reduction loop ({_reduced(f)}); its iterations "
            f"update the same accumulator (rfactor it first)"
        )
    if dep.kind != INDEPENDENT:
        raise ScheduleError(f"{what}: loop {f.var.name!r} carries a dependence: {dep.reason}")


def _reduced(f: For) -> str:
    names = [
        s.name
        for _, s in walk(f.body)
        if isinstance(s, Block)
        and any(iv.kind == "reduce" and f.var in dim_vars(iv.binding) for iv in s.iter_vars)
    ]
    return "it binds a reduction iter var of block " + ", ".join(repr(n) for n in names)


def unroll(func: TensorFunc, loop: LoopRef) -> TensorFunc:
    """Unroll ``loop`` fully. Always valid; refused for a symbolic extent, which cannot be
    unrolled fully."""
    _, f = find_loop(func, loop, "unroll")
    if not isinstance(f.extent, int):
        raise ScheduleError(
            f"unroll: loop {f.var.name!r} has symbolic extent {_dims(f.extent)}; only a constant "
            f"extent can be unrolled (split it by a constant first)"
        )
    return _set_kind(func, loop, "unrolled")


def serial(func: TensorFunc, loop: LoopRef) -> TensorFunc:
    """Make ``loop`` serial again (drops any annotation)."""
    return _set_kind(func, loop, "serial")


def merge_loops(func: TensorFunc, *loops: LoopRef) -> TensorFunc:
    """Merge sibling loops with provably equal extents that follow one another in the same
    sequence into the first of them: ``for i: A; for i2: B`` becomes ``for i: {A; B}``.

    Valid when the merged loop is independent (then any order of its iterations, the original
    one included, gives the same result); refused otherwise, and when the loops are not
    consecutive siblings or their extents differ.
    """
    if len(loops) < 2:
        return func
    fs = [find_loop(func, r, "merge_loops") for r in loops]
    parent_path = fs[0][0][:-1]
    parent = get_at(func.body, parent_path) if fs[0][0] else None
    idxs = [p[-1] if p else -1 for p, _ in fs]
    if not isinstance(parent, SeqStmt) or any(p[:-1] != parent_path for p, _ in fs):
        raise ScheduleError(
            f"merge_loops: loops {[f.var.name for _, f in fs]} are not siblings in one sequence"
        )
    if idxs != list(range(idxs[0], idxs[0] + len(idxs))):
        raise ScheduleError(
            f"merge_loops: loops {[f.var.name for _, f in fs]} are not consecutive in their sequence"
        )
    first = fs[0][1]
    bodies: list[Stmt] = [first.body]
    for _, f in fs[1:]:
        if not sym.prove_eq(f.extent, first.extent):
            raise ScheduleError(
                f"merge_loops: loop {f.var.name!r} has extent {_dims(f.extent)} but loop "
                f"{first.var.name!r} has {_dims(first.extent)}"
            )
        if f.kind != first.kind:
            raise ScheduleError(f"merge_loops: loop {f.var.name!r} is {f.kind}, {first.var.name!r} is {first.kind}")
        bodies.append(subst_stmt(f.body, {f.var: first.var}))
    merged = For(first.var, first.extent, seq(bodies), first.kind)
    dep = dependence_of(merged)
    if dep.kind != INDEPENDENT:
        raise ScheduleError(
            f"merge_loops: the merged loop {first.var.name!r} would not be independent: "
            + (dep.reason or "it is a reduction loop")
        )
    stmts = list(parent.stmts)
    stmts[idxs[0] : idxs[-1] + 1] = [merged]
    return func.replace(body=replace_at(func.body, parent_path, seq(stmts)))


def hoist_guards(func: TensorFunc) -> TensorFunc:
    """Move each condition out of the loops it does not depend on: ``for j: if c: S``
    becomes ``if c: for j: S`` when ``c`` uses neither ``j`` nor any buffer; and a guard
    ``j < n`` on the loop var itself (``n`` free of ``j``) becomes the loop's extent:
    ``for j in min(extent, n): S``. Always valid (a loop whose body does nothing may as well
    not run, and iterations that do nothing may as well be left out); it leaves no vector
    loop testing a condition that is the same for all its lanes, nor one whose lanes past
    ``n`` are masked off (gcc 12 leaves such a loop scalar when its body loads under the
    mask: a 16-column linear in 32-column AVX-512 tiles stored 4x slower). Loops are no
    longer perfectly nested afterwards, so this is the last step of a schedule."""
    return func.replace(body=_hoist(func.body))


def _hoist(s: Stmt) -> Stmt:
    s = with_children(s, [_hoist(c) for c in children(s)])
    if not isinstance(s, For) or not isinstance(s.body, IfThenElse) or s.body.else_body is not None:
        return s
    cs = conjuncts(s.body.cond)
    out = [c for c in cs if s.var not in scalar_vars(c) and not loads_of(c)]
    ends = [c for c in cs if _end_guard(c, s.var) is not None]
    if not out and not ends:
        return s
    stay = [c for c in cs if not any(c is o for o in (*out, *ends))]
    inner = s.body.then_body if not stay else IfThenElse(conj(stay), s.body.then_body)
    extent = s.extent
    for c in ends:
        n = _end_guard(c, s.var)
        assert n is not None
        extent = sym.min_(extent, n)  # (a loop of a negative extent runs no iteration)
    loop = For(s.var, extent, inner, s.kind)
    return IfThenElse(conj(out), loop) if out else loop


def _end_guard(cond: object, v: SymVar) -> Dim | None:
    """``n`` when ``cond`` is ``v < n`` with ``n`` free of ``v``."""
    if not isinstance(cond, Binary) or cond.op != "<" or cond.a is not v:
        return None
    n = cond.b
    if not isinstance(n, (int, sym.SymExpr)) or v in dim_vars(n):
        return None
    return n


def partition(func: TensorFunc, loop: LoopRef) -> TensorFunc:
    """Run ``loop`` as two loops: first the iterations where the bounds guards under it
    (``c * loop + e < n`` with ``0 <= e < c``, what ``split`` adds) provably hold, without
    those guards, then the remaining ones (``<loop>_rest``), still guarded, in a copy of the
    body whose vars, buffers and blocks are renamed (``<block>_1``...). Always valid (the
    iterations run in the same order); it takes the tests out of the steady-state iterations.
    Loops are no longer perfectly nested afterwards.

    Refused when no such guard is under the loop or the guards disagree on ``c`` and ``n``.
    """
    what = "partition"
    path, f = find_loop(func, loop, what)
    v = f.var
    found: list[tuple[int, Dim]] = []
    for _, s in walk(f.body):
        if isinstance(s, IfThenElse):
            for c in conjuncts(s.cond):
                m = _bounds_guard(c, v)
                if m is not None:
                    found.append(m)
    if not found:
        raise ScheduleError(f"{what}: no guard of the form c * {v.name} + e < n (0 <= e < c) under loop {v.name!r}")
    step, bound = found[0]
    if any(c != step or not sym.prove_eq(n, bound) for c, n in found):
        raise ScheduleError(f"{what}: the guards under loop {v.name!r} disagree on their step or bound")
    full = sym.min_(sym.floordiv(bound, step), f.extent)
    used = used_names(func)
    vb = new_loop_var(fresh_name(used, f"{v.name}_rest"), sym.sub(f.extent, full))
    # The second copy binds its own loop vars, iter vars, buffers and block names.
    rest = rename_blocks(rebind(subst_stmt(f.body, {v: sym.add(full, vb)}), used), block_names(func))
    loops = [For(v, full, _drop_guards(f.body, v), f.kind), For(vb, sym.sub(f.extent, full), rest, f.kind)]
    return func.replace(body=splice_at(func.body, path, loops))


def peel(func: TensorFunc, loop: LoopRef, cuts: Sequence[int]) -> tuple[TensorFunc, list[SymVar]]:
    """Run ``loop`` as consecutive loops over the ranges between ``cuts`` (increasing constants
    inside its constant extent): ``for i in 10`` cut at ``(2, 8)`` becomes loops over ``[0, 2)``,
    ``[2, 8)`` and ``[8, 10)``, each a copy of the body (its vars, buffers and blocks renamed,
    the first keeping the old names) with ``i`` its own var plus the range's start. Returns the
    new loop vars in order. Always valid (the iterations run in the same order); a compiler
    knows each copy's range of ``i``, so tests and clamps that are decided on it fold away.
    Refused for a symbolic extent or cuts out of order or outside the loop."""
    what = "peel"
    path, f = find_loop(func, loop, what)
    if not isinstance(f.extent, int):
        raise ScheduleError(f"{what}: loop {f.var.name!r} has symbolic extent {_dims(f.extent)}; only a constant extent can be peeled")
    points = [0, *cuts, f.extent]
    if any(not isinstance(c, int) or isinstance(c, bool) for c in cuts) or any(a >= b for a, b in zip(points, points[1:])):
        raise ScheduleError(f"{what}: cuts {list(cuts)} of loop {f.var.name!r} must increase strictly inside (0, {f.extent})")
    used, names = used_names(func), block_names(func)
    loops = [For(f.var, points[1], f.body, f.kind)]  # (the var's bound stays the looser old one)
    for k, (lo, hi) in enumerate(zip(points[1:], points[2:]), 1):
        v = new_loop_var(fresh_name(used, f"{f.var.name}_p{k}"), hi - lo)
        body = rename_blocks(rebind(subst_stmt(f.body, {f.var: sym.add(v, lo)}), used), names)
        loops.append(For(v, hi - lo, body, f.kind))
    new_vars = [x.var for x in loops]
    return func.replace(body=splice_at(func.body, path, loops)), new_vars


def _bounds_guard(cond: object, v: SymVar) -> tuple[int, Dim] | None:
    """``(c, n)`` when ``cond`` is ``c * v + e < n`` with ``0 <= e < c`` and ``n`` free of ``v``."""
    if not isinstance(cond, Binary) or cond.op != "<":
        return None
    x, n = cond.a, cond.b
    if not isinstance(x, (int, sym.SymExpr)) or not isinstance(n, (int, sym.SymExpr)):
        return None
    if v in dim_vars(n) or v not in dim_vars(x):
        return None
    e = sym_walk.substitute(x, {v: 0})
    c = sym.sub(sym_walk.substitute(x, {v: 1}), e)
    if not isinstance(c, int) or c <= 0 or not sym.prove_eq(x, sym.add(sym.mul(c, v), e)):
        return None
    lo, hi = sym.bounds(e)
    if lo is None or hi is None or lo < 0 or hi >= c:
        return None
    return c, n


def _drop_guards(s: Stmt, v: SymVar) -> Stmt:
    """``s`` without the bounds guards on ``v`` (they hold in the steady-state loop)."""
    s = with_children(s, [_drop_guards(c, v) for c in children(s)])
    if not isinstance(s, IfThenElse) or s.else_body is not None:
        return s
    keep = [c for c in conjuncts(s.cond) if _bounds_guard(c, v) is None]
    if len(keep) == len(conjuncts(s.cond)):
        return s
    return IfThenElse(conj(keep), s.then_body) if keep else s.then_body
