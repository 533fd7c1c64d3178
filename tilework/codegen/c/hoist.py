"""Loop-invariant scalar expressions of a vectorized loop, computed once before it.

GCC does not always move an invariant expression out of an ``omp simd`` loop: in a
layer norm's last loop, ``(x[i] - mean[r]) * (1.0f / sqrtf(var[r] + eps)) * g[i] + b[i]``,
it kept a scalar ``sqrtss`` and ``divss`` per element and did not vectorize the loop at all
("latch block not empty"), 9.5 us for 8 rows of 384 on Zen 3 where 1.2 us do. The C emitter
declares each maximal invariant subexpression found here as a ``const`` before the loop and
reads that variable inside: the same operations on the same values, so the same bits.

An expression is hoisted only where computing it before the loop is as safe as in it: the
loop runs at least once (its extent provably >= 1), the expression sits in a store reached
through blocks without an init only (no condition, inner loop or allocation between), it has
no ``Select`` and no logical op (those evaluate a side conditionally), its loads read buffers
the loop does not write, every var it reads is bound outside the loop or by a block whose
binding is itself invariant, and it is a float (no integer division that could trap). Only
expressions that load, divide or call an intrinsic are worth a variable.

A vectorized loop whose stores choose between inputs on conditions that do not change in it
(a concat fused with what follows it: ``c0 ? x0 : c1 ? x1 : ... : xn``) is emitted once per
input, each copy reading one (``unswitch_plan``, ``unswitch_select``). The elementwise rule
already splits a concat's nest at constant cut points (``schedule.rules.pieces``); what reaches
here are pieces of symbolic size and chains the schedule left whole.

The index arithmetic's floor divisions and modulos are found here too (``stmt_dims``,
``nested_divmods``, ``divmods``): the emitter declares those that depend on a loop's var at the
top of its body (``_Emitter.hoist_divmods``).
"""

from __future__ import annotations

from typing import Iterator, Mapping

from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.loop import Allocate, Binary, Block, Buffer, Cast, Const, For, Intrin, Load, PExpr, PREFETCHES, Scalar, Select, SeqStmt, Stmt, Store, Unary, stmt_scalars, walk_scalars, walk_stmts
from tilework.ir.sym import Dim, FloorDiv, FloorMod, Max, Min, Poly, SymExpr, SymVar

_FLOATS = ("float32", "float64")


def invariant_exprs(loop: For, outer: set[SymVar]) -> tuple[list[tuple[SymVar, Dim]], list[PExpr]]:
    """For loop ``loop`` (``outer``: the vars in scope before it): the invariant block iter
    vars with their bindings (outermost first), which the expressions may read, and the
    maximal invariant subexpressions worth hoisting, in the order they occur."""
    ext = loop.extent
    if not (ext >= 1 if isinstance(ext, int) else sym.prove_ge(ext, 1)):
        return [], []
    written = {s.buffer for s in walk_stmts(loop.body) if isinstance(s, Store)}
    ok = set(outer)
    ok.discard(loop.var)
    ivs: list[tuple[SymVar, Dim]] = []
    found: list[PExpr] = []
    for store in _plain_stores(loop.body, ok, ivs):
        _collect(store.value, ok, written, found)
    return ivs, found


def _plain_stores(s: Stmt, ok: set[SymVar], ivs: list[tuple[SymVar, Dim]]) -> Iterator[Store]:
    """The stores of ``s`` reached through sequences and init-free blocks; the iter vars of
    those blocks whose bindings read only ``ok`` vars join ``ok`` (and ``ivs``)."""
    if isinstance(s, Store):
        yield s
    elif isinstance(s, SeqStmt):
        for c in s.stmts:
            yield from _plain_stores(c, ok, ivs)
    elif isinstance(s, Block) and s.init is None:
        for iv in s.iter_vars:
            if set(sym_walk.free_vars(iv.binding)) <= ok:
                ok.add(iv.var)
                ivs.append((iv.var, iv.binding))
        yield from _plain_stores(s.body, ok, ivs)


