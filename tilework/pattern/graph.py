"""The block matcher: patterns matched over the bindings of a dataflow block.

A ``BlockGraph`` sees a dataflow block as a graph: one node per binding, an edge from the
binding of a var to each binding that reads it. Within the block a var stands for its bound
value (patterns look through it, and its binding joins the match); a parameter, a var of
another block or a ``match_cast`` var is a leaf. The graph also knows every use, so the use
constraints of ``tilework.pattern.core`` can be decided.

``match_at(pattern, graph, i)`` matches ``pattern`` against the var of binding ``i``; the
result, a ``PatternMatch``, lists the matched bindings (the root and every binding looked
through), its *inputs* (the vars and constants the matched bindings read from outside the
match) and its *outputs* (the matched vars that are read outside the match or escape the
block; the root always is one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from tilework.ir.graph import (
    Binding,
    BindingBlock,
    Call,
    Constant,
    DataflowVar,
    Expr,
    GraphFunc,
    If,
    MatchCast,
    Tuple,
    TupleGetItem,
    Var,
    seq_used_vars,
    used_vars,
)
from tilework.ir.info import StructInfo, TupleInfo
from tilework.ir.module import IRModule
from tilework.pattern.core import Match, Pattern


def leaves(e: Expr) -> Iterator[Expr]:
    """The vars and constants an A-normal-form value reads, in argument order."""
    if isinstance(e, (Var, Constant)):
        yield e
    elif isinstance(e, Call):
        for a in e.args:
            yield from leaves(a)
    elif isinstance(e, Tuple):
        for f in e.fields:
            yield from leaves(f)
    elif isinstance(e, TupleGetItem):
        yield from leaves(e.tuple_value)


class BlockGraph:
    """A dataflow block as a graph (see the module docstring). ``later`` holds the vars that
    are read after the block; in a dataflow block they can only be its non-dataflow vars,
    which count as escaping whether or not they are read."""

    def __init__(self, block: BindingBlock, func_name: str = "", block_index: int = 0, later: frozenset[Var] = frozenset()) -> None:
        self.block = block
        self.func_name = func_name
        self.block_index = block_index
        self.bindings = block.bindings
        self.index: dict[Var, int] = {b.var: i for i, b in enumerate(self.bindings)}
        self.later = later
        n = len(self.bindings)
        self.succ: list[list[int]] = [[] for _ in range(n)]
        self.pred: list[list[int]] = [[] for _ in range(n)]
        self._users: dict[Var, list[Var]] = {}
        for i, b in enumerate(self.bindings):
            for v in dict.fromkeys(x for x in leaves(b.value) if isinstance(x, Var)):
                j = self.index.get(v)
                if j is None or j >= i:
                    continue
                self.succ[j].append(i)
                self.pred[i].append(j)
                self._users.setdefault(v, []).append(b.var)

    def __len__(self) -> int:
        return len(self.bindings)

    # -- the matcher context protocol -------------------------------------------------------

    def bound_value(self, v: Var) -> Expr | None:
        """The value bound to ``v`` by a plain binding of this block, or None (a leaf)."""
        i = self.index.get(v)
        if i is None:
            return None
        b = self.bindings[i]
        return b.value if isinstance(b, Binding) else None

    def resolve(self, e: Expr) -> Expr:
        while isinstance(e, Var):
            value = self.bound_value(e)
            if value is None:
                return e
            e = value
        return e

    def users(self, v: Var) -> list[Var]:
        """The vars of the bindings of this block that read ``v``, in program order."""
        return self._users.get(v, [])

    def escapes(self, v: Expr) -> bool:
        """Whether ``v`` is visible after the block (a non-dataflow var of a dataflow block,
        or a var read later)."""
        if not isinstance(v, Var) or v not in self.index:
            return False
        if self.block.is_dataflow:
            return not isinstance(v, DataflowVar)
        return v in self.later

    # -- regions ----------------------------------------------------------------------------

    def region_io(self, indices: Sequence[int]) -> tuple[tuple[Expr, ...], tuple[Var, ...]]:
        """The inputs and outputs of the bindings ``indices`` taken as one region."""
        inside = set(indices)
        inputs: dict[int, Expr] = {}
        for i in sorted(inside):
            for x in leaves(self.bindings[i].value):
                j = self.index.get(x) if isinstance(x, Var) else None
                if j is None or j not in inside:
                    inputs.setdefault(id(x), x)
        outputs = []
        for i in sorted(inside):
            v = self.bindings[i].var
            if self.escapes(v) or any(self.index[u] not in inside for u in self.users(v)):
                outputs.append(v)
        return tuple(inputs.values()), tuple(outputs)


def graphs_of(name: str, func: GraphFunc) -> list[BlockGraph]:
    """A ``BlockGraph`` for each top-level dataflow block of ``func``."""
    blocks = func.body.blocks
    later: set[Var] = set(used_vars(func.body.body))
    after: list[frozenset[Var]] = [frozenset()] * len(blocks)
    for k in range(len(blocks) - 1, -1, -1):
        after[k] = frozenset(later)
        for b in blocks[k].bindings:
            later.update(used_vars(b.value))
            if isinstance(b.value, If):
                later.update(seq_used_vars(b.value.then_branch))
                later.update(seq_used_vars(b.value.else_branch))
    return [BlockGraph(block, name, k, after[k]) for k, block in enumerate(blocks) if block.is_dataflow]


@dataclass(frozen=True)
class PatternMatch:
    """A match of a pattern in a block: the bindings it covers (``indices``, program order,
    the root last), what it reads from outside and what it provides to the outside."""

    graph: BlockGraph
    root: int
    indices: tuple[int, ...]
    captures: Mapping[str, Expr] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Expr:
        return self.captures[name]

    def get(self, name: str) -> Expr | None:
        return self.captures.get(name)

    def info(self, name: str) -> StructInfo:
        """The struct info of the capture ``name``."""
        return self.captures[name].info

    @property
    def bindings(self) -> tuple[Binding | MatchCast, ...]:
        return tuple(self.graph.bindings[i] for i in self.indices)

    @property
    def calls(self) -> tuple[Call, ...]:
        """The matched calls in program order (their struct info, args and attrs)."""
        return tuple(b.value for b in self.bindings if isinstance(b.value, Call))

    @property
    def root_binding(self) -> Binding | MatchCast:
        return self.graph.bindings[self.root]

    @property
    def root_call(self) -> Call | None:
        value = self.root_binding.value
        return value if isinstance(value, Call) else None

    @property
    def inputs(self) -> tuple[Expr, ...]:
        return self.graph.region_io(self.indices)[0]

    @property
    def outputs(self) -> tuple[Var, ...]:
        return self.graph.region_io(self.indices)[1]

    def is_closed(self) -> bool:
        """Only the root is read outside the match: the match can become one call that
        produces the root's value."""
        return self.outputs == (self.root_binding.var,)


