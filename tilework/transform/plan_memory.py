"""plan_memory: storage reuse across a whole function, with symbolic sizes and upper bounds.

Requires the output of ``lower_calls`` (explicit ``vm_alloc_tensor`` + destination-passing
calls), before ``lower_shapes``: sizes are still dims. For each graph function:

1. Lifetimes. Bindings are numbered in program order, an If's branches (then first) between
   its condition and its result. A value refers to the allocations whose memory it may share:
   an allocation, its aliases (``y = x``, match_cast), ``vm_view``s of it, tuples holding it
   and their items, If results (what either branch returns) and, conservatively, the result of
   any call that is not destination-passing (a graph function or library may return an
   argument). An allocation lives from its binding to the last use of anything referring to
   it. A run executes a subsequence of the numbering (one branch of each If), so allocations
   with disjoint numbered lifetimes are never live at once.
2. Escapes. Allocations the function may return (directly, in a tuple, through an If or a call)
   stay ``vm_alloc_tensor``: the caller owns them, and a later call must not overwrite them.
   So do allocations sized by sym vars that no parameter binds (match_cast ones).
3. In place. When a kernel made of one elementwise block is the last reader of an input and
   writes an output of the same shape and byte size, the output takes the input's place.
4. Packing. Allocations whose byte size has an upper bound (from the dims' declared bounds)
   go to the function's *static* arena, the others to its *pooled* arena. Largest first, each
   goes to the lowest offset that provably does not overlap anything live at the same time
   (``sym.prove_le`` over symbolic offsets and sizes, kept multiples of 64 bytes), else on top
   of those. Offsets are dims, so smaller shapes use a compact prefix of an arena; an arena's
   size is the max of its tensors' ends.
5. Rewrite. A static arena is ``vm_alloc_storage(<upper bound of its size>, static=True)`` at
   entry: the VM obtains it on the first call and keeps it, so later calls obtain no memory
   for intermediates (a shape touches only the prefix it needs; an arena whose bounds would
   need more than ``static_limit`` bytes is pooled instead). A pooled arena is ``vm_alloc_storage(<size>)`` at entry and
   ``vm_free_storage`` at the end, served by the VM's size-class pool across calls. Functions
   in a call cycle get only a pooled arena (recursive activations must not share one). Each
   planned allocation becomes ``vm_alloc_tensor_from_storage(arena, shape, offset)``.

Guarantees: tensors live at the same time never overlap, for every shape within the bounds;
returned values never alias planned storage; numerics are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.graph import (
    AnyBinding,
    Binding,
    BindingBlock,
    Call,
    Expr,
    GraphFunc,
    GlobalVar,
    If,
    OpRef,
    PrimValue,
    SeqExpr,
    ShapeExpr,
    Tuple,
    TupleGetItem,
    Var,
    bindings_of,
)
from tilework.ir.info import AnyInfo, ShapeInfo, StructInfo, TensorInfo, TupleInfo
from tilework.ir.loop import Block, Buffer, TensorFunc
from tilework.ir.module import IRModule
from tilework.ir.sym import Dim, SymVar
from tilework.op import vm as _vm_ops  # noqa: F401  (registers the storage ops)
from tilework.op.base import OpPattern
from tilework.ir.dtype import DTYPE_TABLE
from tilework.schedule.analysis import block_pattern
from tilework.schedule.tree import leaves
from tilework.ir.graph import used_vars
from tilework.transform.lower_shapes import VOID, _vm_call
from tilework.transform.base import Pass

ALIGN = 64
STATIC, POOLED = "static", "pooled"
STATIC_LIMIT = 1 << 32  # bytes: a static arena for larger bounds would be held for nothing
_REF_DIM = 64  # stands for an unbounded dim when ordering allocations by size
# vm ops whose results share no tensor memory with their arguments
_NO_ALIAS = frozenset(
    {
        "vm_alloc_shape_heap",
        "vm_match_shape",
        "vm_check_tensor_info",
        "vm_check_tuple_info",
        "vm_check_shape_info",
        "vm_check_prim_info",
        "vm_check_dims",
        "vm_shape_func",
        "vm_make_shape",
        "vm_load_dim",
        "vm_read_if_cond",
        "vm_kill",
        "vm_alloc_storage",
        "vm_free_storage",
        "assert_dims",
        "shape_of",
    }
)
_EMPTY: frozenset["_Alloc"] = frozenset()


@dataclass(eq=False)
class _Alloc:
    var: Var
    shape: tuple[Dim, ...]
    dtype: str
    nbytes: Dim
    start: int
    end: int
    first_use: int = -1
    escapes: bool = False


# -- lifetimes ----------------------------------------------------------------------------


class _Liveness:
    """Numbers the bindings of one function and finds what each value refers to."""

    def __init__(self, mod: IRModule, entry: set[SymVar]) -> None:
        self.mod = mod
        self.entry = entry
        self.pos = 0
        self.refs: dict[Var, frozenset[_Alloc]] = {}
        self.whole: dict[Var, _Alloc] = {}  # vars that are an allocation's whole tensor
        self.fields: dict[Var, tuple[Expr, ...]] = {}  # vars bound to a tuple literal
        self.allocs: list[_Alloc] = []
        self.skipped: list[tuple[int, Var]] = []  # allocations that cannot be planned
        self.kernel_calls: list[tuple[int, TensorFunc, tuple[Expr, ...]]] = []

    def tick(self) -> int:
        self.pos += 1
        return self.pos

    def use(self, e: Expr, p: int) -> None:
        for v in used_vars(e):
            for a in self.refs.get(v, _EMPTY):
                a.end = max(a.end, p)
                if a.first_use < 0:
                    a.first_use = p

    def refs_of(self, e: Expr) -> frozenset[_Alloc]:
        if isinstance(e, Var):
            return self.refs.get(e, _EMPTY)
        if isinstance(e, Tuple):
            return _union(self.refs_of(f) for f in e.fields)
        if isinstance(e, TupleGetItem):
            item = self.item(e)
            return self.refs_of(item) if item is not None else self.refs_of(e.tuple_value)
        return _EMPTY

    def whole_of(self, e: Expr) -> _Alloc | None:
        """The allocation ``e`` is the whole tensor of (itself, an alias or a view), if any."""
        return self.whole.get(e) if isinstance(e, Var) else None

    def item(self, e: TupleGetItem) -> Expr | None:
        t = e.tuple_value
        fields = t.fields if isinstance(t, Tuple) else self.fields.get(t) if isinstance(t, Var) else None
        return fields[e.index] if fields is not None and 0 <= e.index < len(fields) else None

    def seq(self, s: SeqExpr) -> frozenset[_Alloc]:
        for block in s.blocks:
            for b in block.bindings:
                self.binding(b)
        self.use(s.body, self.tick())
        return self.refs_of(s.body)

    def binding(self, b: AnyBinding) -> None:
        v = b.value
        if isinstance(v, If):
            self.use(v.cond, self.tick())
            refs = self.seq(v.then_branch) | self.seq(v.else_branch)
            self.tick()
            self.refs[b.var] = refs
            return
        p = self.tick()
        self.use(v, p)
        self.refs[b.var] = self.define(b.var, v, p)

    def alias(self, var: Var, src: Expr) -> None:
        if isinstance(src, TupleGetItem):
            item = self.item(src)
            src = item if item is not None else src
        if isinstance(src, Var) and src in self.whole:
            self.whole[var] = self.whole[src]
        if isinstance(src, Var) and src in self.fields:
            self.fields[var] = self.fields[src]

    def define(self, var: Var, v: Expr, p: int) -> frozenset[_Alloc]:
        if isinstance(v, Tuple):
            self.fields[var] = v.fields
            return self.refs_of(v)
        if isinstance(v, (Var, TupleGetItem)):
            self.alias(var, v)
            return self.refs_of(v)
        if not isinstance(v, Call):
            return _EMPTY
        callee = v.callee
        if isinstance(callee, OpRef):
            if callee.name == "vm_alloc_tensor":
                return self.allocate(var, v, p)
            if callee.name == "vm_view":
                self.alias(var, v.args[0])
                return self.refs_of(v.args[0])
            if callee.name in _NO_ALIAS:
                return _EMPTY
            return _union(self.refs_of(a) for a in v.args)
        if isinstance(callee, GlobalVar):
            func = self.mod.get(callee.name)
            if isinstance(func, TensorFunc):
                self.kernel_calls.append((p, func, v.args))
                return _EMPTY
        if v.info == VOID:  # a destination-passing library call
            return _EMPTY
        return _union(self.refs_of(a) for a in v.args)

    def allocate(self, var: Var, call: Call, p: int) -> frozenset[_Alloc]:
        shape = call.args[0]
        dtype = call.attrs.get("dtype")
        itemsize = _itemsize(dtype)
        nbytes = sym.mul(sym.product(shape.values), itemsize) if isinstance(shape, ShapeExpr) and itemsize else None
        if nbytes is None or not set(sym_walk.free_vars(nbytes)) <= self.entry:
            self.skipped.append((p, var))
            return _EMPTY
        assert isinstance(shape, ShapeExpr) and isinstance(dtype, str)
        a = _Alloc(var, shape.values, dtype, nbytes, p, p)
        self.allocs.append(a)
        self.whole[var] = a
        return frozenset((a,))


def _itemsize(dtype: object) -> int:
    if not isinstance(dtype, str) or dtype not in DTYPE_TABLE:
        return 0
    return DTYPE_TABLE[dtype].itemsize


def _union(parts: Iterable[frozenset[_Alloc]]) -> frozenset[_Alloc]:
    out: frozenset[_Alloc] = _EMPTY
    for part in parts:
        out = out | part
    return out


def _entry_vars(f: GraphFunc) -> set[SymVar]:
    """Sym vars the parameters bind (bare dims of their shapes), known from entry on."""
    out: set[SymVar] = set()

    def go(info: StructInfo) -> None:
        dims: tuple[Dim, ...] | None = None
        if isinstance(info, TensorInfo):
            dims = info.shape
        elif isinstance(info, ShapeInfo):
            dims = info.values
        elif isinstance(info, TupleInfo):
            for fi in info.fields:
                go(fi)
        out.update(d for d in dims or () if isinstance(d, SymVar))

    for p in f.params:
        go(p.info)
    return out


def _recursive(mod: IRModule) -> set[str]:
    """Graph functions that can call themselves (directly or through others)."""
    calls: dict[str, set[str]] = {}
    for name, f in mod.graph_funcs():
        callees: set[str] = set()
        for b in bindings_of(f):
            v = b.value
            if isinstance(v, Call) and isinstance(v.callee, GlobalVar) and isinstance(mod.get(v.callee.name), GraphFunc):
                callees.add(v.callee.name)
        calls[name] = callees
    out: set[str] = set()
    for name in calls:
        seen: set[str] = set()
        stack = list(calls[name])
        while stack:
            g = stack.pop()
            if g == name:
                out.add(name)
                break
            if g not in seen:
                seen.add(g)
                stack.extend(calls.get(g, ()))
    return out


# -- in place -----------------------------------------------------------------------------


def _elementwise(func: TensorFunc) -> bool:
    """One block that reads every input at the element it writes."""
    ls = leaves(func.body)
    return len(ls) == 1 and isinstance(ls[0].leaf, Block) and block_pattern(ls[0].leaf) == OpPattern.ELEMWISE


def _in_place_pairs(live: _Liveness, arena: dict[_Alloc, str]) -> list[tuple[_Alloc, _Alloc]]:
    """(input, output) pairs where an elementwise kernel may write its output over an input."""
    pairs: list[tuple[_Alloc, _Alloc]] = []
    for p, func, args in live.kernel_calls:
        bufs = func.buffers
        n_in = len(bufs) - func.num_outputs
        if len(args) < len(bufs) or not _elementwise(func):
            continue
        taken: set[_Alloc] = set()
        for k in range(n_in, len(bufs)):
            out = live.whole_of(args[k])
            if out is None or out not in arena or out.first_use != p:
                continue
            for j in range(n_in):
                src = live.whole_of(args[j])
                if src is None or src is out or src in taken or src not in arena or arena[src] != arena[out] or src.end != p:
                    continue
                if not _same_elements(live, args, bufs, src, j, k, n_in) or not sym.prove_eq(src.nbytes, out.nbytes):
                    continue
                pairs.append((src, out))
                taken.add(src)
                break
    return pairs


def _same_elements(live: _Liveness, args: tuple[Expr, ...], bufs: tuple[Buffer, ...], src: _Alloc, j: int, k: int, n_in: int) -> bool:
    """Every input view of ``src`` is whole and indexed like output ``k``."""
    if bufs[j].dtype != bufs[k].dtype:
        return False
    for i in range(n_in):
        if src not in live.refs_of(args[i]):
            continue
        if live.whole_of(args[i]) is not src or tuple(bufs[i].shape) != tuple(bufs[k].shape):
            return False
    return True


# -- packing ------------------------------------------------------------------------------


@dataclass(eq=False)
class _Item:
    members: list[_Alloc]
    arena: str
    size: Dim
    start: int
    end: int
    weight: int
    offset: Dim = 0


def _aligned(n: Dim) -> Dim:
    return sym.mul(sym.floordiv(sym.add(n, ALIGN - 1), ALIGN), ALIGN)


def _ref_env(dims: Iterable[Dim]) -> dict[SymVar, int]:
    """Values that order dims by size: upper bounds, or a typical size for unbounded vars."""
    env: dict[SymVar, int] = {}
    for d in dims:
        for v in sym_walk.free_vars(d):
            env[v] = v.hi if v.hi is not None else max(v.lo, _REF_DIM)
    return env


def _weight(size: Dim) -> int:
    hi = sym.bounds(size)[1]
    return hi if hi is not None else sym_walk.evaluate(size, _ref_env([size]))


def _disjoint(offset: Dim, size: Dim, other: _Item) -> bool:
    return sym.prove_le(sym.add(offset, size), other.offset) or sym.prove_le(sym.add(other.offset, other.size), offset)


def _max(dims: Iterable[Dim]) -> Dim:
    out: Dim = 0
    for d in dims:
        out = sym.max_(out, d)
    return out


_MAX_OFFSET_TEXT = 400  # an offset longer than this (nested max terms) ends symbolic packing


class _TooComplex(Exception):
    pass


def _pack(items: list[_Item]) -> Dim:
    """Give each item an offset; returns the arena size (a dim). Tight symbolic packing first;
    when offsets grow into long ``max`` chains (many live tensors of unrelated symbolic sizes),
    the simpler token packing, whose offsets stay polynomials."""
    try:
        return _pack_offsets(items)
    except _TooComplex:
        return _pack_tokens(items)


def _pack_offsets(items: list[_Item]) -> Dim:
    env = _ref_env(it.size for it in items)
    placed: list[_Item] = []
    for it in sorted(items, key=lambda it: (-it.weight, it.start)):
        live = [q for q in placed if q.start <= it.end and it.start <= q.end]
        ends = {sym.add(q.offset, q.size) for q in live}
        candidates = sorted({0, *ends}, key=lambda o: (sym_walk.evaluate(o, env), sym.to_str(o)))
        chosen = next((o for o in candidates if all(_disjoint(o, it.size, q) for q in live)), None)
        it.offset = _max(ends) if chosen is None else chosen
        if not isinstance(it.offset, int) and len(sym.to_str(it.offset)) > _MAX_OFFSET_TEXT:
            raise _TooComplex
        placed.append(it)
    return _max(sym.add(it.offset, it.size) for it in placed)


def _pack_tokens(items: list[_Item]) -> Dim:
    """Storage tokens: an item reuses a token whose lifetimes it does not overlap and whose size
    provably covers it, else opens a new one; tokens sit one after another."""
    tokens: list[tuple[Dim, list[_Item]]] = []
    for it in sorted(items, key=lambda it: (-it.weight, it.start)):
        for size, users in tokens:
            free = all(q.end < it.start or it.end < q.start for q in users)
            if free and sym.prove_ge(size, it.size):
                users.append(it)
                break
        else:
            tokens.append((it.size, [it]))
    offset: Dim = 0
    for size, users in tokens:
        for it in users:
            it.offset = offset
        offset = sym.add(offset, size)
    return offset


# -- the plan -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where a planned tensor lives: ``arena`` at byte ``offset``, for bindings ``start..end``."""

    name: str
    arena: str
    offset: Dim
    nbytes: Dim
    start: int
    end: int


