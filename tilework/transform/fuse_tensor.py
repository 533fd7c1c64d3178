"""fuse_tensor: merge each primitive group function into one TensorFunc.

The kernels that a ``primitive`` graph function (made by fuse_ops) calls are instantiated one
after another in a single TensorFunc: the group's tensor params become its input buffers, its
results the output buffers, and each value passed between kernels a scratch buffer
(``Allocate``) whose producing block is inlined into its readers with ``compute_inline`` where
that is valid (not a reduction, one store) and repeats no costly work (``repeats_work``: a
sigmoid of ``[N, 1, C]`` that a multiply reads at every pixel stays a block, computed once).
Each callee's sym vars are mapped to the caller's dims by matching buffer shapes: bare vars bind first (a callee ``[n, m, n*m]`` accepts ``[16,
16, 256]``), a compound dim with one unbound var is solved when it is linear in it, and every
dim must then be provably equal, so a static caller specialises a symbolic kernel (substituted
and simplified). Loop vars, iter vars, scratch buffers and block names are renewed so each is
bound once. The group's call becomes one ``call_tensor`` of the fused kernel, passing as sym
args the sym vars no buffer shape has as a bare dim. A group that cannot be merged soundly (an
unprovable dim equality, a binding that is not a kernel call) stays a plain graph function
without the ``primitive`` attr, keeping its run-time checks. Kernels only groups called are
dropped. Requires a well-formed module after fuse_ops; guarantees a well-formed module computing
the same values, with no primitive graph function left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tilework.errors import ScheduleError, TileworkError
from tilework.ir import info as I
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.graph import (
    Attrs,
    Binding,
    Call,
    Expr,
    GlobalVar,
    GraphFunc,
    OpRef,
    ShapeExpr,
    Tuple,
    Var,
)
from tilework.ir.info import ShapeInfo, StructInfo, TensorInfo
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
    Scalar,
    Select,
    SeqStmt,
    Stmt,
    Store,
    TensorFunc,
    Unary,
    free_sym_vars,
)
from tilework.ir.module import IRModule
from tilework.ir.rewrite import FuncRewriter
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.op.calls import call_tensor
from tilework.schedule.analysis import is_reduction
from tilework.schedule.block_primitives import compute_inline
from tilework.schedule.rules.inline import repeats_work
from tilework.schedule.tree import blocks_of
from tilework.transform.annotate_op_pattern import PATTERN_ATTR, func_pattern, pattern_name
from tilework.transform.fuse_ops import PRIMITIVE_ATTR
from tilework.transform.base import Pass
from tilework.transform.dead_code_elimination import referenced_globals


class _CannotFuse(TileworkError):
    """A group that cannot be merged soundly; the message says why."""


# -- matching a callee's sym vars to the caller's dims ------------------------------------------


def _solve_linear(pattern: Dim, target: Dim, env: dict[SymVar, Dim]) -> None:
    """Bind the one unbound var ``v`` of ``pattern`` when ``pattern`` is ``a * v + b`` with a
    constant ``a`` and ``target - b`` provably divisible by it."""
    if isinstance(pattern, int):
        return
    free = [v for v in sym_walk.free_vars(pattern) if v not in env]
    if len(free) != 1:
        return
    v = free[0]
    t = SymVar("t", v.lo, v.hi)  # stands for v, apart from any caller var of the same identity
    known = sym_walk.substitute(pattern, {**env, v: t})
    b = sym_walk.substitute(known, {t: 0})
    a = sym.sub(sym_walk.substitute(known, {t: 1}), b)
    if not isinstance(a, int) or a == 0:
        return
    cand = sym.floordiv(sym.sub(target, b), a)
    if sym.prove_eq(sym_walk.substitute(known, {t: cand}), target):
        env[v] = cand


def match_syms(pairs: Sequence[tuple[Sequence[Dim], Sequence[Dim]]], given: dict[SymVar, Dim]) -> dict[SymVar, Dim]:
    """The caller dim for each sym var of a callee, from (callee shape, caller shape) pairs;
    ``given`` holds the values passed as sym args. Raises ``_CannotFuse`` when a dim cannot be
    proved equal or a var stays unbound or out of its declared range."""
    env = dict(given)
    for pat, act in pairs:
        if len(pat) != len(act):
            raise _CannotFuse(f"rank {len(pat)} buffer given a rank {len(act)} tensor")
        for p, a in zip(pat, act):
            if isinstance(p, SymVar) and p not in env:
                env[p] = a
    for pat, act in pairs:
        for p, a in zip(pat, act):
            _solve_linear(p, a, env)
    for pat, act in pairs:
        for p, a in zip(pat, act):
            unbound = [v.name for v in (sym_walk.free_vars(p) if not isinstance(p, int) else ()) if v not in env]
            if unbound:
                raise _CannotFuse(f"sym var {unbound[0]} of a kernel cannot be bound from the caller's shapes")
            if not sym.prove_eq(sym_walk.substitute(p, env), a):
                raise _CannotFuse(f"cannot prove {sym.to_str(p)} = {sym.to_str(a)}")
    for v, e in env.items():
        if not sym.prove_ge(e, v.lo) or (v.hi is not None and not sym.prove_le(e, v.hi)):
            raise _CannotFuse(f"{sym.to_str(e)} may be outside the range of the kernel's sym var {v.name}")
    return env


# -- instantiating a callee body ----------------------------------------------------------------


class _Instance:
    """Copies a callee body into the fused function: sym vars substituted, buffers replaced,
    loop vars, iter vars, scratch buffers and blocks renewed with names fresh in ``names``."""

    def __init__(self, env: dict[SymVar, Dim], bufs: dict[Buffer, Buffer], names: set[str], blocks: set[str]) -> None:
        self.env = env
        self.bufs = bufs
        self.names = names
        self.blocks = blocks

    def dim(self, d: Dim) -> Dim:
        return d if isinstance(d, int) else sym_walk.substitute(d, self.env)

    def var(self, v: SymVar, extent: Dim) -> SymVar:
        hi = sym.bounds(extent)[1]
        new = SymVar(_fresh(self.names, v.name), 0, None if hi is None else max(hi - 1, 0))
        self.env[v] = new
        return new

    def buffer(self, b: Buffer) -> Buffer:
        out = self.bufs.get(b)
        if out is None:
            raise _CannotFuse(f"buffer {b.name} is used outside its allocation")
        return out

    def scalar(self, x: Scalar) -> Scalar:
        if isinstance(x, (int, SymExpr)):
            return self.dim(x)
        if isinstance(x, Const):
            return x
        if isinstance(x, Load):
            return Load(self.buffer(x.buffer), tuple(self.scalar(i) for i in x.indices))
        if isinstance(x, Binary):
            return Binary(x.op, self.scalar(x.a), self.scalar(x.b), x.dtype)
        if isinstance(x, Unary):
            return Unary(x.op, self.scalar(x.a), x.dtype)
        if isinstance(x, Cast):
            return Cast(x.dtype, self.scalar(x.value))
        if isinstance(x, Select):
            return Select(self.scalar(x.cond), self.scalar(x.a), self.scalar(x.b), x.dtype)
        if isinstance(x, Intrin):
            return Intrin(x.name, tuple(self.scalar(a) for a in x.args), x.dtype)
        raise _CannotFuse(f"unknown scalar expression {type(x).__name__}")

    def stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, Store):
            return Store(self.buffer(s.buffer), tuple(self.scalar(i) for i in s.indices), self.scalar(s.value))
        if isinstance(s, For):
            extent = self.dim(s.extent)
            return For(self.var(s.var, extent), extent, self.stmt(s.body), s.kind)
        if isinstance(s, Block):
            return self.block(s)
        if isinstance(s, Allocate):
            b = s.buffer
            new = Buffer(_fresh(self.names, b.name), tuple(self.dim(d) for d in b.shape), b.dtype)
            self.bufs[b] = new
            return Allocate(new, self.stmt(s.body))
        if isinstance(s, IfThenElse):
            els = None if s.else_body is None else self.stmt(s.else_body)
            return IfThenElse(self.scalar(s.cond), self.stmt(s.then_body), els)
        if isinstance(s, SeqStmt):
            return SeqStmt(tuple(self.stmt(c) for c in s.stmts))
        raise _CannotFuse(f"unknown statement {type(s).__name__}")

    def block(self, s: Block) -> Block:
        ivs = []
        for iv in s.iter_vars:
            extent, binding = self.dim(iv.extent), self.dim(iv.binding)
            ivs.append(IterVar(self.var(iv.var, extent), extent, iv.kind, binding))
        reads = tuple(dict.fromkeys(self.buffer(b) for b in s.reads))
        writes = tuple(dict.fromkeys(self.buffer(b) for b in s.writes))
        init = None if s.init is None else self.stmt(s.init)
        return Block(_fresh(self.blocks, s.name), tuple(ivs), reads, writes, self.stmt(s.body), init)


def _fresh(used: set[str], base: str) -> str:
    name, k = base, 0
    while name in used:
        k += 1
        name = f"{base}_{k}"
    used.add(name)
    return name


def _peel_allocs(s: Stmt) -> tuple[list[Buffer], Stmt]:
    """The buffers of the ``Allocate``s wrapping ``s`` at its top, and what they wrap."""
    bufs: list[Buffer] = []
    while isinstance(s, Allocate):
        bufs.append(s.buffer)
        s = s.body
    return bufs, s


# -- merging one group --------------------------------------------------------------------------


def _tensor_shape(info: StructInfo, what: str) -> tuple[tuple[Dim, ...], str]:
    if not isinstance(info, TensorInfo) or info.shape is None or info.dtype is None:
        raise _CannotFuse(f"{what} is not a tensor of known shape and dtype")
    return info.shape, info.dtype


def _group_bindings(func: GraphFunc) -> list[Binding]:
    out: list[Binding] = []
    for block in func.body.blocks:
        for b in block.bindings:
            if not isinstance(b, Binding) or not is_call_tensor(b.value):
                raise _CannotFuse(f"%{b.var.name} is not bound to a call_tensor")
            out.append(b)
    return out


def is_call_tensor(e: Expr) -> bool:
    """``e`` is a ``call_tensor`` call (of a kernel of the module)."""
    return isinstance(e, Call) and isinstance(e.callee, OpRef) and e.callee.name == "call_tensor"


def _results(func: GraphFunc) -> list[Var]:
    body = func.body.body
    fields = body.fields if isinstance(body, Tuple) else (body,)
    if not all(isinstance(f, Var) for f in fields):
        raise _CannotFuse("the group's result is not a var or a tuple of vars")
    outs = [f for f in fields if isinstance(f, Var)]
    if len(set(outs)) != len(outs) or any(o in func.params for o in outs):
        raise _CannotFuse("the group returns a value twice or returns a param")
    return outs


def _group_syms(func: GraphFunc) -> set[SymVar]:
    out: set[SymVar] = set()
    for p in func.params:
        out.update(I.free_vars(p.info))
    for block in func.body.blocks:
        for b in block.bindings:
            out.update(I.free_vars(b.var.info))
            if isinstance(b.value, Call) and len(b.value.args) == 3:
                out.update(I.free_vars(b.value.args[2].info))
    return out


def fuse_group(mod: IRModule, func: GraphFunc) -> TensorFunc:
    """The one TensorFunc computing the primitive graph function ``func`` (module doc)."""
    names = {v.name for v in _group_syms(func)}  # one namespace with buffers and loop vars
    blocks: set[str] = set()
    bufs: dict[Var, Buffer] = {}
    inputs: list[Buffer] = []
    for p in func.params:
        if isinstance(p.info, ShapeInfo):
            continue  # it only defines sym vars
        shape, dtype = _tensor_shape(p.info, f"param %{p.name}")
        bufs[p] = Buffer(_fresh(names, p.name), shape, dtype)
        inputs.append(bufs[p])
    results = _results(func)
    outputs = []
    for v in results:
        shape, dtype = _tensor_shape(v.info, f"result %{v.name}")
        outputs.append(Buffer(_fresh(names, v.name), shape, dtype))
    out_of = dict(zip(results, outputs))
    scratch: list[Buffer] = []  # values passed between kernels
    allocs: list[Buffer] = []  # every buffer allocated around the body
    pieces: list[Stmt] = []
    for b in _group_bindings(func):
        call = b.value
        assert isinstance(call, Call)
        shape, dtype = _tensor_shape(b.var.info, f"%{b.var.name}")
        dest = out_of.get(b.var)
        if dest is None:
            dest = Buffer(_fresh(names, b.var.name), shape, dtype)
            scratch.append(dest)
            allocs.append(dest)
        bufs[b.var] = dest
        kept, body = _instantiate(mod, call, bufs, dest, names, blocks)
        allocs.extend(kept)
        pieces.append(body)
    if not pieces:
        raise _CannotFuse("the group calls no kernel")
    stmt: Stmt = pieces[0] if len(pieces) == 1 else SeqStmt(tuple(pieces))
    for buf in reversed(allocs):
        stmt = Allocate(buf, stmt)
    params: list[Buffer | SymVar] = [*inputs, *outputs]
    params.extend(_sym_params(stmt, [*inputs, *outputs]))
    fused = TensorFunc(tuple(params), stmt, len(outputs))
    fused = _inline_scratch(fused, scratch)
    return fused.replace(attrs=fused.attrs.with_(**{PATTERN_ATTR: pattern_name(func_pattern(fused))}))


def _instantiate(
    mod: IRModule, call: Call, bufs: dict[Var, Buffer], dest: Buffer, names: set[str], blocks: set[str]
) -> tuple[list[Buffer], Stmt]:
    """The body of the kernel ``call`` runs, on the fused function's buffers, with its top-level
    allocations peeled off (returned first, to be hoisted around the whole body)."""
    gv, args = call.args[0], call.args[1]
    if not isinstance(gv, GlobalVar) or not isinstance(args, Tuple):
        raise _CannotFuse("a call_tensor that does not name its kernel")
    callee = mod.get(gv.name)
    if not isinstance(callee, TensorFunc):
        raise _CannotFuse(f"@{gv.name} is not a TensorFunc of the module")
    if len(args.fields) != len(callee.inputs) or callee.num_outputs != 1:
        raise _CannotFuse(f"@{gv.name} is called with {len(args.fields)} inputs and one output")
    actual: list[Buffer] = []
    for a in args.fields:
        if not isinstance(a, Var) or a not in bufs:
            raise _CannotFuse(f"an argument of @{gv.name} is not a param or a value of the group")
        actual.append(bufs[a])
    actual.append(dest)
    given: dict[SymVar, Dim] = {}
    if len(call.args) == 3:
        shape = call.args[2]
        values = shape.values if isinstance(shape, ShapeExpr) else getattr(shape.info, "values", None)
        if values is None or len(values) != len(callee.sym_params):
            raise _CannotFuse(f"the sym args of @{gv.name} are not known dims")
        given = dict(zip(callee.sym_params, values))
    for cb, ab in zip(callee.buffers, actual):
        if cb.dtype != ab.dtype:
            raise _CannotFuse(f"buffer {cb.name} of @{gv.name} is {cb.dtype} but gets {ab.dtype}")
    env = match_syms([(cb.shape, ab.shape) for cb, ab in zip(callee.buffers, actual)], given)
    inst = _Instance(env, dict(zip(callee.buffers, actual)), names, blocks)
    body = inst.stmt(callee.body)
    return _peel_allocs(body)


def _sym_params(body: Stmt, buffers: list[Buffer]) -> list[SymVar]:
    """Sym vars the fused body and buffer shapes need that no buffer has as a bare dim."""
    supplied = {d for b in buffers for d in b.shape if isinstance(d, SymVar)}
    return [v for v in free_sym_vars(body, buffers) if v not in supplied]


def _inline_scratch(func: TensorFunc, scratch: list[Buffer]) -> TensorFunc:
    """Inline the block producing each value passed between kernels into its readers, where
    ``compute_inline`` allows it (the block is not a reduction and is one store) and it does
    not repeat costly work (``repeats_work``: a reader reusing one element of it many times)."""
    for buf in scratch:
        writers = [b for b in blocks_of(func) if any(w is buf for w in b.writes)]
        if len(writers) != 1 or is_reduction(writers[0]) or repeats_work(func, writers[0]):
            continue
        try:
            func = compute_inline(func, writers[0].name)
        except ScheduleError:
            continue
    return func


# -- the module rewrite -------------------------------------------------------------------------


def _unify(param: StructInfo, arg: StructInfo, env: dict[SymVar, Dim]) -> None:
    pat = param.shape if isinstance(param, TensorInfo) else param.values if isinstance(param, ShapeInfo) else None
    act = arg.shape if isinstance(arg, TensorInfo) else arg.values if isinstance(arg, ShapeInfo) else None
    if pat is None or act is None or len(pat) != len(act):
        return
    for p, a in zip(pat, act):
        if isinstance(p, SymVar):
            env.setdefault(p, a)


class _CallRewriter(FuncRewriter):
    """Replaces each call of a fused group by a ``call_tensor`` of its kernel."""

    def __init__(self, mod: IRModule, groups: dict[str, GraphFunc], fused: dict[str, TensorFunc]) -> None:
        super().__init__(mod)
        self.groups = groups
        self.fused = fused

    def rewrite_value(self, binding: Binding, value: Expr) -> Expr:
        if not isinstance(value, Call) or not isinstance(value.callee, GlobalVar):
            return value
        kernel = self.fused.get(value.callee.name)
        if kernel is None:
            return value
        group = self.groups[value.callee.name]
        env: dict[SymVar, Dim] = {}
        tensors: list[Expr] = []
        for p, a in zip(group.params, value.args):
            _unify(p.info, a.info, env)
            if not isinstance(p.info, ShapeInfo):
                tensors.append(a)
        sym_args = [sym_walk.substitute(v, env) for v in kernel.sym_params]
        gv = GlobalVar(value.callee.name)
        return call_tensor(gv, tensors, binding.value.info, sym_args)


def _callees(func: GraphFunc) -> set[str]:
    out: set[str] = set()
    for block in func.body.blocks:
        for b in block.bindings:
            if isinstance(b.value, Call) and is_call_tensor(b.value) and isinstance(b.value.args[0], GlobalVar):
                out.add(b.value.args[0].name)
    return out


def _referenced(mod: IRModule) -> set[str]:
    """Names of the functions any graph function of ``mod`` refers to."""
    out: set[str] = set()
    for _, f in mod.graph_funcs():
        out |= referenced_globals(f)
    return out


@dataclass(frozen=True)
class FuseTensor(Pass):
    name: str = "fuse_tensor"

    def run(self, mod: IRModule) -> IRModule:
        groups = {n: f for n, f in mod.graph_funcs() if f.attrs.get(PRIMITIVE_ATTR)}
        if not groups:
            return mod
        fused: dict[str, TensorFunc] = {}
        out = mod
        for name, g in groups.items():
            try:
                fused[name] = fuse_group(mod, g)
            except _CannotFuse:
                attrs = {k: v for k, v in g.attrs.items() if k != PRIMITIVE_ATTR}
                out = out.with_func(name, g.replace(attrs=Attrs(attrs)))
                continue
            out = out.with_func(name, fused[name])
        rewritten = _CallRewriter(out, groups, fused).run()
        callees: set[str] = set()
        for name in fused:
            callees |= _callees(groups[name])
        still = _referenced(rewritten)
        for name in callees - still:
            rewritten = rewritten.without(name)
        return rewritten


def fusion_passes() -> list[Pass]:
    """The fusion passes, to run after legalize and before default_schedule."""
    from tilework.transform.annotate_op_pattern import AnnotateOpPattern
    from tilework.transform.fuse_ops import FuseOps

    return [AnnotateOpPattern(), FuseOps(), FuseTensor()]


__all__ = ["FuseTensor", "fuse_group", "fusion_passes", "is_call_tensor", "match_syms"]