def match_at(pattern: Pattern, graph: BlockGraph, i: int) -> PatternMatch | None:
    """``pattern`` matched against the var of binding ``i`` (a plain binding), or None."""
    b = graph.bindings[i]
    if not isinstance(b, Binding):
        return None
    m = Match(graph)
    if not pattern.match(b.var, m):
        return None
    indices = {graph.index[v] for v in m.bound}
    indices.add(i)
    return PatternMatch(graph, i, tuple(sorted(indices)), dict(m.captures))


def find_matches(pattern: Pattern, mod: IRModule | GraphFunc, func_name: str = "main") -> list[PatternMatch]:
    """Every match of ``pattern`` rooted at a binding of a dataflow block, in program order
    (matches may overlap). ``mod`` is a module (every graph function) or one function."""
    funcs = list(mod.graph_funcs()) if isinstance(mod, IRModule) else [(func_name, mod)]
    out: list[PatternMatch] = []
    for name, f in funcs:
        for g in graphs_of(name, f):
            for i in range(len(g)):
                m = match_at(pattern, g, i)
                if m is not None:
                    out.append(m)
    return out


def out_info(outputs: Sequence[Var]) -> StructInfo:
    """The struct info of a value providing ``outputs``: the single output's, or a tuple's."""
    if len(outputs) == 1:
        return outputs[0].info
    return TupleInfo(tuple(v.info for v in outputs))


__all__ = ["BlockGraph", "PatternMatch", "graphs_of", "match_at", "find_matches", "leaves", "out_info"]