@dataclass(frozen=True)
class FunctionPlan:
    """The memory plan of one graph function (sizes and offsets are dims)."""

    name: str
    placements: tuple[Placement, ...] = ()
    in_place: tuple[tuple[str, str], ...] = ()  # (input, output) sharing storage
    unplanned: tuple[str, ...] = ()  # left to vm_alloc_tensor (returned, or late-bound sizes)
    static_size: Dim = 0
    static_capacity: int = 0  # the static arena's bytes for the upper bounds
    pooled_size: Dim = 0
    where: dict[Var, tuple[str, Dim]] = field(default_factory=dict, repr=False, compare=False)  # var -> (arena, offset)


def plan_function(mod: IRModule, name: str, recursive: bool | None = None, static_limit: int = STATIC_LIMIT) -> FunctionPlan:
    """Plan the allocations of graph function ``name`` (see the module docstring). A static
    arena above ``static_limit`` bytes becomes pooled (sized per call) instead."""
    f = mod[name]
    assert isinstance(f, GraphFunc)
    if recursive is None:
        recursive = name in _recursive(mod)
    live = _Liveness(mod, _entry_vars(f))
    for a in live.seq(f.body):
        a.escapes = True
    planned = [a for a in live.allocs if not a.escapes]
    arena = {a: POOLED if recursive or sym.bounds(a.nbytes)[1] is None else STATIC for a in planned}
    pairs = _in_place_pairs(live, arena)
    items = _group(planned, pairs, arena)
    static_size = _pack([it for it in items if it.arena == STATIC])
    capacity = sym.bounds(static_size)[1]
    assert capacity is not None, "a static arena is bounded by construction"
    if capacity > static_limit:
        for it in items:
            it.arena = POOLED
        static_size, capacity = 0, 0
    pooled_size = _pack([it for it in items if it.arena == POOLED])
    placements = []
    where: dict[Var, tuple[str, Dim]] = {}
    for it in items:
        for a in it.members:
            placements.append(Placement(a.var.name, it.arena, it.offset, a.nbytes, a.start, a.end))
            where[a.var] = (it.arena, it.offset)
    placements.sort(key=lambda pl: pl.start)
    unplanned = sorted([(a.start, a.var) for a in live.allocs if a.escapes] + live.skipped, key=lambda pv: pv[0])
    return FunctionPlan(
        name,
        tuple(placements),
        tuple((i.var.name, o.var.name) for i, o in pairs),
        tuple(v.name for _, v in unplanned),
        static_size,
        int(capacity),
        pooled_size,
        where,
    )


