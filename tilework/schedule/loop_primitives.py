"""Loop primitives: split, fuse, reorder, tile, merge_loops and the loop kinds.

Each is a pure function ``TensorFunc -> TensorFunc``. Loops are named by their var or by its
name; new loops get fresh names derived from the old ones (``i`` split in two gives ``i_0``
and ``i_1``), so a schedule reads as a script of names. A primitive that would change the
program's meaning raises ``ScheduleError`` and says which loop and why.
"""

from __future__ import annotations

from typing import Sequence

from tilework.errors import ScheduleError
from tilework.ir import sym
from tilework.ir.loop import Block, For, SeqStmt, Stmt, TensorFunc
from tilework.ir.sym import Dim, SymVar
from tilework.schedule.dependence import CARRIED, INDEPENDENT, REDUCTION, _dependence
from tilework.schedule.tree import (
    LoopRef,
    Path,
    ancestors,
    dim_vars,
    find_loop,
    fresh_name,
    get_at,
    guard_leaves,
    less_than,
    new_loop_var,
    replace_at,
    seq,
    subst_stmt,
    used_names,
    walk,
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
    return _split(func, loop, factors)[0]


def _split(
    func: TensorFunc, loop: LoopRef, factors: Sequence[Dim | None]
) -> tuple[TensorFunc, list[SymVar]]:
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
        dep = _dependence(old)
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
        needs = set() if isinstance(f.extent, int) else set(sym.free_vars(f.extent))
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
            if not isinstance(g.extent, int) and f.var in sym.free_vars(g.extent):
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
        mapping[fs[k][1].var] = q if k == 0 else sym.floormod(q, extents[k])
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
        func, (outer, inner) = _split(func, v, [None, fac])
        outers.append(outer)
        inners.append(inner)
    return reorder(func, *outers, *inners)


def _set_kind(func: TensorFunc, loop: LoopRef, kind: str) -> TensorFunc:
    path, f = find_loop(func, loop, kind)
    return func.replace(body=replace_at(func.body, path, For(f.var, f.extent, f.body, kind)))


def parallel(func: TensorFunc, loop: LoopRef) -> TensorFunc:
    """Run the iterations of ``loop`` on parallel threads. Refused when the loop carries a
    dependence or is a reduction loop, or when it is inside or around another parallel loop."""
    path, f = find_loop(func, loop, "parallel")
    for _, a in ancestors(func.body, path):
        if isinstance(a, For) and a.kind == "parallel":
            raise ScheduleError(f"parallel: loop {f.var.name!r} is inside parallel loop {a.var.name!r}")
    for _, s in walk(f.body):
        if isinstance(s, For) and s.kind in ("parallel", "vectorized"):
            raise ScheduleError(f"parallel: loop {f.var.name!r} encloses {s.kind} loop {s.var.name!r}")
    _require_independent(f, "parallel")
    return _set_kind(func, loop, "parallel")


def vectorize(func: TensorFunc, loop: LoopRef) -> TensorFunc:
    """Run the iterations of the innermost loop ``loop`` as SIMD lanes. Refused when the loop
    carries a dependence or is a reduction loop (``rfactor`` first), or is not innermost."""
    _, f = find_loop(func, loop, "vectorize")
    for _, s in walk(f.body):
        if isinstance(s, For):
            raise ScheduleError(f"vectorize: loop {f.var.name!r} is not innermost (it encloses loop {s.var.name!r})")
    _require_independent(f, "vectorize")
    return _set_kind(func, loop, "vectorized")


def _require_independent(f: For, what: str) -> None:
    dep = _dependence(f)
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
    dep = _dependence(merged)
    if dep.kind != INDEPENDENT:
        raise ScheduleError(
            f"merge_loops: the merged loop {first.var.name!r} would not be independent: "
            + (dep.reason or "it is a reduction loop")
        )
    stmts = list(parent.stmts)
    stmts[idxs[0] : idxs[-1] + 1] = [merged]
    return func.replace(body=replace_at(func.body, parent_path, seq(stmts)))
