"""offload: replace the regions of a fixed placement by their backends' lowerings.

Requires a normalized, well-formed module and a ``Placement``
(``tilework.backend.partition``) computed for it (regions name their bindings by var). Each
region of a block becomes what its backend's ``lower(region)`` returns, normally a
``call_lib`` of an extern function (destination-passing after ``lower_calls``), bound to the
region's output vars; the block is re-emitted in a topological order with each region as one
node. The facts that op inference could not prove for the region's calls (broadcasts of sym
dims, say) become an ``assert_dims`` just before it, as ``Legalize`` would have emitted them,
so an offloaded op is checked at run time exactly like a compiled one. Everything not in a
region is left for ``Legalize``.

A lowering that raises ``UnsupportedError`` leaves its region to tilework's own kernels, with
a warning naming the region and the reason (a backend failure never fails the build).

``OffloadByRules(backends)`` is partitioning by rules (``partition_by_rules``) followed by
this pass: the fixed assignment ``tilework.build(mod, backends=[...])`` uses.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

from tilework.backend.base import Backend, Region, get_backend, resolve_backends
from tilework.backend.partition import Placement, RegionSpec, partition_by_rules
from tilework.errors import UnsupportedError, WellFormedError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Call, Expr, OpRef
from tilework.ir.module import IRModule
from tilework.op import base as opbase
from tilework.pattern.graph import BlockGraph, PatternMatch, match_at
from tilework.pattern.rewrite import Remap, Replacement, rewrite_blocks
from tilework.transform.legalize import assert_dims_call
from tilework.transform.base import Pass


def region_of(g: BlockGraph, spec: RegionSpec, backend: Backend) -> Region:
    """The ``Region`` a placement's ``spec`` names in block ``g``."""
    by_name = {b.var.name: i for i, b in enumerate(g.bindings)}
    missing = [v for v in spec.vars if v not in by_name]
    if missing:
        raise WellFormedError(f"@{g.func_name}: the placement names %{', %'.join(missing)}, which block {g.block_index} does not bind (was the placement made for another module?)")
    indices = tuple(sorted(by_name[v] for v in spec.vars))
    inputs, outputs = g.region_io(indices)
    match: PatternMatch | None = None
    if spec.capability is not None:
        match = match_at(backend.capability(spec.capability).pattern, g, indices[-1])
        if match is None or match.indices != indices:
            raise WellFormedError(f"@{g.func_name}: capability {backend.name}.{spec.capability} does not match the region %{', %'.join(spec.vars)} any more")
    bindings = tuple(g.bindings[i] for i in indices)
    return Region(backend.name, spec.capability, g.func_name, bindings, inputs, outputs, match)


def _dim_checks(region: Region) -> list[opbase.DimCheck]:
    checks: list[opbase.DimCheck] = []
    for call in region.calls:
        if isinstance(call.callee, OpRef) and opbase.lookup(call.callee.name) is not None:
            checks.extend(opbase.infer_with_checks(call)[1])
    return checks


def _replacement(g: BlockGraph, spec: RegionSpec) -> Replacement | None:
    backend = get_backend(spec.backend)
    if backend.lower is None:
        return None
    region = region_of(g, spec, backend)
    try:
        value = backend.lower(region)
    except UnsupportedError as e:
        warnings.warn(f"@{g.func_name}: {backend.name} could not lower the region %{', %'.join(spec.vars)} ({e}); tilework's kernels run it instead", stacklevel=2)
        return None
    checks = _dim_checks(region)

    def build(remap: Remap, bb: BlockBuilder) -> Expr:
        if checks:
            bb.emit(assert_dims_call(checks), name="check")
        return remap(value)

    indices = tuple(g.index[b.var] for b in region.bindings)
    return Replacement(indices, region.outputs, build, f"{backend.name}:{spec.vars[-1]}")


@dataclass(frozen=True)
class Offload(Pass):
    placement: Placement
    name: str = "offload"

    def run(self, mod: IRModule) -> IRModule:
        by_block = self.placement.by_block()
        if not by_block:
            return mod

        def plan(g: BlockGraph) -> list[Replacement]:
            reps = [_replacement(g, spec) for spec in by_block.get((g.func_name, g.block_index), [])]
            return [r for r in reps if r is not None]

        return rewrite_blocks(mod, plan, funcs={f for f, _ in by_block})


@dataclass(frozen=True)
class OffloadByRules(Pass):
    """Partition by rules over ``backends`` (names in priority order), then offload."""

    backends: tuple[str | Backend, ...] = ("codegen",)
    name: str = "offload_by_rules"

    def run(self, mod: IRModule) -> IRModule:
        return Offload(partition_by_rules(mod, list(self.backends))).run(mod)


def offload_calls(mod: IRModule) -> dict[str, int]:
    """How many ``call_lib`` calls of each extern symbol the graph functions hold (to see what
    a placement did)."""
    from tilework.ir.graph import ExternFunc, bindings_of

    out: dict[str, int] = {}
    for _, f in mod.graph_funcs():
        for b in bindings_of(f):
            v = b.value
            if isinstance(v, Call) and isinstance(v.callee, OpRef) and v.callee.name == "call_lib" and isinstance(v.args[0], ExternFunc):
                out[v.args[0].symbol] = out.get(v.args[0].symbol, 0) + 1
    return out


def check_backends(backends: Sequence[str | Backend] | str) -> list[str]:
    """The names of ``backends`` after resolving them (unknown or unavailable ones raise)."""
    return [b.name for b in resolve_backends(backends)]


__all__ = ["Offload", "OffloadByRules", "region_of", "offload_calls", "check_backends"]
