"""Partitioning by rules: a fixed assignment of bindings to backends, by priority.

Given backends in priority order, every op binding of every dataflow block goes to the first
backend with a capability that matches it:

1. **Claiming.** Backends in order, each backend's capabilities in order, roots in program
   order: a match whose bindings are all unclaimed, whose predicate holds and whose bindings
   form a convex set claims them as one group. An op-level library call produces one value, so
   a library match must be *closed* (only its root is read outside it: ``matmul + bias`` is
   claimed only when nothing else reads the matmul). The ``codegen`` backend claims what it
   matches too, so a backend listed after it gets nothing it could have had.
2. **Merging.** Groups of one region backend that are adjacent (a producer and a reader) merge
   while the merged group has at most ``max_region_size`` bindings and stays *valid*: no path
   leaves it and re-enters it, even through other groups (so the graph with every group
   collapsed to one node has no cycle: each region can run as one call).
3. **Result.** A ``Placement``: the regions of every non-codegen group, named by their vars
   (names are unique in a function), with the backend and capability. Bindings not in a region
   stay for ``Legalize`` (tilework's kernels). ``tilework.backend.offload.Offload`` applies a
   placement; it can be saved and loaded as JSON, and ``table()`` explains it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from tilework.backend.base import Backend, resolve_backends
from tilework.ir.graph import Binding, Call, GraphFunc, OpRef
from tilework.ir.module import IRModule
from tilework.pattern.graph import BlockGraph, graphs_of, match_at


@dataclass(frozen=True)
class RegionSpec:
    """One region of a placement: the vars of its bindings (program order) in block
    ``block`` of function ``func``."""

    backend: str
    capability: str | None
    vars: tuple[str, ...]
    func: str = "main"
    block: int = 0


@dataclass(frozen=True)
class Placement:
    """A fixed assignment: ``regions`` (every binding not in one stays with codegen), the
    priority list it came from, and ``notes`` (matches refused because a predicate raised)."""

    regions: tuple[RegionSpec, ...] = ()
    backends: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)

    def by_block(self) -> dict[tuple[str, int], list[RegionSpec]]:
        out: dict[tuple[str, int], list[RegionSpec]] = {}
        for r in self.regions:
            out.setdefault((r.func, r.block), []).append(r)
        return out

    def counts(self) -> dict[str, int]:
        """Bindings placed per backend (codegen: not counted)."""
        out: dict[str, int] = {}
        for r in self.regions:
            out[r.backend] = out.get(r.backend, 0) + len(r.vars)
        return out

    def to_json(self) -> str:
        return json.dumps({"backends": list(self.backends), "regions": [dataclasses.asdict(r) for r in self.regions]}, indent=1)

    @staticmethod
    def from_json(text: str) -> "Placement":
        data: dict[str, Any] = json.loads(text)
        regions = tuple(RegionSpec(r["backend"], r["capability"], tuple(r["vars"]), r["func"], r["block"]) for r in data["regions"])
        return Placement(regions, tuple(data["backends"]))

    def table(self, mod: IRModule | None = None) -> str:
        """One line per region: function, backend, capability, size and its ops (when
        ``mod`` is given) or its vars."""
        lines = [f"placement by rules over {', '.join(self.backends) or 'no backends'}: {len(self.regions)} region(s)"]
        for r in self.regions:
            what = _ops_of(mod, r) if mod is not None else ", ".join(r.vars)
            lines.append(f"  @{r.func} block {r.block}: {r.backend:<12} {r.capability or 'region':<22} {len(r.vars):>3} binding(s): {what}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def _ops_of(mod: IRModule, r: RegionSpec) -> str:
    f = mod.get(r.func)
    names = set(r.vars)
    ops: dict[str, int] = {}
    for g in graphs_of(r.func, f) if isinstance(f, GraphFunc) else []:
        for b in g.bindings:
            if b.var.name in names and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef):
                ops[b.value.callee.name] = ops.get(b.value.callee.name, 0) + 1
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in ops.items())


# -- groups over one block ----------------------------------------------------------------


class _Groups:
    """Disjoint groups of a block's bindings; unclaimed bindings are singleton groups."""

    def __init__(self, g: BlockGraph) -> None:
        self.g = g
        n = len(g)
        self.parent = list(range(n))
        self.members: dict[int, list[int]] = {i: [i] for i in range(n)}
        self.info: dict[int, tuple[Backend, str | None]] = {}

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def claimed(self, i: int) -> bool:
        return self.find(i) in self.info

    def union(self, nodes: Sequence[int]) -> int:
        root = self.find(nodes[0])
        for j in nodes[1:]:
            r = self.find(j)
            if r == root:
                continue
            self.parent[r] = root
            self.members[root].extend(self.members.pop(r))
            self.info.pop(r, None)
        self.members[root].sort()
        return root

    def reaches(self, src: set[int], dst: set[int]) -> bool:
        """Whether a path leaves ``src`` and reaches ``dst`` through at least one node outside
        both, moving through whole groups (a group is one node once collapsed)."""
        limit = max(dst)
        stack = [s for i in src for s in self.g.succ[i] if s not in src and s not in dst]
        seen_groups: set[int] = set()
        while stack:
            x = stack.pop()
            root = self.find(x)
            if root in seen_groups:
                continue
            seen_groups.add(root)
            group = self.members[root]
            if group[0] > limit:
                continue
            for y in group:
                if y in dst:
                    return True
                for s in self.g.succ[y]:
                    if s in dst:
                        return True
                    if s not in src:
                        stack.append(s)
        return False

    def valid(self, nodes: set[int]) -> bool:
        """``nodes`` taken as one group leaves the collapsed graph acyclic."""
        return not self.reaches(nodes, nodes)


