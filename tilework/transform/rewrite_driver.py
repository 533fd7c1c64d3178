"""The rewrite driver: local rewrites written as data and run by one walker.

A ``Rule`` pairs a ``Pattern`` with a rewrite function. ``apply_rules(mod, rules)`` walks every
graph function in program order and re-emits each binding through a ``BlockBuilder`` (struct
info is re-inferred, A-normal form kept). A binding's value, with its vars remapped to their
new versions, is offered to the rules in order; the first rule whose pattern matches and whose
rewrite returns an expression replaces the value, and the new value is offered again, up to
``max_steps`` times. Rules marked ``on="match_cast"`` see the value of a ``match_cast`` (the cast
is in ``ctx.cast_info``); their result replaces the whole cast with a plain binding.

A value that is (or ends as) a plain var is an *alias*; rules are not offered aliases. With ``inline_aliases`` the binding is dropped
and later uses read that var directly, except where that would let a dataflow var escape its
block (an escaping var bound to a dataflow var keeps its binding).

Patterns are the pattern language's (``tilework.pattern``); they look through bindings:
``is_const()`` matches a constant or a var bound to one, ``is_tuple`` a tuple literal or a var
bound to one, ``is_op``/``op_call`` a call or a var bound to one. Captures hold what was
written at the matched place (often a var); ``Match.resolved`` gives the value behind it. A rewrite may read only vars visible at the binding: a result that reads
a var out of scope (a dataflow var of an earlier block, a var of a closed If branch) is
rejected, as if the rule had not matched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from tilework.ir.builder import BlockBuilder, is_leaf
from tilework.ir.graph import (
    used_vars,
    Binding,
    Call,
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
from tilework.ir.info import StructInfo
from tilework.ir.module import Function, IRModule
from tilework.ir.visitor import substitute
from tilework.pattern.core import Match, Pattern

# -- matching -----------------------------------------------------------------------------


class RewriteCtx:
    """What a rule sees besides the matched value: where it is and what is bound before it."""

    def __init__(self, mod: IRModule, bb: BlockBuilder) -> None:
        self.mod = mod  # the module being rewritten (the input; its TensorFuncs are kept)
        self.bb = bb
        self.func_name = ""
        self.var: Var | None = None  # the var of the binding being rewritten (as written)
        self.in_dataflow = False
        self.cast_info: StructInfo | None = None  # for match_cast rules
        self.memo: dict[Any, Any] = {}  # scratch for rules, fresh for every binding block
        self.values: dict[Var, Expr] = {}  # new var -> the value it is bound to
        self.scope: set[Var] = set()  # vars visible at the current binding
        self._deferred: list[Callable[[Expr], None]] = []

    def func(self, name: str) -> Function | None:
        return self.mod.get(name)

    def bound_value(self, v: Var) -> Expr | None:
        """The value ``v`` (a new var) is bound to, or None (a param, a match_cast var)."""
        return self.values.get(v)

    def resolve(self, e: Expr) -> Expr:
        """``e`` with var-to-value bindings followed (a var bound to a var bound to a constant
        gives the constant); a param or a match_cast var gives itself."""
        seen = 0
        while isinstance(e, Var) and e in self.values and seen < 64:
            e = self.values[e]
            seen += 1
        return e

    def visible(self, e: Expr) -> bool:
        return all(v in self.scope for v in used_vars(e))

    def defer(self, fn: Callable[[Expr], None]) -> None:
        """Call ``fn`` with what the current binding's var finally stands for (its new var, or
        the var it was inlined to) once the binding is emitted."""
        self._deferred.append(fn)


Rewrite = Callable[[Expr, Match], "Expr | None"]


@dataclass(frozen=True)
class Rule:
    """``pattern`` -> ``rewrite(value, match)``; the rewrite returns the new value, or None to
    leave the value as it is. ``on`` is ``"binding"`` (values of plain bindings) or
    ``"match_cast"`` (the value of a match_cast; the result replaces the cast)."""

    name: str
    pattern: Pattern
    rewrite: Rewrite = field(compare=False)
    on: str = "binding"


# -- the walker ---------------------------------------------------------------------------


class _Driver:
    def __init__(self, mod: IRModule, rules: Sequence[Rule], inline_aliases: bool, max_steps: int) -> None:
        self.mod = mod
        self.bb = BlockBuilder(mod)
        self.value_rules = [r for r in rules if r.on == "binding"]
        self.cast_rules = [r for r in rules if r.on == "match_cast"]
        for r in rules:
            if r.on not in ("binding", "match_cast"):
                raise ValueError(f"rule {r.name}: 'on' must be 'binding' or 'match_cast', got {r.on!r}")
        self.inline_aliases = inline_aliases
        self.max_steps = max_steps
        self.ctx = RewriteCtx(mod, self.bb)
        self.var_map: dict[Var, Expr] = {}

    def run(self, funcs: Iterable[str] | None) -> IRModule:
        names = set(funcs) if funcs is not None else None
        for name, f in list(self.mod.graph_funcs()):
            if names is None or name in names:
                self.func(name, f)
        return self.bb.get()

    def func(self, name: str, f: GraphFunc) -> None:
        self.var_map = {}
        ctx = self.ctx
        ctx.func_name, ctx.values, ctx.scope = name, {}, set(f.params)
        with self.bb.function(name, f.params, f.attrs, pure=f.pure):
            for block in f.body.blocks:
                ctx.memo = {}
                if block.is_dataflow:
                    with self.bb.dataflow():
                        for b in block.bindings:
                            self.binding(b, True)
                    ctx.scope = {v for v in ctx.scope if not isinstance(v, DataflowVar)}
                else:
                    for b in block.bindings:
                        self.binding(b, False)
            self.bb.emit_func_output(self.remap(f.body.body), ret_info=f.ret_info)

    def remap(self, e: Expr) -> Expr:
        return substitute(e, self.var_map)

    def binding(self, b: Binding | MatchCast, in_dataflow: bool) -> None:
        ctx = self.ctx
        ctx.var, ctx.in_dataflow, ctx.cast_info, ctx._deferred = b.var, in_dataflow, None, []
        if isinstance(b, Binding) and isinstance(b.value, If):
            self.if_binding(b, b.value)
            return
        value = self.normalize_result(self.remap(b.value))
        if isinstance(b, MatchCast):
            ctx.cast_info = b.cast_info
            cast = self.offer(value, self.cast_rules, keep_same=True)
            ctx.cast_info = None
            if cast is None:
                escapes = in_dataflow and not isinstance(b.var, DataflowVar)
                new = self.bb.match_cast(value, b.cast_info, name=b.var.name, output=escapes)
                self.bound(b.var, new)
                return
            value = cast
        value = self.rewrite(value)
        if isinstance(value, Var) and self.inline_aliases and self.may_inline(b.var, value, in_dataflow):
            self.bound(b.var, value)
            return
        if in_dataflow and not isinstance(b.var, DataflowVar):
            new = self.bb.emit_output(value, name=b.var.name)
        else:
            new = self.bb.emit(value, name=b.var.name)
        ctx.values[new] = value
        self.bound(b.var, new)

    def bound(self, old: Var, new: Expr) -> None:
        self.var_map[old] = new
        if isinstance(new, Var):
            self.ctx.scope.add(new)
        deferred, self.ctx._deferred = self.ctx._deferred, []
        for fn in deferred:
            fn(new)

    @staticmethod
    def may_inline(old: Var, target: Var, in_dataflow: bool) -> bool:
        """An escaping var cannot stand for a dataflow var after the block."""
        return not (in_dataflow and not isinstance(old, DataflowVar) and isinstance(target, DataflowVar))

    def rewrite(self, value: Expr) -> Expr:
        for _ in range(self.max_steps):
            if isinstance(value, Var):
                return value  # an alias: nothing to rewrite
            new = self.offer(value, self.value_rules)
            if new is None:
                return value
            value = new
        return value

    def offer(self, value: Expr, rules: Sequence[Rule], keep_same: bool = False) -> Expr | None:
        """The normalized result of the first rule that rewrites ``value``, or None. A value
        rule returning ``value`` itself changes nothing; a match_cast rule returning the cast's
        value (``keep_same``) removes the cast."""
        for rule in rules:
            m = Match(self.ctx)
            if not rule.pattern.match(value, m):
                continue
            new = rule.rewrite(value, m)
            if new is None or (new is value and not keep_same) or not self.ctx.visible(new):
                continue
            return self.normalize_result(new)
        return None

    def normalize_result(self, e: Expr) -> Expr:
        """A rule's result with its nested calls bound first, each offered to the rules as a
        binding of its own (so results compose), then normalized."""
        if isinstance(e, Call):
            e = Call(self.leafify(e.callee), tuple(self.leafify(a) for a in e.args), e.attrs, e.sinfo_args)
        elif isinstance(e, Tuple):
            e = Tuple(tuple(self.leafify(f) for f in e.fields))
        elif isinstance(e, TupleGetItem):
            e = TupleGetItem(self.leafify(e.tuple_value), e.index)
        return self.bb.normalize(e)

    def leafify(self, e: Expr) -> Expr:
        if isinstance(e, Tuple):
            return Tuple(tuple(self.leafify(f) for f in e.fields))
        if is_leaf(e):
            return e
        ctx = self.ctx
        saved = (ctx.var, ctx.cast_info, ctx._deferred)
        ctx.var, ctx.cast_info, ctx._deferred = None, None, []
        value = self.rewrite(self.normalize_result(e))
        new = value if isinstance(value, Var) else self.bb.emit(value)
        if new is not value:
            ctx.values[new] = value
            ctx.scope.add(new)
        for fn in ctx._deferred:
            fn(new)
        ctx.var, ctx.cast_info, ctx._deferred = saved
        return new

    def if_binding(self, b: Binding, e: If) -> None:
        new = self.bb.emit_if(
            self.remap(e.cond),
            lambda: self.branch(e.then_branch),
            lambda: self.branch(e.else_branch),
            name=b.var.name,
        )
        self.bound(b.var, new)

    def branch(self, seq: SeqExpr) -> Expr:
        ctx = self.ctx
        scope, memo = set(ctx.scope), ctx.memo
        ctx.memo = {}
        for block in seq.blocks:
            for b in block.bindings:
                self.binding(b, False)
        out = self.remap(seq.body)
        ctx.scope, ctx.memo = scope, memo
        return out


def apply_rules(
    mod: IRModule,
    rules: Sequence[Rule],
    *,
    inline_aliases: bool = True,
    max_steps: int = 32,
    funcs: Iterable[str] | None = None,
) -> IRModule:
    """``mod`` with ``rules`` applied to every binding of its graph functions (or of ``funcs``);
    see the module docstring. Other functions are kept as they are."""
    return _Driver(mod, rules, inline_aliases, max_steps).run(funcs)


__all__ = [
    "RewriteCtx",
    "Rule",
    "Rewrite",
    "apply_rules",
    "substitute",
]
