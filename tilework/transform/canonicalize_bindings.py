"""canonicalize_bindings: remove trivial bindings so that later passes see values, not aliases.

What it does, as rewrite rules run by the rewrite driver (``CANONICALIZE_RULES``):

- ``y = x`` (a var bound to a var) is dropped and uses of ``y`` read ``x`` (the driver's alias
  inlining);
- ``y = match_cast(x, info)`` where ``x``'s struct info already proves ``info`` (base check
  PASS) is a no-op: it becomes the alias ``y = x``. A cast that could fail, or that binds a
  sym var for the first time, is never a no-op (a new sym var cannot be proved equal to a known
  dim), so it stays;
- ``t[i]`` of a tuple literal (written in place or bound to a var) becomes field ``i``.

Dataflow outputs stay correct: an escaping var ``gv`` bound to a dataflow var ``lv`` of its own
block (``lv = f(x); gv = lv``) is handled before the rules run, by binding ``f(x)`` to ``gv``
directly and reading ``gv`` wherever ``lv`` was read; an escaping var is never replaced by a
dataflow var after the block.

Requires a well-formed module. Guarantees a well-formed module computing the same values, with no
var-to-var binding left except an escaping var bound to a dataflow var it could not take over.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilework.ir.graph import (
    AnyBinding,
    Binding,
    BindingBlock,
    DataflowBlock,
    DataflowVar,
    Expr,
    GraphFunc,
    If,
    MatchCast,
    SeqExpr,
    Tuple,
    TupleGetItem,
    Var,
)
from tilework.ir.info import Check, base_check
from tilework.ir.module import IRModule
from tilework.transform.base import Pass
from tilework.pattern.core import Match, is_item, is_tuple, wildcard
from tilework.transform.rewrite_driver import Rule, apply_rules, substitute


def _noop_cast(value: Expr, m: Match) -> Expr | None:
    info = m.ctx.cast_info
    if info is None or base_check(info, value.info) is not Check.PASS:
        return None
    return value


def _tuple_item(value: Expr, m: Match) -> Expr | None:
    assert isinstance(value, TupleGetItem)
    t = m.resolved("t")
    assert isinstance(t, Tuple)
    if not 0 <= value.index < len(t.fields):
        return None
    return t.fields[value.index]


NOOP_MATCH_CAST = Rule("noop_match_cast", wildcard(), _noop_cast, on="match_cast")
TUPLE_ITEM_OF_TUPLE = Rule("tuple_item_of_tuple", is_item(is_tuple(name="t", any_fields=True)), _tuple_item)
CANONICALIZE_RULES: tuple[Rule, ...] = (NOOP_MATCH_CAST, TUPLE_ITEM_OF_TUPLE)


# -- escaping aliases ---------------------------------------------------------------------


def _hoist_block(block: DataflowBlock) -> DataflowBlock:
    """``lv = v; ...; gv = lv`` -> ``gv = v; ...`` with ``lv`` read as ``gv`` (first such ``gv``
    per ``lv``); ``lv`` must be bound in this block."""
    local = {b.var for b in block.bindings if isinstance(b.var, DataflowVar)}
    takeover: dict[Var, Var] = {}
    dropped: set[int] = set()
    for i, b in enumerate(block.bindings):
        value = b.value
        if not isinstance(b, Binding) or isinstance(b.var, DataflowVar):
            continue
        if isinstance(value, DataflowVar) and value in local and value not in takeover:
            takeover[value] = b.var
            dropped.add(i)
    if not takeover:
        return block
    out: list[AnyBinding] = []
    for i, b in enumerate(block.bindings):
        if i in dropped:
            continue
        var = takeover.get(b.var, b.var)
        value = substitute(b.value, dict(takeover))
        out.append(MatchCast(var, value, b.cast_info) if isinstance(b, MatchCast) else Binding(var, value))
    return DataflowBlock(tuple(out))


def _hoist_seq(seq: SeqExpr) -> SeqExpr:
    blocks: list[BindingBlock] = []
    for block in seq.blocks:
        if isinstance(block, DataflowBlock):
            blocks.append(_hoist_block(block))
            continue
        bindings = [
            Binding(b.var, If(b.value.cond, _hoist_seq(b.value.then_branch), _hoist_seq(b.value.else_branch), b.value.info))
            if isinstance(b, Binding) and isinstance(b.value, If)
            else b
            for b in block.bindings
        ]
        blocks.append(BindingBlock(tuple(bindings)))
    return SeqExpr(tuple(blocks), seq.body, seq.info)


def hoist_escaping_aliases(f: GraphFunc) -> GraphFunc:
    return f.replace(body=_hoist_seq(f.body))


@dataclass(frozen=True)
class CanonicalizeBindings(Pass):
    name: str = "canonicalize_bindings"

    def run(self, mod: IRModule) -> IRModule:
        hoisted = mod
        for name, f in mod.graph_funcs():
            hoisted = hoisted.with_func(name, hoist_escaping_aliases(f))
        return apply_rules(hoisted, CANONICALIZE_RULES, inline_aliases=True)


__all__ = ["CanonicalizeBindings", "CANONICALIZE_RULES", "NOOP_MATCH_CAST", "TUPLE_ITEM_OF_TUPLE", "hoist_escaping_aliases"]