def _predicate_ok(backend: Backend, cap_name: str, accepts: Any, m: Any, notes: list[str]) -> bool:
    try:
        return bool(accepts(m))
    except Exception as e:  # noqa: BLE001 - a failing predicate refuses the match, never the build
        notes.append(f"{backend.name}.{cap_name} at %{m.root_binding.var.name}: predicate raised {type(e).__name__}: {e}")
        return False


def _claim(groups: _Groups, backends: Sequence[Backend], notes: list[str]) -> None:
    g = groups.g
    for backend in backends:
        for cap in backend.capabilities:
            for i in range(len(g)):
                if groups.claimed(i) or not isinstance(g.bindings[i], Binding):
                    continue
                m = match_at(cap.pattern, g, i)
                if m is None or any(groups.claimed(j) for j in m.indices):
                    continue
                if backend.kind == "library" and backend.lower is not None and not m.is_closed():
                    continue
                if len(m.indices) > 1 and not groups.valid(set(m.indices)):
                    continue
                if not _predicate_ok(backend, cap.name, cap.accepts, m, notes):
                    continue
                root = groups.union(list(m.indices))
                groups.info[root] = (backend, cap.name)


def _merge(groups: _Groups) -> None:
    g = groups.g
    for i in range(len(g)):
        for j in g.pred[i]:
            gi, gj = groups.find(i), groups.find(j)
            if gi == gj or gi not in groups.info or gj not in groups.info:
                continue
            bi, bj = groups.info[gi][0], groups.info[gj][0]
            if bi.kind != "region" or bi.name != bj.name:
                continue
            merged = set(groups.members[gi]) | set(groups.members[gj])
            if len(merged) > bi.max_region_size or not groups.valid(merged):
                continue
            root = groups.union([gi, gj])
            groups.info[root] = (bi, None)


def partition_block(g: BlockGraph, backends: Sequence[Backend], notes: list[str] | None = None) -> list[RegionSpec]:
    """The regions of one block (see the module docstring)."""
    groups = _Groups(g)
    notes = notes if notes is not None else []
    _claim(groups, backends, notes)
    _merge(groups)
    out = []
    for root, (backend, cap) in sorted(groups.info.items(), key=lambda kv: groups.members[kv[0]][0]):
        if backend.lower is None:
            continue
        names = tuple(g.bindings[i].var.name for i in groups.members[root])
        out.append(RegionSpec(backend.name, cap if backend.kind == "library" else None, names, g.func_name, g.block_index))
    return out


def partition_by_rules(mod: IRModule, backends: str | Sequence[str | Backend]) -> Placement:
    """The placement of every graph function's dataflow blocks over ``backends`` (names or
    objects in priority order; see the module docstring)."""
    resolved = resolve_backends(backends)
    notes: list[str] = []
    regions: list[RegionSpec] = []
    for name, f in mod.graph_funcs():
        for g in graphs_of(name, f):
            regions.extend(partition_block(g, resolved, notes))
    return Placement(tuple(regions), tuple(b.name for b in resolved), tuple(notes))


__all__ = ["RegionSpec", "Placement", "partition_block", "partition_by_rules"]