def _group(planned: list[_Alloc], pairs: list[tuple[_Alloc, _Alloc]], arena: dict[_Alloc, str]) -> list[_Item]:
    parent: dict[_Alloc, _Alloc] = {a: a for a in planned}

    def root(a: _Alloc) -> _Alloc:
        while parent[a] is not a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for i, o in pairs:
        parent[root(o)] = root(i)
    groups: dict[_Alloc, list[_Alloc]] = {}
    for a in planned:
        groups.setdefault(root(a), []).append(a)
    items = []
    for members in groups.values():
        first = members[0]
        size = _aligned(first.nbytes)
        start, end = min(a.start for a in members), max(a.end for a in members)
        items.append(_Item(members, arena[first], size, start, end, _weight(size)))
    return items


# -- rewrite ------------------------------------------------------------------------------


def _rewrite_seq(s: SeqExpr, where: dict[Var, tuple[str, Dim]], arenas: dict[str, Var]) -> list[AnyBinding]:
    out: list[AnyBinding] = []
    for block in s.blocks:
        for b in block.bindings:
            out.append(_rewrite_binding(b, where, arenas))
    return out


def _rewrite_binding(b: AnyBinding, where: dict[Var, tuple[str, Dim]], arenas: dict[str, Var]) -> AnyBinding:
    v = b.value
    if isinstance(b, Binding) and isinstance(v, If):
        then = _rewrite_seq(v.then_branch, where, arenas)
        other = _rewrite_seq(v.else_branch, where, arenas)
        return Binding(b.var, If(v.cond, _seq(then, v.then_branch), _seq(other, v.else_branch), v.info))
    place = where.get(b.var)
    if place is None or not isinstance(v, Call):
        return b
    kind, offset = place
    shape, dtype = v.args[0], v.attrs["dtype"]
    call = _vm_call("vm_alloc_tensor_from_storage", [arenas[kind], shape, PrimValue.of(offset)], v.info, dtype=dtype)
    return Binding(b.var, call)