def _collect(x: Scalar, ok: set[SymVar], written: set[Buffer], found: list[PExpr]) -> None:
    if not isinstance(x, PExpr) or isinstance(x, Const) or isinstance(x, Intrin) and x.name in PREFETCHES:
        return  # a prefetch hints where it stands; its load is an address, not a value to hoist
    if x.dtype in _FLOATS and _worth(x) and _invariant(x, ok, written):
        found.append(x)
        return
    if isinstance(x, Binary) and x.op not in ("and", "or"):
        _collect(x.a, ok, written, found)
        _collect(x.b, ok, written, found)
    elif isinstance(x, Unary):
        _collect(x.a, ok, written, found)
    elif isinstance(x, Cast):
        _collect(x.value, ok, written, found)
    elif isinstance(x, Intrin):
        for a in x.args:
            _collect(a, ok, written, found)


def _invariant(x: Scalar, ok: set[SymVar], written: set[Buffer]) -> bool:
    if isinstance(x, (int, SymExpr)):
        return set(sym_walk.free_vars(x)) <= ok
    if isinstance(x, Const):
        return True
    if isinstance(x, Load):
        return x.buffer not in written and all(_invariant(i, ok, written) for i in x.indices)
    if isinstance(x, Binary):
        return x.op not in ("and", "or") and _invariant(x.a, ok, written) and _invariant(x.b, ok, written)
    if isinstance(x, Unary):
        return _invariant(x.a, ok, written)
    if isinstance(x, Cast):
        return _invariant(x.value, ok, written)
    if isinstance(x, Intrin):
        return x.name not in PREFETCHES and all(_invariant(a, ok, written) for a in x.args)
    return False  # a Select: one side is evaluated only under its condition


def _worth(x: Scalar) -> bool:
    if isinstance(x, (Load, Intrin)):
        return True
    if isinstance(x, Binary):
        return x.op == "/" or _worth(x.a) or _worth(x.b)
    if isinstance(x, Unary):
        return _worth(x.a)
    if isinstance(x, Cast):
        return _worth(x.value)
    return False


# -- selects whose condition a vectorized loop does not change (the emitter unswitches them) --

UNSWITCH_COPIES = 64  # the most copies of one vectorized loop that unswitching may emit


def unswitch_select(loop: For, outer: set[SymVar], decided: Mapping[Select, bool]) -> tuple[Select, list[tuple[SymVar, Dim]]] | None:
    """The first select (in pre-order) of innermost loop ``loop``'s body whose condition is
    loop-invariant, reads no buffer and is not yet ``decided`` (selects on the side a decided
    one does not take are not looked at), with the invariant block iter vars and their
    bindings (outermost first), which the condition may read; or None. The emitter emits
    ``loop`` once where the condition holds and once where it does not, each copy with that
    select replaced by the side it takes (``unswitch_plan`` says when)."""
    ok, ivs = _invariant_vars(loop, outer)
    sel = next(_invariant_selects(loop, ok, decided), None)
    return None if sel is None else (sel, ivs)


def unswitch_plan(loop: For, outer: set[SymVar]) -> bool:
    """Whether innermost vectorized loop ``loop`` is worth unswitching on its invariant selects:
    there are at least two (a concat's chain ``c0 ? x0 : c1 ? x1 : ... : xn``, one per input),
    and splitting on them all makes at most one copy of the loop more than there are selects
    and at most ``UNSWITCH_COPIES`` (a chain: one copy per input; independent conditions, which
    double the copies each, are left to the compiler). GCC, given the chain, if-converts the
    loads of every input into each vector iteration and unswitches on a few conditions
    (``--param max-unswitch-level``): a DenseNet-121 concat + batch norm + relu of 14 inputs
    compiled in 0.35 s, its copies one per input in 0.09 s, the same values selected."""
    if any(not isinstance(st, (Store, SeqStmt, Block)) or isinstance(st, Block) and st.init is not None for st in walk_stmts(loop.body)):
        return False  # an inner loop, an allocation, a condition or an init: not a plain loop
    ok, _ = _invariant_vars(loop, outer)
    count = sum(1 for _ in _invariant_selects(loop, ok, {}, every=True))
    if count < 2:
        return False
    cap = min(count + 1, UNSWITCH_COPIES)
    return _leaves(loop, ok, {}, cap) <= cap


def _invariant_vars(loop: For, outer: set[SymVar]) -> tuple[set[SymVar], list[tuple[SymVar, Dim]]]:
    """The vars that keep their value through ``loop``: ``outer`` less its own var, and the
    iter vars of its blocks whose bindings read only those (with the bindings)."""
    ok = set(outer)
    ok.discard(loop.var)
    ivs: list[tuple[SymVar, Dim]] = []
    for st in walk_stmts(loop.body):
        if isinstance(st, Block):
            for iv in st.iter_vars:
                if set(sym_walk.free_vars(iv.binding)) <= ok:
                    ok.add(iv.var)
                    ivs.append((iv.var, iv.binding))
    return ok, ivs


