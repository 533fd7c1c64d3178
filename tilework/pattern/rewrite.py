"""Rewriting matched subgraphs of dataflow blocks.

Two layers:

- ``rewrite_blocks(mod, plan)`` is the engine. For each dataflow block, ``plan(graph)`` returns
  ``Replacement``s: a set of bindings replaced by one value that provides their ``outputs``
  (every replaced var that is read outside the set or escapes the block). The block is
  re-emitted through a ``BlockBuilder`` (struct info re-inferred, A-normal form kept) in a
  topological order of the graph in which each replacement is one node: a binding keeps its
  place unless it reads a replacement's output that now comes later. A plan whose replacements
  would form a cycle (a path that leaves a replaced set and re-enters it) is an error; keep
  them convex. One output binds the var directly; several are fields of a tuple.
- ``rewrite_subgraphs(mod, rules)`` is the rewriter driven by data: a list of
  ``(pattern, rewrite)`` pairs. Rules are tried in order over the whole block (so earlier rules
  win); each match rooted at a binding whose bindings are not taken yet is offered to
  ``rewrite(match)``, which returns the new value of the root (built from the match's
  captures) or None to decline. The root is replaced; the other matched bindings go when
  nothing else reads them. Single-binding rewrites can equally use the streaming driver
  (``tilework.transform.rewrite_driver.apply_rules``) with these patterns.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from tilework.errors import WellFormedError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Expr, GraphFunc, TupleGetItem, Var, used_vars
from tilework.ir.module import IRModule
from tilework.ir.rewrite import FuncRewriter

from tilework.pattern.core import Pattern
from tilework.pattern.graph import BlockGraph, PatternMatch, graphs_of, match_at

Remap = Callable[[Expr], Expr]


@dataclass(frozen=True)
class Replacement:
    """Bindings ``indices`` of a block replaced by ``build(remap, bb)``: the value providing
    ``outputs`` (the single output's value, or a tuple of them in order). ``build`` must pass
    every old var it reads through ``remap``; it may emit bindings of its own with ``bb``
    first (run-time checks, say)."""

    indices: tuple[int, ...]
    outputs: tuple[Var, ...]
    build: Callable[[Remap, BlockBuilder], Expr] = field(compare=False)
    name: str = ""


Plan = Callable[[BlockGraph], Sequence[Replacement]]


class _BlockRewriter(FuncRewriter):
    def __init__(self, mod: IRModule, plan: Plan) -> None:
        super().__init__(mod)
        self.plan = plan

    def rewrite_func(self, name: str, func: GraphFunc) -> GraphFunc:
        self.var_map = {}
        self.func_name = name
        graphs = {g.block_index: g for g in graphs_of(name, func)}
        with self.bb.function(name, func.params, func.attrs, pure=func.pure):
            for k, block in enumerate(func.body.blocks):
                g = graphs.get(k)
                reps = list(self.plan(g)) if g is not None else []
                if g is not None and reps:
                    with self.bb.dataflow():
                        self.emit_block(g, reps)
                elif block.is_dataflow:
                    with self.bb.dataflow():
                        for b in block.bindings:
                            self.visit_binding(b, in_dataflow=True)
                else:
                    for b in block.bindings:
                        self.visit_binding(b, in_dataflow=False)
            self.bb.emit_func_output(self.remap(func.body.body), ret_info=func.ret_info)
        result = self.bb.get()[name]
        assert isinstance(result, GraphFunc)
        return result

    def emit_block(self, g: BlockGraph, reps: list[Replacement]) -> None:
        owner: dict[int, int] = {}
        for r, rep in enumerate(reps):
            _check_replacement(g, rep)
            for i in rep.indices:
                if i in owner:
                    raise WellFormedError(f"@{g.func_name}: binding %{g.bindings[i].var.name} is in two replacements")
                owner[i] = r
        # nodes: ("b", i) for a kept binding, ("r", r) for a replacement
        node_of = {i: (("r", owner[i]) if i in owner else ("b", i)) for i in range(len(g))}
        nodes = list(dict.fromkeys(node_of.values()))
        key = {n: (max(reps[n[1]].indices) if n[0] == "r" else n[1]) for n in nodes}
        deps: dict[tuple[str, int], set[tuple[str, int]]] = {n: set() for n in nodes}
        for i in range(len(g)):
            for j in g.pred[i]:
                if node_of[j] != node_of[i]:
                    deps[node_of[i]].add(node_of[j])
        readers: dict[tuple[str, int], list[tuple[str, int]]] = {n: [] for n in nodes}
        for n, ds in deps.items():
            for d in ds:
                readers[d].append(n)
        waiting = {n: len(ds) for n, ds in deps.items()}
        ready = [(key[n], n) for n in nodes if waiting[n] == 0]
        heapq.heapify(ready)
        done = 0
        while ready:
            _, n = heapq.heappop(ready)
            done += 1
            if n[0] == "b":
                self.visit_binding(g.bindings[n[1]], in_dataflow=True)
            else:
                self.emit_replacement(reps[n[1]])
            for reader in readers[n]:
                waiting[reader] -= 1
                if waiting[reader] == 0:
                    heapq.heappush(ready, (key[reader], reader))
        if done != len(nodes):
            names = ", ".join(rep.name or f"#{r}" for r, rep in enumerate(reps))
            raise WellFormedError(f"@{g.func_name}: the replacements ({names}) form a cycle: a path leaves a replaced set and re-enters it")

    def emit_replacement(self, rep: Replacement) -> None:
        value = rep.build(self.remap, self.bb)
        if len(rep.outputs) == 1:
            self.emit_like(rep.outputs[0], value, in_dataflow=True)
            return
        t = self.bb.emit(value, name=f"{rep.outputs[0].name}_all")
        for i, v in enumerate(rep.outputs):
            self.emit_like(v, TupleGetItem(t, i), in_dataflow=True)


def _check_replacement(g: BlockGraph, rep: Replacement) -> None:
    if not rep.indices:
        raise WellFormedError(f"@{g.func_name}: an empty replacement {rep.name!r}")
    _, needed = g.region_io(rep.indices)
    missing = [v.name for v in needed if v not in rep.outputs]
    if missing:
        raise WellFormedError(f"@{g.func_name}: replacement {rep.name!r} removes %{', %'.join(missing)}, which is read outside it; list it among the outputs")


def rewrite_blocks(mod: IRModule, plan: Plan, funcs: Iterable[str] | None = None) -> IRModule:
    """``mod`` with each dataflow block's ``plan`` applied (see the module docstring); other
    functions and blocks without replacements are re-emitted unchanged."""
    names = set(funcs) if funcs is not None else None
    rw = _BlockRewriter(mod, plan)
    for name, f in list(mod.graph_funcs()):
        if names is None or name in names:
            rw.bb.add_func(name, rw.rewrite_func(name, f))
    return rw.finish()


# -- the rule-driven rewriter -----------------------------------------------------------------

SubgraphRewrite = Callable[[PatternMatch], "Expr | None"]


def _removable(g: BlockGraph, m: PatternMatch, result: Expr) -> tuple[int, ...]:
    """The matched bindings that can go once the root computes ``result``: not escaping, not
    read by ``result``, and read only by the root or by other removable ones."""
    reads = set(used_vars(result))
    gone = {m.root}
    for j in sorted(set(m.indices) - {m.root}, reverse=True):
        v = g.bindings[j].var
        if g.escapes(v) or v in reads:
            continue
        if all(g.index[u] in gone for u in g.users(v)):
            gone.add(j)
    return tuple(sorted(gone))


def _returning(result: Expr) -> Callable[[Remap, BlockBuilder], Expr]:
    def build(remap: Remap, bb: BlockBuilder) -> Expr:
        return remap(result)

    return build


def _plan_rules(rules: Sequence[tuple[Pattern, SubgraphRewrite]], changed: list[bool]) -> Plan:
    def plan(g: BlockGraph) -> list[Replacement]:
        taken: set[int] = set()
        reps: list[Replacement] = []
        for pattern, rewrite in rules:
            for i in range(len(g)):
                if i in taken:
                    continue
                m = match_at(pattern, g, i)
                if m is None or taken.intersection(m.indices):
                    continue
                result = rewrite(m)
                if result is None:
                    continue
                gone = _removable(g, m, result)
                taken.update(m.indices)
                reps.append(Replacement(gone, (g.bindings[m.root].var,), _returning(result), g.bindings[m.root].var.name))
        if reps:
            changed[0] = True
        return reps

    return plan


def rewrite_subgraphs(mod: IRModule, rules: Sequence[tuple[Pattern, SubgraphRewrite]], *, max_rounds: int = 1) -> IRModule:
    """``mod`` with ``rules`` applied to every dataflow block of its graph functions (see the
    module docstring); with ``max_rounds > 1`` the rules run again over the result while they
    still change something, at most that many times."""
    for _ in range(max_rounds):
        changed = [False]
        out = rewrite_blocks(mod, _plan_rules(rules, changed))
        if not changed[0]:
            return mod
        mod = out
    return mod


__all__ = ["Replacement", "Plan", "Remap", "SubgraphRewrite", "rewrite_blocks", "rewrite_subgraphs"]
