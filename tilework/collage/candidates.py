"""Candidates: the regions of a dataflow block that each backend could run.

A block is a graph with one node per binding (``tilework.pattern.graph.BlockGraph``); program
order is a topological order. A *candidate* is a set of nodes with a backend (and, for a
library backend, the capability that matched). Candidates come from the backends' own
declarations, nothing else:

- **library** backends (``blas``, ``torch``, ``quant``): each capability's pattern matched at
  each root, its predicate accepted, the match *closed* (only the root is read outside it: a
  library call produces one value);
- **region** backends (``onnxruntime``): the ops some capability claims, grouped as
  program-order *intervals* of up to ``max_size`` claimed bindings, plus the maximal regions
  that partitioning by rules makes of them (``tilework.backend.partition``);
- **codegen** (tilework's kernels, which fuse what they are given): every binding alone, the
  covering fallback that makes an exact cover always exist, and intervals of up to
  ``max_size`` bindings (so fusion inside a region is measured, not guessed).

Validity: a candidate is *convex* (no path leaves it and comes back: it can run as one call),
has *no taps* (no value it provides outside is also read inside it) and at most ``max_size``
bindings (a rule region: the backend's ``max_region_size``). Program-order intervals are convex
by construction; matches are checked with downstream-closure bitsets.

*Pins* restrict nodes to one backend: a key is an op name (``"matmul"``) or a var name
(``"%lv3"``); a candidate that covers a pinned node with another backend is dropped, and a
pinned node no candidate of its backend covers is an error that names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from tilework.backend.base import Backend, Capability
from tilework.backend.partition import partition_block
from tilework.errors import UnsupportedError
from tilework.ir.graph import Binding, Call, OpRef
from tilework.pattern.graph import BlockGraph, PatternMatch, match_at

FALLBACK = "codegen"

Add = Callable[["Backend | str", "str | None", Sequence[int], str, int], None]


@dataclass(frozen=True)
class Candidate:
    """``nodes`` (binding indices of one block, ascending) run by ``backend``. ``origin``:
    ``match``, ``interval``, ``rules`` or ``fallback`` (a codegen singleton)."""

    backend: str
    capability: str | None
    nodes: tuple[int, ...]
    origin: str

    @property
    def mask(self) -> int:
        m = 0
        for i in self.nodes:
            m |= 1 << i
        return m

    @property
    def first(self) -> int:
        return self.nodes[0]


class BlockShape:
    """The facts about a block that validity needs: successors as bitsets, each node's
    downstream closure, which nodes escape the block, and which are op calls."""

    def __init__(self, g: BlockGraph) -> None:
        n = len(g)
        self.n = n
        self.succ_mask = [0] * n
        self.pred_mask = [0] * n
        for i in range(n):
            for s in g.succ[i]:
                self.succ_mask[i] |= 1 << s
            for p in g.pred[i]:
                self.pred_mask[i] |= 1 << p
        self.down = [0] * n
        for i in range(n - 1, -1, -1):
            d = 0
            for s in g.succ[i]:
                d |= (1 << s) | self.down[s]
            self.down[i] = d
        self.escapes = [g.escapes(b.var) for b in g.bindings]
        self.is_op = [is_op_binding(b) for b in g.bindings]

    def convex(self, mask: int) -> bool:
        """No path leaves ``mask`` and re-enters it."""
        reach = 0
        for i in _bits(mask):
            reach |= self.down[i]
        outside = reach & ~mask
        return not any(self.down[x] & mask for x in _bits(outside))

    def has_tap(self, mask: int) -> bool:
        """A node of ``mask`` read both outside (or escaping) and inside."""
        for i in _bits(mask):
            s = self.succ_mask[i]
            if (s & mask) and ((s & ~mask) or self.escapes[i]):
                return True
        return False

    def valid(self, mask: int, size_limit: int) -> bool:
        return bin(mask).count("1") <= size_limit and self.convex(mask) and not self.has_tap(mask)


def is_op_binding(b: object) -> bool:
    return isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def pinned_backend(g: BlockGraph, i: int, pins: Mapping[str, str]) -> str | None:
    """The backend node ``i`` is pinned to (by its var name ``%name``, then by its op)."""
    if not pins:
        return None
    b = g.bindings[i]
    by_var = pins.get(f"%{b.var.name}")
    if by_var is not None:
        return by_var
    if is_op_binding(b):
        assert isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)
        return pins.get(b.value.callee.name)
    return None


def _accepts(cap: Capability, m: PatternMatch) -> bool:
    try:
        return bool(cap.accepts(m))
    except Exception:  # noqa: BLE001 - a predicate that raises refuses the match
        return False


def block_candidates(g: BlockGraph, backends: Sequence[Backend], *, max_size: int = 6, pins: Mapping[str, str] | None = None) -> list[Candidate]:
    """Every valid candidate of block ``g`` for ``backends`` (see the module docstring), without
    duplicates; the codegen singletons come first."""
    shape = BlockShape(g)
    pins = dict(pins or {})
    names = {b.name for b in backends} | {FALLBACK}
    for key, pinned in pins.items():
        if pinned not in names:
            raise UnsupportedError(f"pin {key}={pinned}: backend {pinned!r} is not among the backends placed over ({', '.join(sorted(names))})")
    out: dict[tuple[str, str | None, tuple[int, ...]], Candidate] = {}

    def add(who: Backend | str, cap: str | None, nodes: Sequence[int], origin: str, limit: int) -> None:
        name = who if isinstance(who, str) else who.name
        nodes = tuple(sorted(nodes))
        mask = 0
        for i in nodes:
            mask |= 1 << i
        if len(nodes) > 1 and not shape.valid(mask, limit):
            return
        if any((p := pinned_backend(g, i, pins)) is not None and p != name for i in nodes):
            return
        out.setdefault((name, cap, nodes), Candidate(name, cap, nodes, origin))

    for i in range(len(g)):
        add(FALLBACK, None, (i,), "fallback", 1)
    for backend in backends:
        if backend.name == FALLBACK or backend.lower is None:
            continue
        if backend.kind == "library":
            _library(g, backend, add, max_size)
        else:
            _region(g, backend, add, max_size)
    _intervals(len(g), lambda i: True, FALLBACK, add, max_size)
    cands = list(out.values())
    _check_pins(g, cands, pins)
    return cands


def _library(g: BlockGraph, backend: Backend, add: Add, max_size: int) -> None:
    for cap in backend.capabilities:
        for i in range(len(g)):
            m = match_at(cap.pattern, g, i)
            if m is None or not m.is_closed() or not _accepts(cap, m):
                continue
            add(backend, cap.name, m.indices, "match", max(max_size, len(m.indices)))


def _region(g: BlockGraph, backend: Backend, add: Add, max_size: int) -> None:
    claimable = [False] * len(g)
    for cap in backend.capabilities:
        for i in range(len(g)):
            if claimable[i]:
                continue
            m = match_at(cap.pattern, g, i)
            if m is not None and len(m.indices) == 1 and _accepts(cap, m):
                claimable[i] = True
    _intervals(len(g), lambda i: claimable[i], backend.name, add, min(max_size, backend.max_region_size))
    for spec in partition_block(g, [backend]):
        idx = [g.index[b.var] for b in g.bindings if b.var.name in set(spec.vars)]
        if len(idx) > 1:
            add(backend, None, idx, "rules", backend.max_region_size)


def _intervals(n: int, ok: Callable[[int], bool], backend: str, add: Add, max_size: int) -> None:
    """Program-order intervals of 2..``max_size`` nodes that ``ok`` accepts (convex by
    construction)."""
    for i in range(n):
        if not ok(i):
            continue
        for j in range(i + 1, min(n, i + max_size)):
            if not ok(j):
                break
            add(backend, None, range(i, j + 1), "interval", max_size)


def _check_pins(g: BlockGraph, cands: Sequence[Candidate], pins: Mapping[str, str]) -> None:
    if not pins:
        return
    covered: set[tuple[int, str]] = {(i, c.backend) for c in cands for i in c.nodes}
    for i in range(len(g)):
        p = pinned_backend(g, i, pins)
        if p is not None and (i, p) not in covered:
            b = g.bindings[i]
            v = b.value
            what = v.callee.name if isinstance(v, Call) and isinstance(v.callee, OpRef) else type(v).__name__
            raise UnsupportedError(f"@{g.func_name}: %{b.var.name} = {what}(...) is pinned to {p}, but {p} cannot run it here (no capability matches it, or its predicate refuses its dtypes/shapes)")


__all__ = ["Candidate", "BlockShape", "FALLBACK", "block_candidates", "pinned_backend", "is_op_binding"]
