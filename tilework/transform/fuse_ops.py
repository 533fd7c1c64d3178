"""fuse_ops: group the kernel calls of each dataflow block into primitive graph functions.

The nodes are the bindings of one dataflow block. A ``call_tensor`` of a kernel not yet
scheduled, with one output and known argument shapes, is fusable and has its kernel's pattern
(the ``op_pattern`` attr, see annotate_op_pattern); any other binding is an opaque barrier.
Post-dominators are computed over the consumers in the block (a value also used after the block
becomes an extra output of its group). Visiting the nodes in order, the group ending at node
``s`` joins the group of ``s``'s post-dominator ``d``, with every node on the paths between
them, when those nodes' groups are all elementwise/broadcast/injective, the merged group has at
most ``max_group_size`` kernels, and: ``s``'s group holds a matmul-like kernel
(``out_ewise_fusable``) and ``d``'s group only elementwise/broadcast ones (the bias add,
activation or residual add of an epilogue); or ``s``'s group holds a reduction (norm, softmax,
attention) and ``d``'s group only elementwise/broadcast/injective ones; or ``s``'s group is
elementwise/broadcast/injective and ``d`` is such a kernel or a reduction (a prologue: never into
a matmul, whose operands must stay plain loads, and into a reduction with a matmul-like block,
such as attention, only when it just moves data). So a group has one anchor at most. Each group
of two or more kernels becomes a graph function with the attr ``primitive: True`` holding its
``call_tensor`` bindings; its params are the values it reads (and a ``Shape`` param for sym vars
no tensor param has as a bare dim), its result the values used outside it (a tuple when there
are several). The call takes the place of the group's *last* binding, so every value and sym var
the group uses (one bound by a ``match_cast`` between the group's bindings too) is defined
before it; only dataflow blocks change, so nothing moves across control flow or impure calls.
Structurally equal groups share one function. Requires a legalized, well-formed module;
guarantees a well-formed module computing the same values (fuse_tensor then merges each group).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilework.ir import info as I
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import (
    used_vars,
    AnyBinding,
    Binding,
    Call,
    DataflowBlock,
    DataflowVar,
    Expr,
    GlobalVar,
    GraphFunc,
    MatchCast,
    OpRef,
    ShapeExpr,
    Tuple,
    TupleGetItem,
    Var,
)
from tilework.ir.info import ShapeInfo, TensorInfo
from tilework.ir.loop import Cast, Load, TensorFunc
from tilework.ir.module import IRModule
from tilework.ir.rewrite import FuncRewriter
from tilework.ir.sym import SymVar
from tilework.op.base import OpPattern
from tilework.schedule.analysis import is_reduction, matmul_parts, single_store
from tilework.schedule.tree import blocks_of
from tilework.transform.annotate_op_pattern import pattern_of
from tilework.transform.base import Pass

PRIMITIVE_ATTR = "primitive"
_EXIT = -1  # the virtual node after the block that every post-dominator path ends at


# -- the graph of one dataflow block ------------------------------------------------------------


def _known_tensor(info: object) -> bool:
    return isinstance(info, TensorInfo) and info.shape is not None and info.dtype is not None


def kernel_call(b: AnyBinding, mod: IRModule) -> TensorFunc | None:
    """The TensorFunc a binding calls when it is a fusable ``call_tensor``: a kernel not yet
    scheduled with one output tensor, tensor arguments whose shapes and dtypes are known, and
    sym args given as a shape."""
    if not isinstance(b, Binding) or not isinstance(b.value, Call):
        return None
    call = b.value
    if not isinstance(call.callee, OpRef) or call.callee.name != "call_tensor":
        return None
    if len(call.args) not in (2, 3) or not isinstance(call.args[1], Tuple):
        return None
    gv = call.args[0]
    f = mod.get(gv.name) if isinstance(gv, GlobalVar) else None
    if not isinstance(f, TensorFunc) or f.num_outputs != 1 or f.attrs.get("scheduled"):
        return None  # a kernel already scheduled (by a user or a tuner) is kept as it is
    if len(call.args) == 3 and not isinstance(call.args[2], ShapeExpr):
        return None
    if not _known_tensor(b.var.info) or not all(_known_tensor(a.info) for a in call.args[1].fields):
        return None
    return f


def _is_copy(f: TensorFunc) -> bool:
    """Whether every block of ``f`` stores a value that is a load (maybe cast): data movement."""
    blocks = blocks_of(f)
    for b in blocks:
        st = single_store(b)
        value = st.value if st is not None else None
        while isinstance(value, Cast):
            value = value.value
        if is_reduction(b) or not isinstance(value, Load):
            return False
    return bool(blocks)


def _contracts(f: TensorFunc) -> bool:
    return any(is_reduction(b) and matmul_parts(b) is not None for b in blocks_of(f))


@dataclass
class _Group:
    members: set[int]
    pattern: OpPattern
    copy: bool  # every kernel only moves data (each store's value is a load)

    @property
    def sink(self) -> int:
        return max(self.members)


@dataclass
class _BlockGraph:
    """Nodes (the bindings of one dataflow block), their consumers and post-dominators."""

    bindings: tuple[AnyBinding, ...]
    patterns: list[OpPattern]
    copies: list[bool]  # the kernel only moves data
    contracts: list[bool]  # the kernel has a matmul-like block (operands read many times)
    consumers: list[list[int]]
    ipdom: list[int] = field(default_factory=list)
    depth: dict[int, int] = field(default_factory=dict)

    @staticmethod
    def of(block: DataflowBlock, mod: IRModule) -> "_BlockGraph":
        bs = block.bindings
        index = {b.var: i for i, b in enumerate(bs)}
        consumers: list[list[int]] = [[] for _ in bs]
        for j, b in enumerate(bs):
            for v in dict.fromkeys(used_vars(b.value)):
                i = index.get(v)
                if i is not None and j not in consumers[i]:
                    consumers[i].append(j)
        kernels = [kernel_call(b, mod) for b in bs]
        pats = [OpPattern.OPAQUE if f is None else pattern_of(f) for f in kernels]
        copies = [f is not None and _is_copy(f) for f in kernels]
        contracts = [f is not None and _contracts(f) for f in kernels]
        g = _BlockGraph(bs, pats, copies, contracts, consumers)
        g.post_dominators()
        return g

    def post_dominators(self) -> None:
        n = len(self.bindings)
        self.ipdom = [_EXIT] * n
        self.depth = {_EXIT: 0}
        for i in reversed(range(n)):
            cs = self.consumers[i]
            d = cs[0] if cs else _EXIT
            for c in cs[1:]:
                d = self.lca(d, c)
            self.ipdom[i] = d
            self.depth[i] = self.depth[d] + 1

    def lca(self, a: int, b: int) -> int:
        while a != b:
            if self.depth[a] >= self.depth[b]:
                a = self.ipdom[a]
            else:
                b = self.ipdom[b]
        return a

    def between(self, s: int, d: int) -> set[int]:
        """The nodes on the paths from ``s`` to its post-dominator ``d``, both excluded."""
        seen: set[int] = set()
        todo = [c for c in self.consumers[s] if c != d]
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            todo.extend(c for c in self.consumers[x] if c != d and c not in seen)
        return seen


# -- the partition ------------------------------------------------------------------------------


def _may_join(g: _BlockGraph, src: _Group, d: int, dom_group: _Group, inner: list[OpPattern]) -> bool:
    """The fusion rules of the module doc for group ``src`` joining the group ``dom_group`` of
    its post-dominator ``d``, with groups of patterns ``inner`` between them."""
    dom_node = g.patterns[d]
    if any(p > OpPattern.INJECTIVE for p in inner):
        return False
    if src.pattern == OpPattern.OUT_EWISE_FUSABLE:
        limit = OpPattern.BROADCAST
        return dom_node <= limit and dom_group.pattern <= limit and all(p <= limit for p in inner)
    if src.pattern == OpPattern.REDUCTION:
        return dom_node <= OpPattern.INJECTIVE and dom_group.pattern <= OpPattern.INJECTIVE
    if src.pattern <= OpPattern.INJECTIVE:
        if dom_node <= OpPattern.INJECTIVE:
            return True
        # a prologue of a reduction; arithmetic inlined into a contraction would be redone
        # for every element of the other operand, so only data movement goes there
        return dom_node == OpPattern.REDUCTION and (src.copy or not g.contracts[d])
    return False


def partition(block: DataflowBlock, mod: IRModule, max_group_size: int) -> list[list[int]]:
    """The groups of two or more bindings of ``block`` (indices in order) that fuse."""
    g = _BlockGraph.of(block, mod)
    groups = [_Group({i}, p, c) for i, (p, c) in enumerate(zip(g.patterns, g.copies))]
    owner = list(range(len(groups)))  # node -> index of its group in ``groups``
    for s in range(len(g.bindings)):
        src = groups[owner[s]]
        d = g.ipdom[s]
        if src.sink != s or src.pattern == OpPattern.OPAQUE or d == _EXIT:
            continue
        inner = g.between(s, d)
        joined = {owner[x] for x in inner} | {owner[s], owner[d]}
        if len(joined) == 1:
            continue
        inner_pats = [groups[owner[x]].pattern for x in inner]
        if not _may_join(g, src, d, groups[owner[d]], inner_pats):
            continue
        members = set().union(*(groups[k].members for k in joined))
        if len(members) > max_group_size:
            continue
        merged = _Group(members, max(groups[k].pattern for k in joined), all(groups[k].copy for k in joined))
        groups.append(merged)
        for x in members:
            owner[x] = len(groups) - 1
    out = {owner[i] for i in range(len(g.bindings))}
    return [sorted(groups[k].members) for k in sorted(out, key=lambda k: groups[k].sink) if len(groups[k].members) > 1]


# -- the rewrite --------------------------------------------------------------------------------


@dataclass
class _Plan:
    """One group: its bindings, what it reads, what it gives back, and its function."""

    bindings: list[Binding]
    inputs: list[Expr]  # vars and constants of the caller, in order of first use
    outputs: list[Var]
    syms: tuple[SymVar, ...]  # passed as a shape: sym vars no tensor input defines


def _plan(bs: list[Binding], outside_uses: set[Var]) -> _Plan:
    """What the group of bindings ``bs`` reads and gives back; ``outside_uses`` are the vars
    that the other bindings of the block use (a non-dataflow var may be used after it)."""
    bound = {b.var for b in bs}
    inputs: dict[Expr, None] = {}
    for b in bs:
        assert isinstance(b.value, Call) and isinstance(b.value.args[1], Tuple)
        for a in b.value.args[1].fields:
            if a not in bound:
                inputs.setdefault(a, None)
    last = bs[-1].var
    outputs = [b.var for b in bs if b.var is last or b.var in outside_uses or not isinstance(b.var, DataflowVar)]
    defined: set[SymVar] = set()
    for a in inputs:
        defined.update(I.defined_vars(a.info))
    needed: dict[SymVar, None] = {}
    for b in bs:
        call = b.value
        assert isinstance(call, Call) and isinstance(call.args[1], Tuple)
        for info in [b.var.info, *(a.info for a in call.args[1].fields)]:
            needed.update(dict.fromkeys(I.free_vars(info)))
        if len(call.args) == 3:
            shape = call.args[2]
            assert isinstance(shape, ShapeExpr)
            needed.update(dict.fromkeys(I.free_vars(ShapeInfo(shape.values))))
    syms = tuple(v for v in needed if v not in defined)
    return _Plan(bs, list(inputs), outputs, syms)


def _callee_names(bs: list[Binding]) -> list[str]:
    names: dict[str, None] = {}
    for b in bs:
        assert isinstance(b.value, Call) and isinstance(b.value.args[0], GlobalVar)
        names.setdefault(b.value.args[0].name, None)
    return list(names)


def _func_name(bs: list[Binding]) -> str:
    parts = _callee_names(bs)
    return "fused_" + "_".join(parts[:4]) + ("_etc" if len(parts) > 4 else "")


def _unique(name: str, used: set[str]) -> str:
    out, k = name, 0
    while out in used:
        k += 1
        out = f"{name}_{k}"
    used.add(out)
    return out


def build_group_func(plan: _Plan, mod: IRModule) -> GraphFunc:
    """The primitive graph function computing ``plan``'s bindings."""
    bb = BlockBuilder(IRModule({n: mod[n] for n in _callee_names(plan.bindings)}))
    params: list[Var] = []
    env: dict[Expr, Expr] = {}
    names: set[str] = set()
    for k, a in enumerate(plan.inputs):
        p = Var(_unique(a.name if isinstance(a, Var) else f"c{k}", names), a.info)
        params.append(p)
        env[a] = p
    if plan.syms:
        params.append(Var(_unique("syms", names), ShapeInfo(plan.syms)))
    outs = set(plan.outputs)
    with bb.function("group", params, attrs={PRIMITIVE_ATTR: True}):
        with bb.dataflow():
            for b in plan.bindings:
                call = b.value
                assert isinstance(call, Call) and isinstance(call.args[1], Tuple)
                args = Tuple(tuple(env.get(a, a) for a in call.args[1].fields))
                value = Call(call.callee, (call.args[0], args, *call.args[2:]), call.attrs, call.sinfo_args)
                emit = bb.emit_output if b.var in outs else bb.emit
                env[b.var] = emit(value, name=b.var.name)
        results = [env[v] for v in plan.outputs]
        bb.emit_func_output(results[0] if len(results) == 1 else Tuple(tuple(results)))
    f = bb.get()["group"]
    assert isinstance(f, GraphFunc)
    return f


