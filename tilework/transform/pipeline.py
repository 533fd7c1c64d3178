"""The named pipelines ``tilework.build``, ``tilework.compile`` and the CLI compile with.

``PIPELINES`` (``default`` and ``O0``) are built by ``stages(name, ...)`` as ordered stages, so
callers address a stage by name rather than by position:

``graph`` (clean-ups on the graph) -> ``placement`` (backend offload: the caller's passes, from
the backend layer) -> ``legalize`` (ops -> loop-level kernels) -> ``kernel`` (views, fusion,
one-element constants as literals) ->
``schedule`` (default schedule rules, the target's) -> ``lowering`` (explicit allocation,
memory planning, shape lowering, freeing after last use).

``Pass``, ``Pipeline`` and the verification switch live in ``tilework.transform.base`` and are
re-exported here.
"""

from __future__ import annotations

from typing import Any, Sequence

from tilework.errors import BuildError
from tilework.transform.base import FunctionPass, Pass, Pipeline, set_verify_passes, verify_passes
from tilework.transform.canonicalize_bindings import CanonicalizeBindings
from tilework.transform.common_subexpr_elim import CommonSubexprElim
from tilework.transform.dead_code_elimination import DeadCodeElimination
from tilework.transform.default_schedule import DefaultSchedule
from tilework.transform.fold_activations import FoldActivations
from tilework.transform.fold_batch_norm import FoldBatchNorm
from tilework.transform.fold_constant import FoldConstant
from tilework.transform.fuse_attention import FuseAttention
from tilework.transform.fuse_tensor import fusion_passes
from tilework.transform.inline_scalar_constants import InlineScalarConstants
from tilework.transform.kill_after_last_use import KillAfterLastUse
from tilework.transform.legalize import Legalize
from tilework.transform.lower_calls import LowerCalls
from tilework.transform.lower_shapes import LowerShapes
from tilework.transform.plan_memory import PlanMemory
from tilework.transform.rewrite_reshape_to_view import RewriteReshapeToView
from tilework.transform.to_non_dataflow import ToNonDataflow

# -- the named pipelines --------------------------------------------------------------------------

PIPELINES = ("default", "O0")
STAGES = ("graph", "placement", "legalize", "kernel", "schedule", "lowering")


def graph_passes() -> list[Pass]:
    """Graph-level clean-ups run before anything is lowered."""
    return [CanonicalizeBindings(), FoldConstant(), FoldBatchNorm(), CommonSubexprElim(), FuseAttention(), FoldActivations(), DeadCodeElimination()]


def kernel_passes() -> list[Pass]:
    """Passes on the kernels right after legalize: reshape copies become views, then fusion,
    then one-element constants become literals in the kernels they are passed to."""
    return [RewriteReshapeToView(), *fusion_passes(), InlineScalarConstants()]


def lowering_passes(plan_memory: bool = True) -> list[Pass]:
    """From scheduled kernels to VM form: dataflow blocks dissolved, explicit allocation and
    destination-passing calls, memory planning, the shape heap, frees after last use."""
    planning: list[Pass] = [PlanMemory()] if plan_memory else []
    return [ToNonDataflow(), LowerCalls(), *planning, LowerShapes(), KillAfterLastUse()]


def stages(
    name: str = "default",
    *,
    placement: Sequence[Pass] = (),
    schedule_rules: Sequence[Any] | None = None,
    graph: Sequence[Pass] | None = None,
    kernel: Sequence[Pass] | None = None,
    plan_memory: bool | None = None,
) -> dict[str, list[Pass]]:
    """The stages of pipeline ``name`` in order (``STAGES``). ``placement`` fills the placement
    stage (backend offload, from the backend layer); ``schedule_rules`` are the target's
    (``tilework.codegen.Target.schedule_rules``); ``graph``/``kernel`` replace those stages;
    ``plan_memory`` overrides the pipeline's choice (``default`` plans, ``O0`` does not)."""
    if name not in PIPELINES:
        raise BuildError(f"unknown pipeline {name!r}; the pipelines are: {', '.join(PIPELINES)}")
    optimize = name == "default"
    return {
        "graph": list(graph_passes() if optimize else []) if graph is None else list(graph),
        "placement": list(placement),
        "legalize": [Legalize()],
        "kernel": list(kernel_passes() if optimize else []) if kernel is None else list(kernel),
        "schedule": [DefaultSchedule(None if schedule_rules is None else tuple(schedule_rules))],
        "lowering": lowering_passes(optimize if plan_memory is None else plan_memory),
    }


def flatten(staged: dict[str, list[Pass]], *, start: str | None = None) -> list[Pass]:
    """The passes of ``staged`` in stage order, from stage ``start`` on (all when None)."""
    names = list(staged)
    first = 0 if start is None else names.index(start)
    return [p for n in names[first:] for p in staged[n]]


def lowering_through(last: str, *, kernel: Sequence[Pass] = (), plan_memory: bool = False) -> list[Pass]:
    """The passes from ``legalize`` through the pass named ``last`` (``lower_calls``, say),
    with ``kernel`` as the kernel stage: how tests and benchmarks look at a lowering stage."""
    passes = flatten(stages(graph=[], kernel=kernel, plan_memory=plan_memory), start="legalize")
    names = [p.name for p in passes]
    if last not in names:
        raise BuildError(f"no pass {last!r} in the pipeline (it has: {', '.join(names)})")
    return passes[: names.index(last) + 1]


__all__ = [
    "Pass", "FunctionPass", "Pipeline", "PIPELINES", "STAGES", "set_verify_passes", "verify_passes",
    "graph_passes", "kernel_passes", "lowering_passes", "stages", "flatten", "lowering_through",
]  # fmt: skip