def _leaves(loop: For, ok: set[SymVar], decided: dict[Select, bool], cap: int) -> int:
    """The copies unswitching ``loop`` on ``decided`` and its further invariant selects makes,
    counted up to just past ``cap``."""
    sel = next(_invariant_selects(loop, ok, decided), None)
    if sel is None:
        return 1
    n = _leaves(loop, ok, {**decided, sel: True}, cap)
    return n if n > cap else n + _leaves(loop, ok, {**decided, sel: False}, cap - n)


def _invariant_selects(loop: For, ok: set[SymVar], decided: Mapping[Select, bool], every: bool = False) -> Iterator[Select]:
    """The undecided selects of ``loop``'s body whose condition reads only ``ok`` vars and no
    buffer, on the live sides of the decided ones (``every``: on both sides of every select)."""
    seen: set[Select] = set()
    for st in walk_stmts(loop.body):
        stack = list(stmt_scalars(st))
        while stack:
            e = stack.pop()
            if isinstance(e, Select):
                if e in decided and not every:
                    stack.append(e.a if decided[e] else e.b)
                    continue
                if e not in seen and e not in decided and _index_only(e.cond, ok):
                    seen.add(e)
                    yield e
                stack.extend((e.b, e.a, e.cond))
            elif isinstance(e, Load):
                stack.extend(reversed(e.indices))
            elif isinstance(e, Binary):
                stack.extend((e.b, e.a))
            elif isinstance(e, (Unary, Cast)):
                stack.append(e.a if isinstance(e, Unary) else e.value)
            elif isinstance(e, Intrin):
                stack.extend(reversed(e.args))


def _index_only(x: Scalar, ok: set[SymVar]) -> bool:
    """``x`` reads no buffer and no var outside ``ok``: computing it before the loop, even one
    that runs no iteration, reads and risks nothing."""
    for e in walk_scalars(x):
        if isinstance(e, (Load, Intrin)):
            return False
        if isinstance(e, SymExpr) and not set(sym_walk.free_vars(e)) <= ok:
            return False
    return True


# -- the floor divisions and modulos of index arithmetic (the emitter hoists them per loop) --


def nested_divmods(e: Dim) -> Iterator[SymExpr]:
    """The floor division and modulo atoms of ``e`` and of their operands, operands first."""
    if isinstance(e, (FloorDiv, FloorMod, Min, Max)):
        yield from nested_divmods(e.a)
        yield from nested_divmods(e.b)
        if not isinstance(e, (Min, Max)):
            yield e
    elif isinstance(e, Poly):
        for m, _ in e.terms:
            for a in m:
                yield from nested_divmods(a)


def stmt_dims(body: Stmt) -> Iterator[Dim]:
    """The index expressions of ``body``: loop extents, block bindings, store and load indices,
    conditions' integer parts."""
    for st in walk_stmts(body):
        scalars: list[Scalar] = []
        if isinstance(st, For):
            yield st.extent
        elif isinstance(st, Block):
            for iv in st.iter_vars:
                yield iv.binding
        elif isinstance(st, Allocate):
            yield from st.buffer.shape
        scalars.extend(stmt_scalars(st))
        for x in scalars:
            for y in walk_scalars(x):
                if isinstance(y, SymExpr):
                    yield y


def divmods(e: Dim) -> set[Dim]:
    """The floor division and modulo atoms of ``e`` (interned: equal ones are one object)."""
    if isinstance(e, (FloorDiv, FloorMod)):
        return {e}
    if isinstance(e, sym.Poly):
        return set().union(*(divmods(a) for m, _ in e.terms for a in m))
    if isinstance(e, (Min, Max)):
        return divmods(e.a) | divmods(e.b)
    return set()


def positive_linear(d: Dim) -> bool:
    """``d`` is a sum of distinct vars with positive coefficients and no constant."""
    if isinstance(d, SymVar):
        return True
    if not isinstance(d, Poly) or d.const != 0:
        return False
    return all(len(m) == 1 and isinstance(m[0], SymVar) and c > 0 for m, c in d.terms)
