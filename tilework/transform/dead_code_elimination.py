"""dead_code_elimination: drop bindings whose values nobody needs, and unreachable functions.

Bindings: one backward pass per body (and per If branch) keeps a binding when its var is read
later, when its value has an effect, or when it is a ``match_cast`` that *defines* a sym var
(first occurrence in scope) that something kept later mentions: in a struct info, a shape, a
prim value or a call's stated output. Effects are impure calls (``call_packed``, impure
functions, the ``vm_*`` allocation and check ops) and ops marked ``Op.effect`` (``assert_dims``):
they are never removed. An unused If goes only when neither branch keeps an effect. Blocks left
empty disappear.

Functions: the *entry* functions are the pass option ``entries`` when given, else the module
attr ``entry_funcs`` (a tuple of names) when set, else every graph function whose name does not
start with ``_``; ``main`` and any function with the attr ``export`` set are entries in every
case. Functions that no entry reaches through ``GlobalVar`` references (calls, ``call_tensor``
callees) are removed.

Requires a well-formed module. Guarantees a well-formed module whose entries compute the same
values with the same effects and the same run-time checks on everything they still use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from tilework.ir import info as I
from tilework.ir import sym_walk
from tilework.ir.builder import is_pure_call
from tilework.ir.graph import (
    AnyBinding,
    Binding,
    BindingBlock,
    Call,
    DataflowBlock,
    Expr,
    GlobalVar,
    GraphFunc,
    If,
    MatchCast,
    OpRef,
    PrimValue,
    SeqExpr,
    ShapeExpr,
    Var,
    used_vars,
)
from tilework.ir.module import IRModule
from tilework.ir.sym import SymExpr, SymVar
from tilework.ir.visitor import ExprVisitor
from tilework.op import base as opbase
from tilework.transform.base import Pass


class _SymReads(ExprVisitor):
    def __init__(self) -> None:
        self.syms: set[SymVar] = set()

    def visit(self, e: Expr) -> None:
        self.syms.update(I.free_vars(e.info))
        super().visit(e)

    def visit_shape_expr(self, e: ShapeExpr) -> None:
        for d in e.values:
            self.syms.update(sym_walk.free_vars(d))

    def visit_prim_value(self, e: PrimValue) -> None:
        if isinstance(e.value, SymExpr):
            self.syms.update(sym_walk.free_vars(e.value))

    def visit_call(self, e: Call) -> None:
        for s in e.sinfo_args:
            self.syms.update(I.free_vars(s))
        super().visit_call(e)


def expr_syms(e: Expr) -> set[SymVar]:
    """Sym vars an expression mentions: its struct info, shapes, prim values, stated infos."""
    reads = _SymReads()
    reads.visit(e)
    return reads.syms


def has_effect(value: Expr, mod: IRModule) -> bool:
    """An impure call or an effect op (a run-time check)."""
    if not isinstance(value, Call):
        return False
    if not is_pure_call(value, mod):
        return True
    if isinstance(value.callee, OpRef):
        op = opbase.lookup(value.callee.name)
        return op is not None and op.effect
    return False


class _Liveness:
    def __init__(self, mod: IRModule) -> None:
        self.mod = mod
        self.first_defs: dict[int, set[SymVar]] = {}  # id(match_cast) -> sym vars it defines

    def scan_defs(self, seq: SeqExpr, defined: set[SymVar]) -> None:
        """Record which sym vars each match_cast defines first in its scope."""
        defined = set(defined)
        for block in seq.blocks:
            for b in block.bindings:
                if isinstance(b, MatchCast):
                    new = set(I.defined_vars(b.cast_info)) - defined
                    self.first_defs[id(b)] = new
                    defined |= new
                elif isinstance(b.value, If):
                    self.scan_defs(b.value.then_branch, defined)
                    self.scan_defs(b.value.else_branch, defined)

    def seq(self, seq: SeqExpr, live: set[Var], syms: set[SymVar]) -> tuple[SeqExpr, bool]:
        """``seq`` without dead bindings, and whether it kept an effect. ``live`` and ``syms``
        (what is needed after ``seq``) grow with what the kept bindings read."""
        live.update(used_vars(seq.body))
        syms.update(expr_syms(seq.body))
        syms.update(I.free_vars(seq.info))
        effect = False
        blocks: list[BindingBlock] = []
        for block in reversed(seq.blocks):
            kept: list[AnyBinding] = []
            for b in reversed(block.bindings):
                new, eff = self.binding(b, live, syms)
                if new is not None:
                    kept.append(new)
                effect |= eff
            if kept:
                kind = DataflowBlock if block.is_dataflow else BindingBlock
                blocks.append(kind(tuple(reversed(kept))))
        return SeqExpr(tuple(reversed(blocks)), seq.body, seq.info), effect

    def binding(self, b: AnyBinding, live: set[Var], syms: set[SymVar]) -> tuple[AnyBinding | None, bool]:
        used = b.var in live
        if isinstance(b, Binding) and isinstance(b.value, If):
            return self.if_binding(b, b.value, used, live, syms)
        effect = isinstance(b, Binding) and has_effect(b.value, self.mod)
        defines = isinstance(b, MatchCast) and bool(self.first_defs.get(id(b), set()) & syms)
        if not (used or effect or defines):
            return None, False
        live.update(used_vars(b.value))
        syms.update(expr_syms(b.value))
        syms.update(I.free_vars(b.var.info))
        if isinstance(b, MatchCast):
            syms.update(I.free_vars(b.cast_info))
        return b, effect

    def if_binding(self, b: Binding, e: If, used: bool, live: set[Var], syms: set[SymVar]) -> tuple[AnyBinding | None, bool]:
        branch_live: set[Var] = set(live)
        branch_syms: set[SymVar] = set(syms)
        then_b, then_eff = self.seq(e.then_branch, branch_live, branch_syms)
        else_b, else_eff = self.seq(e.else_branch, branch_live, branch_syms)
        effect = then_eff or else_eff
        if not (used or effect):
            return None, False
        live.update(branch_live)
        live.update(used_vars(e.cond))
        syms.update(branch_syms)
        syms.update(I.free_vars(e.info))
        syms.update(I.free_vars(b.var.info))
        return Binding(b.var, If(e.cond, then_b, else_b, e.info)), effect


def eliminate_in_func(f: GraphFunc, mod: IRModule) -> GraphFunc:
    """``f`` without dead bindings."""
    lv = _Liveness(mod)
    params: set[SymVar] = set()
    for p in f.params:
        params.update(I.defined_vars(p.info))
    lv.scan_defs(f.body, params)
    body, _ = lv.seq(f.body, set(), set(I.free_vars(f.ret_info)))
    return f.replace(body=body)


# -- functions ----------------------------------------------------------------------------


class _GlobalRefs(ExprVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_global_var(self, e: GlobalVar) -> None:
        self.names.add(e.name)


def referenced_globals(f: GraphFunc) -> set[str]:
    """Names of the module functions ``f`` refers to."""
    refs = _GlobalRefs()
    refs.visit(f.body)
    return refs.names


def entry_functions(mod: IRModule, entries: Iterable[str] | None = None) -> set[str]:
    """The entries as the module docstring defines them."""
    if entries is not None:
        names = set(entries)
    elif "entry_funcs" in mod.attrs:
        names = set(mod.attrs["entry_funcs"])
    else:
        names = {name for name, _ in mod.graph_funcs() if not name.startswith("_")}
    names.add("main")
    for name, f in mod.items():
        if isinstance(f, GraphFunc) and f.attrs.get("export"):
            names.add(name)
    return {n for n in names if n in mod}


def reachable_functions(mod: IRModule, roots: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    todo = [r for r in roots if r in mod]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        f = mod[name]
        if isinstance(f, GraphFunc):
            todo.extend(n for n in referenced_globals(f) if n in mod and n not in seen)
    return seen


@dataclass(frozen=True)
class DeadCodeElimination(Pass):
    entries: tuple[str, ...] | None = None
    remove_functions: bool = True
    name: str = "dead_code_elimination"

    def run(self, mod: IRModule) -> IRModule:
        out = mod
        for name, f in mod.graph_funcs():
            out = out.with_func(name, eliminate_in_func(f, mod))
        if not self.remove_functions:
            return out
        keep = reachable_functions(out, entry_functions(out, self.entries))
        for name in list(out):
            if name not in keep:
                out = out.without(name)
        return out


__all__ = ["DeadCodeElimination", "eliminate_in_func", "entry_functions", "reachable_functions", "referenced_globals", "has_effect"]