class _Fuser(FuncRewriter):
    def __init__(self, mod: IRModule, max_group_size: int) -> None:
        super().__init__(mod)
        self.max_group_size = max_group_size
        self.plans: dict[Binding, _Plan] = {}
        self.names = set(mod)
        self.made: dict[int, list[tuple[GraphFunc, GlobalVar]]] = {}  # structural hash -> functions

    def add_group_func(self, plan: _Plan) -> GlobalVar:
        """The group function for ``plan``; a structurally equal one made before is reused
        (the layers of a model share their fused kernels)."""
        from tilework.ir.structural import structural_equal, structural_hash

        func = build_group_func(plan, self.mod)
        h = structural_hash(func)
        for other, gv in self.made.get(h, []):
            if structural_equal(other, func, map_free_vars=True):
                return gv
        name = _unique(_func_name(plan.bindings), self.names)
        gv = self.bb.add_func(name, func)
        self.made.setdefault(h, []).append((func, gv))
        return gv

    def rewrite_func(self, name: str, func: GraphFunc) -> GraphFunc:
        if func.attrs.get(PRIMITIVE_ATTR):
            return func
        self.plans = {}
        blocks = func.body.blocks
        for block in blocks:
            if not isinstance(block, DataflowBlock):
                continue
            for idx in partition(block, self.mod, self.max_group_size):
                bs = [b for b in (block.bindings[i] for i in idx) if isinstance(b, Binding)]
                uses: set[Var] = set()
                for j, b in enumerate(block.bindings):
                    if j not in idx:
                        uses.update(used_vars(b.value))
                plan = _plan(bs, uses)
                for b in bs:
                    self.plans[b] = plan
        return super().rewrite_func(name, func)

    def visit_binding(self, b: Binding | MatchCast, in_dataflow: bool) -> None:
        plan = self.plans.get(b) if isinstance(b, Binding) else None
        if plan is None:
            super().visit_binding(b, in_dataflow)
            return
        if b is not plan.bindings[-1]:
            return  # the group is emitted at its last binding
        gv = self.add_group_func(plan)
        args: list[Expr] = [self.remap(a) for a in plan.inputs]
        if plan.syms:
            args.append(ShapeExpr(plan.syms))
        call = Call(gv, tuple(args))
        if len(plan.outputs) == 1:
            self.emit_like(plan.outputs[0], call, in_dataflow)
            return
        tup = self.bb.emit(call, name=gv.name + "_out")
        for k, v in enumerate(plan.outputs):
            self.emit_like(v, TupleGetItem(tup, k), in_dataflow)


@dataclass(frozen=True)
class FuseOps(Pass):
    max_group_size: int = 64
    name: str = "fuse_ops"

    def run(self, mod: IRModule) -> IRModule:
        return _Fuser(mod, self.max_group_size).run()


__all__ = ["FuseOps", "PRIMITIVE_ATTR", "build_group_func", "kernel_call", "partition"]
