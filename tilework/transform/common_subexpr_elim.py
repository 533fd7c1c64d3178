"""common_subexpr_elim: compute each pure call once per dataflow block.

Within one dataflow block, a call whose callee, arguments (after earlier eliminations, so
chains collapse), attributes and stated output infos equal those of an earlier call of the
block is replaced by the earlier call's var (then inlined as an alias by the rewrite driver).
Candidates are pure graph-level calls: op calls that are pure and not effects (no ``vm_*`` op,
no ``call_lib``/``call_packed``), ``call_tensor``, and calls of pure graph functions. Arguments
compare as: vars by identity, constants by dtype, shape and bytes, shapes and prim values by
their (interned) dims, globals and ops by name. Dataflow blocks hold no impure call, and
nothing is shared across blocks, so no call is merged across an impure one.

Requires a well-formed module. Guarantees a well-formed module computing the same values. An
escaping var equal to an earlier dataflow var of its block stays bound to it (``gv = lv``);
canonicalize_bindings then lets ``gv`` take over the computation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

from tilework.ir.builder import is_pure_call
from tilework.ir.graph import (
    Call,
    Constant,
    Expr,
    ExternFunc,
    GlobalVar,
    OpRef,
    PrimValue,
    ShapeExpr,
    StringImm,
    Tuple,
    Var,
)
from tilework.ir.module import IRModule
from tilework.op import base as opbase
from tilework.transform.base import Pass
from tilework.pattern.core import Match, wildcard
from tilework.transform.rewrite_driver import Rule, apply_rules

_NOT_CSE = frozenset({"call_lib", "call_packed"})


def leaf_key(e: Expr, alias: Callable[[Var], Var] = lambda v: v) -> Hashable | None:
    """A hashable key equal for leaves that denote the same value; None for other exprs.
    ``alias`` maps a var to the var it is an alias of."""
    if isinstance(e, Var):
        return ("var", alias(e))
    if isinstance(e, Constant):
        return ("const", str(e.data.dtype), e.data.shape, e.data.tobytes())
    if isinstance(e, ShapeExpr):
        return ("shape", e.values)
    if isinstance(e, PrimValue):
        return ("prim", type(e.value).__name__, e.value, e.info)
    if isinstance(e, StringImm):
        return ("str", e.value)
    if isinstance(e, GlobalVar):
        return ("global", e.name)
    if isinstance(e, OpRef):
        return ("op", e.name)
    if isinstance(e, ExternFunc):
        return ("extern", e.symbol)
    if isinstance(e, Tuple):
        fields = tuple(leaf_key(f, alias) for f in e.fields)
        return None if any(f is None for f in fields) else ("tuple", fields)
    return None


def call_key(call: Call, alias: Callable[[Var], Var] = lambda v: v) -> Hashable | None:
    parts = [leaf_key(call.callee, alias), *(leaf_key(a, alias) for a in call.args)]
    if any(p is None for p in parts):
        return None
    return (tuple(parts), call.attrs, call.sinfo_args)


def is_candidate(call: Call, mod: IRModule) -> bool:
    callee = call.callee
    if isinstance(callee, OpRef):
        op = opbase.lookup(callee.name)
        if op is None or op.effect or callee.name in _NOT_CSE or callee.name.startswith("vm_"):
            return False
    elif not isinstance(callee, GlobalVar):
        return False
    return is_pure_call(call, mod)


def _alias_root(v: Var, values: dict[Var, Expr]) -> Var:
    """The var at the end of a chain of kept aliases (``gv = lv`` escaping a block)."""
    for _ in range(64):
        nxt = values.get(v)
        if not isinstance(nxt, Var):
            return v
        v = nxt
    return v


def _cse(value: Expr, m: Match) -> Expr | None:
    ctx = m.ctx
    if not ctx.in_dataflow or not isinstance(value, Call) or not is_candidate(value, ctx.mod):
        return None
    key = call_key(value, lambda v: _alias_root(v, ctx.values))
    if key is None:
        return None
    earlier = ctx.memo.get(("cse", key))
    if earlier is not None:
        return earlier
    ctx.defer(lambda bound: ctx.memo.setdefault(("cse", key), bound))
    return None


CSE_RULE = Rule("common_subexpr", wildcard().where(lambda e, m: isinstance(e, Call)), _cse)


@dataclass(frozen=True)
class CommonSubexprElim(Pass):
    name: str = "common_subexpr_elim"

    def run(self, mod: IRModule) -> IRModule:
        return apply_rules(mod, (CSE_RULE,), inline_aliases=True)


__all__ = ["CommonSubexprElim", "CSE_RULE", "call_key", "leaf_key", "is_candidate"]