def _seq(bindings: list[AnyBinding], like: SeqExpr) -> SeqExpr:
    return SeqExpr((BindingBlock(tuple(bindings)),) if bindings else (), like.body, like.info)


def apply_plan(f: GraphFunc, plan: FunctionPlan) -> GraphFunc:
    """``f`` with the allocations of ``plan`` carved from its arenas."""
    if not plan.placements:
        return f
    kinds = {pl.arena for pl in plan.placements}
    arenas = {kind: Var(f"{kind}_arena", AnyInfo()) for kind in kinds}
    head: list[AnyBinding] = []
    tail: list[AnyBinding] = []
    if STATIC in arenas:
        size = PrimValue.of(plan.static_capacity)
        head.append(Binding(arenas[STATIC], _vm_call("vm_alloc_storage", [size], AnyInfo(), static=True, label=f"{plan.name}.{STATIC}")))
    if POOLED in arenas:
        size = PrimValue.of(plan.pooled_size)
        head.append(Binding(arenas[POOLED], _vm_call("vm_alloc_storage", [size], AnyInfo(), static=False, label=f"{plan.name}.{POOLED}")))
        tail.append(Binding(Var("_free", VOID), _vm_call("vm_free_storage", [arenas[POOLED]])))
    body = _rewrite_seq(f.body, plan.where, arenas)
    return f.replace(body=_seq([*head, *body, *tail], f.body))


@dataclass(frozen=True)
class PlanMemory(Pass):
    """``static_limit``: the most bytes a function's static arena may hold (for its upper
    bounds); above it the arena is pooled, sized per call."""

    name: str = "plan_memory"
    static_limit: int = STATIC_LIMIT

    def run(self, mod: IRModule) -> IRModule:
        out = mod
        recursive = _recursive(mod)
        for name, f in mod.graph_funcs():
            plan = plan_function(mod, name, name in recursive, self.static_limit)
            out = out.with_func(name, apply_plan(f, plan))
        return out


__all__ = ["FunctionPlan", "PlanMemory", "Placement", "apply_plan", "plan_function"]
