"""Navigating and rebuilding loop-level statement trees, for the schedule primitives.

A statement is addressed by a *path*: the child indices from the function body down to it
(``children`` defines the order). Blocks and stores are the leaves: a block's body holds only
its own stores, never loops. Loops are found by their var or by its name, blocks by name.
Every helper here is pure: it returns new nodes and never changes the ones it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence, Union

from tilework.errors import ScheduleError
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.loop import (
    Allocate,
    Binary,
    Block,
    Buffer,
    Cast,
    Const,
    For,
    IfThenElse,
    Intrin,
    IterVar,
    Load,
    PExpr,
    Scalar,
    Select,
    SeqStmt,
    Stmt,
    Store,
    TensorFunc,
    Unary,
    map_scalars,
    walk_scalars,
)
from tilework.ir.sym import Dim, SymExpr, SymVar

Path = tuple[int, ...]
LoopRef = Union[str, SymVar]

# -- children and paths -------------------------------------------------------------------


def children(s: Stmt) -> tuple[Stmt, ...]:
    """The child statements of ``s`` that scheduling descends into (blocks are leaves)."""
    if isinstance(s, SeqStmt):
        return s.stmts
    if isinstance(s, (For, Allocate)):
        return (s.body,)
    if isinstance(s, IfThenElse):
        return (s.then_body,) if s.else_body is None else (s.then_body, s.else_body)
    return ()


def with_children(s: Stmt, cs: Sequence[Stmt]) -> Stmt:
    """``s`` with its children replaced by ``cs`` (same count as ``children(s)``)."""
    if isinstance(s, SeqStmt):
        return SeqStmt(tuple(cs))
    if isinstance(s, For):
        return For(s.var, s.extent, cs[0], s.kind)
    if isinstance(s, Allocate):
        return Allocate(s.buffer, cs[0])
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, cs[0], cs[1] if len(cs) > 1 else None)
    return s


def get_at(root: Stmt, path: Path) -> Stmt:
    s = root
    for i in path:
        s = children(s)[i]
    return s


def replace_at(root: Stmt, path: Path, new: Stmt) -> Stmt:
    """``root`` with the statement at ``path`` replaced by ``new``."""
    if not path:
        return new
    cs = list(children(root))
    cs[path[0]] = replace_at(cs[path[0]], path[1:], new)
    return with_children(root, cs)


def ancestors(root: Stmt, path: Path) -> list[tuple[Path, Stmt]]:
    """The statements from ``root`` down to the parent of ``path``, with their paths."""
    out: list[tuple[Path, Stmt]] = []
    s = root
    for k, i in enumerate(path):
        out.append((path[:k], s))
        s = children(s)[i]
    return out


def walk(root: Stmt, path: Path = ()) -> Iterator[tuple[Path, Stmt]]:
    """Every statement under ``root`` (blocks not entered) in pre-order, with its path."""
    yield path, root
    for i, c in enumerate(children(root)):
        yield from walk(c, path + (i,))


def seq(stmts: Sequence[Stmt]) -> Stmt:
    """A statement running ``stmts`` in order: nested sequences are flattened."""
    flat: list[Stmt] = []
    for s in stmts:
        flat.extend(s.stmts if isinstance(s, SeqStmt) else (s,))
    return flat[0] if len(flat) == 1 else SeqStmt(tuple(flat))


def splice_at(root: Stmt, path: Path, stmts: Sequence[Stmt]) -> Stmt:
    """``root`` with the statement at ``path`` replaced by the sequence ``stmts``, spliced
    into the enclosing sequence when there is one."""
    if path:
        parent = get_at(root, path[:-1])
        if isinstance(parent, SeqStmt):
            i = path[-1]
            new = parent.stmts[:i] + tuple(stmts) + parent.stmts[i + 1 :]
            return replace_at(root, path[:-1], seq(new))
    return replace_at(root, path, seq(stmts))


def inner_ctx(root: Stmt, outer: Path, leaf: Path) -> LeafCtx:
    """The context of the leaf at ``leaf`` as seen from the statement at ``outer`` (an
    ancestor): loops and guards between them only, path relative to ``outer``."""
    rel = leaf[len(outer) :]
    return next(c for c in leaves(get_at(root, outer)) if c.path == rel)


def remove_at(root: Stmt, path: Path) -> Stmt:
    """``root`` without the statement at ``path``; loops, guards and allocations left empty
    by the removal go too. The root itself cannot be removed (an empty body is an error)."""
    if not path:
        raise ScheduleError("cannot remove the whole function body")
    parent_path, idx = path[:-1], path[-1]
    parent = get_at(root, parent_path)
    if isinstance(parent, SeqStmt) and len(parent.stmts) > 1:
        rest = parent.stmts[:idx] + parent.stmts[idx + 1 :]
        return replace_at(root, parent_path, seq(rest))
    if isinstance(parent, IfThenElse) and parent.else_body is not None:
        if idx == 1:
            return replace_at(root, parent_path, IfThenElse(parent.cond, parent.then_body))
        neg = Unary("not", parent.cond, "bool")
        return replace_at(root, parent_path, IfThenElse(neg, parent.else_body))
    return remove_at(root, parent_path)


# -- finding loops and blocks ---------------------------------------------------------------


def _ref_str(ref: LoopRef) -> str:
    return ref if isinstance(ref, str) else ref.name


def find_loop(func: TensorFunc, ref: LoopRef, what: str = "schedule") -> tuple[Path, For]:
    """The loop whose var is ``ref``, or is named ``ref``, or, for ``"block/name"``, the loop
    named ``name`` around block ``block``; a ScheduleError says what is missing otherwise."""
    if isinstance(ref, str) and "/" in ref:
        bname, lname = ref.split("/", 1)
        ctx = block_ctx(func, bname, what)
        around = [f for f in ctx.loops if f.var.name == lname]
        if len(around) != 1:
            names = ", ".join(f.var.name for f in ctx.loops)
            raise ScheduleError(f"{what}: block {bname!r} has {len(around)} loops named {lname!r} around it (loops: {names})")
        return next(p for p, s in walk(func.body) if s is around[0]), around[0]
    hits = [
        (p, s)
        for p, s in walk(func.body)
        if isinstance(s, For) and (s.var is ref or (isinstance(ref, str) and s.var.name == ref))
    ]
    if not hits:
        names = ", ".join(s.var.name for _, s in walk(func.body) if isinstance(s, For))
        raise ScheduleError(f"{what}: no loop {_ref_str(ref)!r} in the function (loops: {names})")
    if len(hits) > 1:
        raise ScheduleError(
            f"{what}: {len(hits)} loops are named {_ref_str(ref)!r}; pass the loop var or 'block/loop'"
        )
    p, s = hits[0]
    assert isinstance(s, For)
    return p, s


def find_block(func: TensorFunc, name: str, what: str = "schedule") -> tuple[Path, Block]:
    hits = [(p, s) for p, s in walk(func.body) if isinstance(s, Block) and s.name == name]
    if not hits:
        names = ", ".join(b.name for b in blocks_of(func))
        raise ScheduleError(f"{what}: no block {name!r} in the function (blocks: {names})")
    if len(hits) > 1:
        raise ScheduleError(f"{what}: {len(hits)} blocks are named {name!r}")
    p, s = hits[0]
    assert isinstance(s, Block)
    return p, s


def blocks_of(func: TensorFunc) -> list[Block]:
    return [s for _, s in walk(func.body) if isinstance(s, Block)]


@dataclass(frozen=True)
class LeafCtx:
    """A leaf (block or store outside blocks) with the loops, guards and allocations above it."""

    path: Path
    leaf: Stmt
    loops: tuple[For, ...]
    guards: tuple[Scalar, ...]  # conditions that must hold for the leaf to run (innermost last)
    allocs: tuple[Buffer, ...]


def leaves(root: Stmt) -> list[LeafCtx]:
    """Every block and every store outside blocks under ``root``, in program order."""
    out: list[LeafCtx] = []

    def go(s: Stmt, path: Path, loops: tuple, guards: tuple, allocs: tuple) -> None:
        if isinstance(s, (Block, Store)):
            out.append(LeafCtx(path, s, loops, guards, allocs))
        elif isinstance(s, For):
            go(s.body, path + (0,), loops + (s,), guards, allocs)
        elif isinstance(s, Allocate):
            go(s.body, path + (0,), loops, guards, allocs + (s.buffer,))
        elif isinstance(s, IfThenElse):
            go(s.then_body, path + (0,), loops, guards + (s.cond,), allocs)
            if s.else_body is not None:
                neg = Unary("not", s.cond, "bool")
                go(s.else_body, path + (1,), loops, guards + (neg,), allocs)
        elif isinstance(s, SeqStmt):
            for i, c in enumerate(s.stmts):
                go(c, path + (i,), loops, guards, allocs)

    go(root, (), (), (), ())
    return out


def block_ctx(func: TensorFunc, name: str, what: str = "schedule") -> LeafCtx:
    path, _ = find_block(func, name, what)
    return next(c for c in leaves(func.body) if c.path == path)


def loop_names(func: TensorFunc, block: str) -> tuple[str, ...]:
    """The names of the loops around block ``block``, outermost first."""
    return tuple(f.var.name for f in block_ctx(func, block).loops)


# -- substitution and free vars ----------------------------------------------------------------


def subst_dim(d: Dim, m: Mapping[SymVar, Dim]) -> Dim:
    return d if isinstance(d, int) or not m else sym_walk.substitute(d, m)


def map_dims(x: Scalar, f: Callable[[Dim], Scalar]) -> Scalar:
    """``x`` rebuilt with ``f`` applied to every index value (``int`` or ``SymExpr``) in it."""
    if isinstance(x, (int, SymExpr)):
        return f(x)
    if isinstance(x, Const):
        return x
    if isinstance(x, Load):
        return Load(x.buffer, tuple(map_dims(i, f) for i in x.indices))
    if isinstance(x, Binary):
        return Binary(x.op, map_dims(x.a, f), map_dims(x.b, f), x.dtype)
    if isinstance(x, Unary):
        return Unary(x.op, map_dims(x.a, f), x.dtype)
    if isinstance(x, Cast):
        return Cast(x.dtype, map_dims(x.value, f))
    if isinstance(x, Select):
        return Select(map_dims(x.cond, f), map_dims(x.a, f), map_dims(x.b, f), x.dtype)
    if isinstance(x, Intrin):
        return Intrin(x.name, tuple(map_dims(a, f) for a in x.args), x.dtype)
    raise ScheduleError(f"unknown scalar expression {type(x).__name__}")


def subst_scalar(x: Scalar, m: Mapping[SymVar, Dim]) -> Scalar:
    """``x`` with sym vars replaced by dims (index arithmetic re-canonicalized)."""
    if not m:
        return x
    return map_dims(x, sym_walk.substituter(m))


def subst_stmt(s: Stmt, m: Mapping[SymVar, Dim]) -> Stmt:
    """``s`` with sym vars replaced everywhere: extents, bindings, indices, values, guards (one
    memo for the whole statement: its index expressions share their parts)."""
    return _subst_stmt(s, sym_walk.substituter(m)) if m else s


def _subst_stmt(s: Stmt, sub: Callable[[Dim], Dim]) -> Stmt:
    if isinstance(s, Store):
        return Store(s.buffer, tuple(map_dims(i, sub) for i in s.indices), map_dims(s.value, sub))
    if isinstance(s, For):
        return For(s.var, sub(s.extent), _subst_stmt(s.body, sub), s.kind)
    if isinstance(s, Block):
        ivs = tuple(IterVar(iv.var, sub(iv.extent), iv.kind, sub(iv.binding)) for iv in s.iter_vars)
        init = None if s.init is None else _subst_stmt(s.init, sub)
        return Block(s.name, ivs, s.reads, s.writes, _subst_stmt(s.body, sub), init)
    if isinstance(s, IfThenElse):
        els = None if s.else_body is None else _subst_stmt(s.else_body, sub)
        return IfThenElse(map_dims(s.cond, sub), _subst_stmt(s.then_body, sub), els)
    if isinstance(s, SeqStmt):
        return SeqStmt(tuple(_subst_stmt(c, sub) for c in s.stmts))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _subst_stmt(s.body, sub))
    raise ScheduleError(f"unknown statement {type(s).__name__}")


def scalar_vars(x: Scalar) -> set[SymVar]:
    """The sym vars that ``x`` uses, also inside load indices."""
    out: set[SymVar] = set()
    for e in walk_scalars(x):
        if isinstance(e, SymExpr):
            out.update(sym_walk.free_vars(e))
    return out


def dim_vars(d: Dim) -> set[SymVar]:
    return set() if isinstance(d, int) else set(sym_walk.free_vars(d))


def scalar_equal(a: Scalar, b: Scalar) -> bool:
    """Structural equality of scalar expressions (dims are interned: compared by identity)."""
    if isinstance(a, (int, SymExpr)) or isinstance(b, (int, SymExpr)):
        if isinstance(a, bool) or isinstance(b, bool):
            return False
        return isinstance(a, (int, SymExpr)) and isinstance(b, (int, SymExpr)) and sym.prove_eq(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, Const):
        assert isinstance(b, Const)
        return a.value == b.value and a.dtype == b.dtype
    if isinstance(a, Load):
        assert isinstance(b, Load)
        return a.buffer is b.buffer and _all_equal(a.indices, b.indices)
    if isinstance(a, Binary):
        assert isinstance(b, Binary)
        return a.op == b.op and scalar_equal(a.a, b.a) and scalar_equal(a.b, b.b)
    if isinstance(a, Unary):
        assert isinstance(b, Unary)
        return a.op == b.op and scalar_equal(a.a, b.a)
    if isinstance(a, Cast):
        assert isinstance(b, Cast)
        return a.dtype == b.dtype and scalar_equal(a.value, b.value)
    if isinstance(a, Select):
        assert isinstance(b, Select)
        return _all_equal((a.cond, a.a, a.b), (b.cond, b.a, b.b))
    if isinstance(a, Intrin):
        assert isinstance(b, Intrin)
        return a.name == b.name and _all_equal(a.args, b.args)
    return False


def _all_equal(xs: Sequence[Scalar], ys: Sequence[Scalar]) -> bool:
    return len(xs) == len(ys) and all(scalar_equal(x, y) for x, y in zip(xs, ys))


def map_stmt_scalars(s: Stmt, f: Callable[[PExpr], Scalar | None]) -> Stmt:
    """Apply ``map_scalars`` to every scalar of ``s`` (stores, guards; block bodies too)."""
    if isinstance(s, Store):
        idx = tuple(map_scalars(i, f) for i in s.indices)
        return Store(s.buffer, idx, map_scalars(s.value, f))
    if isinstance(s, Block):
        init = None if s.init is None else map_stmt_scalars(s.init, f)
        return Block(s.name, s.iter_vars, s.reads, s.writes, map_stmt_scalars(s.body, f), init)
    if isinstance(s, IfThenElse):
        els = None if s.else_body is None else map_stmt_scalars(s.else_body, f)
        return IfThenElse(map_scalars(s.cond, f), map_stmt_scalars(s.then_body, f), els)
    return with_children(s, [map_stmt_scalars(c, f) for c in children(s)])


# -- guards -------------------------------------------------------------------------------


def conj(conds: Sequence[Scalar]) -> Scalar:
    """The conjunction of ``conds`` (at least one)."""
    out = conds[0]
    for c in conds[1:]:
        out = Binary("and", out, c, "bool")
    return out


def conjuncts(cond: Scalar) -> list[Scalar]:
    """``cond`` split at its top-level ``and``s."""
    if isinstance(cond, Binary) and cond.op == "and":
        return conjuncts(cond.a) + conjuncts(cond.b)
    return [cond]


def less_than(a: Dim, b: Dim) -> Scalar:
    return Binary("<", a, b, "bool")


def guard_leaves(s: Stmt, cond: Scalar) -> Stmt:
    """``s`` with every leaf (block or store) run only when ``cond`` holds. The guard goes
    just above the leaf (inside any guard that already wraps it), so loops stay perfectly
    nested for later primitives."""
    if isinstance(s, (Block, Store)):
        return IfThenElse(cond, s)
    if isinstance(s, IfThenElse) and s.else_body is None and isinstance(s.then_body, (Block, Store)):
        return IfThenElse(conj([s.cond, cond]), s.then_body)
    return with_children(s, [guard_leaves(c, cond) for c in children(s)])


# -- names ----------------------------------------------------------------------------------


def used_names(func: TensorFunc) -> set[str]:
    """Names of every sym var, loop var, iter var and buffer in ``func`` (one namespace)."""
    names = {p.name for p in func.params}
    for b in func.buffers:
        names.update(v.name for d in b.shape for v in dim_vars(d))
    for _, s in walk(func.body):
        if isinstance(s, For):
            names.add(s.var.name)
        elif isinstance(s, Allocate):
            names.add(s.buffer.name)
        elif isinstance(s, Block):
            names.update(iv.var.name for iv in s.iter_vars)
    return names


def block_names(func: TensorFunc) -> set[str]:
    """Names of the blocks of ``func`` (a namespace of their own)."""
    return {s.name for _, s in walk(func.body) if isinstance(s, Block)}


def fresh_name(used: set[str], base: str) -> str:
    """``base`` or ``base_1``, ``base_2``, ... whichever is not in ``used``; adds it to ``used``."""
    name, k = base, 0
    while name in used:
        k += 1
        name = f"{base}_{k}"
    used.add(name)
    return name


def new_loop_var(name: str, extent: Dim) -> SymVar:
    """A loop var ranging over ``[0, extent)``: a static extent gives it an upper bound."""
    hi = extent - 1 if isinstance(extent, int) and extent >= 1 else None
    return SymVar(name, 0, hi)


def renew_iter_vars(block: Block, used: set[str]) -> Block:
    """``block`` with fresh iter vars (each var is bound once in a function), renamed from
    the old ones and substituted in its body and init."""
    mapping: dict[SymVar, Dim] = {}
    ivs = []
    for iv in block.iter_vars:
        hi = iv.var.hi
        v = SymVar(fresh_name(used, iv.var.name), iv.var.lo, hi)
        mapping[iv.var] = v
        ivs.append(IterVar(v, iv.extent, iv.kind, iv.binding))
    init = None if block.init is None else subst_stmt(block.init, mapping)
    return Block(block.name, tuple(ivs), block.reads, block.writes, subst_stmt(block.body, mapping), init)


def rename_blocks(s: Stmt, taken: set[str]) -> Stmt:
    """``s`` with every block renamed to a name not in ``taken`` (which grows)."""
    if isinstance(s, Block):
        return Block(fresh_name(taken, s.name), s.iter_vars, s.reads, s.writes, s.body, s.init)
    return with_children(s, [rename_blocks(c, taken) for c in children(s)])


def rebind(s: Stmt, used: set[str]) -> Stmt:
    """``s`` with every loop var, iter var and allocated buffer it binds replaced by a fresh
    one (names kept apart from ``used``, which grows)."""
    vars_: dict[SymVar, SymVar] = {}
    bufs: dict[Buffer, Buffer] = {}
    for _, x in walk(s):
        if isinstance(x, For):
            vars_[x.var] = SymVar(fresh_name(used, x.var.name), x.var.lo, x.var.hi)
        elif isinstance(x, Block):
            for iv in x.iter_vars:
                vars_[iv.var] = SymVar(fresh_name(used, iv.var.name), iv.var.lo, iv.var.hi)
    for _, x in walk(s):
        if isinstance(x, Allocate):
            b = x.buffer
            bufs[b] = Buffer(fresh_name(used, b.name), tuple(subst_dim(d, vars_) for d in b.shape), b.dtype)
    return _rebuffer(subst_stmt(_revar(s, vars_), vars_), bufs)


def _revar(s: Stmt, m: dict[SymVar, SymVar]) -> Stmt:
    """Rename the binders themselves (``subst_stmt`` renames the uses)."""
    if isinstance(s, For):
        return For(m[s.var], s.extent, _revar(s.body, m), s.kind)
    if isinstance(s, Block):
        ivs = tuple(IterVar(m[iv.var], iv.extent, iv.kind, iv.binding) for iv in s.iter_vars)
        return Block(s.name, ivs, s.reads, s.writes, s.body, s.init)
    return with_children(s, [_revar(c, m) for c in children(s)])


def _rebuffer(s: Stmt, bufs: dict[Buffer, Buffer]) -> Stmt:
    if not bufs:
        return s

    def load(n: PExpr) -> Scalar | None:
        return Load(bufs[n.buffer], n.indices) if isinstance(n, Load) and n.buffer in bufs else None

    def go(x: Stmt) -> Stmt:
        if isinstance(x, Store):
            idx = tuple(map_scalars(i, load) for i in x.indices)
            return Store(bufs.get(x.buffer, x.buffer), idx, map_scalars(x.value, load))
        if isinstance(x, Block):
            init = None if x.init is None else go(x.init)
            reads = tuple(bufs.get(b, b) for b in x.reads)
            writes = tuple(bufs.get(b, b) for b in x.writes)
            return Block(x.name, x.iter_vars, reads, writes, go(x.body), init)
        if isinstance(x, Allocate):
            return Allocate(bufs.get(x.buffer, x.buffer), go(x.body))
        if isinstance(x, IfThenElse):
            els = None if x.else_body is None else go(x.else_body)
            return IfThenElse(map_scalars(x.cond, load), go(x.then_body), els)
        if isinstance(x, SeqStmt):
            return SeqStmt(tuple(go(c) for c in x.stmts))
        if isinstance(x, For):
            return For(x.var, x.extent, go(x.body), x.kind)
        return x

    return go(s)
