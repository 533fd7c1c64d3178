"""``tilework.build``: compile an IRModule once into an Executable that serves every shape.

The passes are the named pipeline's stages (``tilework.transform.pipeline.stages``): graph
clean-ups, backend offload by rules when ``backends`` is given (``tilework.backend``), legalize,
views and fusion, the target's default schedules, then lowering to VM form. VM codegen turns
the graph functions into bytecode, and the ``codegen`` backend compiles every kernel through
the target (``tilework.codegen.Target``: ``cpu`` is C + OpenMP in one shared object,
``interp`` the NumPy reference interpreter) into one kernel module.

``opt_level=0`` is the ``O0`` pipeline (no graph passes, views, fusion or memory planning), for
comparisons and debugging.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from tilework.backend import get_backend
from tilework.codegen import get_target
from tilework.codegen.vm_codegen import generate
from tilework.collage.cost import register_builder as register_placement_builder
from tilework.errors import BuildError
from tilework.ir import sym
from tilework.ir.graph import GraphFunc
from tilework.ir.module import IRModule
from tilework.llm.compile import register_builder
from tilework.runtime.executable import Executable
from tilework.transform.layout_weights import LayoutWeights, weight_layout
from tilework.transform.pipeline import Pass, Pipeline, flatten, stages


def pipeline_name(opt_level: int) -> str:
    if opt_level not in (0, 1):
        raise BuildError(f"opt_level must be 0 or 1, got {opt_level!r}")
    return "default" if opt_level >= 1 else "O0"


@sym.held()  # the compile's symbolic expressions live until it ends, then go
def build(
    mod: IRModule,
    target: str = "cpu",
    *,
    passes: Sequence[Pass] | None = None,
    post_legalize_passes: Sequence[Pass] | None = None,
    dump_dir: str | None = None,
    verify: bool = False,
    opt_level: int = 1,
    pipeline: str | None = None,
    plan_memory: bool | None = None,
    backends: str | Sequence[Any] | None = None,
    placement: Any = None,
    placement_options: Mapping[str, Any] | None = None,
    layout_weights: str | None = None,
) -> Executable:
    """Compile ``mod`` for ``target`` (``tilework.codegen.targets()``).

    ``pipeline`` names the pass pipeline (``default``; ``O0`` is ``opt_level=0``). ``passes``
    replaces its graph stage and ``post_legalize_passes`` its kernel stage (views, fusion);
    ``plan_memory`` overrides its choice (False: every intermediate its own allocation, freed
    after its last use); ``dump_dir`` writes the IR after every pass; ``verify`` runs the
    well-formedness verifier after every pass.
    ``backends`` (names in priority order, ``"blas,torch,codegen"`` or a list; see
    ``tilework.backend``) offloads what each backend claims, by rules, before lowering; what no
    backend claims compiles to the target's kernels.
    ``placement="auto"`` searches the placement instead (``tilework.collage``: measured on this
    machine, per shape bucket, over ``backends`` or every available backend) after the graph
    passes; a ``PlacementPlan`` or the path of a saved one applies that plan.
    ``placement_options``: ``budget_s``, ``buckets``, ``pins``, ``refine``, ``max_size``,
    ``progress`` (see ``tilework.collage.place``). The plan is kept in ``exe.meta["placement"]``.
    ``layout_weights`` lays out the weights of the linears left to tilework's kernels after
    offload (``tilework.transform.layout_weights``; offloaded regions read them as given):
    ``"constants"`` the weight constants, ``"params"`` also ``main``'s weight params, which the
    caller then passes as ``exe.meta["weight_layout"]`` says (``lay_out_weights``)."""
    if not isinstance(mod, IRModule):
        raise BuildError(f"build expects an IRModule, got {type(mod).__name__}")
    if layout_weights not in (None, "constants", "params"):
        raise BuildError(f"layout_weights must be None, 'constants' or 'params', got {layout_weights!r}")
    tgt = get_target(target)
    name = pipeline or pipeline_name(opt_level)
    t0 = time.perf_counter()
    offload: list[Pass] = []
    backend_names: list[str] = []
    plan = None
    if placement is not None:
        from tilework.collage.place import ApplyPlacement, plan_for

        graph_stage = stages(name, graph=passes)["graph"]
        mod = Pipeline(graph_stage, verify=verify, dump_dir=dump_dir)(mod) if graph_stage else mod
        passes = []
        plan = plan_for(mod, placement, backends, **dict(placement_options or {}))
        offload.append(ApplyPlacement(plan))
    elif backends is not None:
        from tilework.backend.offload import OffloadByRules, check_backends

        backend_names = check_backends(backends)
        offload.append(OffloadByRules(tuple(backend_names)))
    if layout_weights is not None:
        offload.append(LayoutWeights(params=layout_weights == "params"))
    staged = stages(name, placement=offload, schedule_rules=tgt.schedule_rules, graph=passes, kernel=post_legalize_passes, plan_memory=plan_memory)
    lowered = Pipeline(flatten(staged), verify=verify, dump_dir=dump_dir)(mod)
    t1 = time.perf_counter()
    functions, constants = generate(lowered)
    kernels = dict(lowered.tensor_funcs())
    modules = []
    cache_hit = None
    if kernels:
        module = compile_kernels(kernels, target)
        cache_hit = getattr(module, "cache_hit", None)
        modules.append(module)
    t2 = time.perf_counter()
    meta: dict[str, Any] = {
        "target": target,
        "pipeline": name,
        "passes_s": round(t1 - t0, 4),
        "codegen_s": round(t2 - t1, 4),
        "kernel_cache_hit": cache_hit,
    }
    if backends is not None and plan is None:
        meta["backends"] = backend_names
    main = lowered.get("main")
    if isinstance(main, GraphFunc) and weight_layout(main):
        meta["weight_layout"] = weight_layout(main)
    if plan is not None:
        meta["placement"] = plan.to_dict()
    meta["signature"] = signature(mod)
    return Executable(functions, constants, kernels, modules, meta)


def signature(mod: IRModule) -> dict[str, Any]:
    """Each graph function's params and result as the text format prints them, and the bounds
    of the sym vars in its params (JSON data: ``tilework explain`` shows it for an executable
    built from a module, which keeps no other trace of its source)."""
    from tilework.ir.info import free_vars
    from tilework.text.printer import print_info

    out: dict[str, Any] = {}
    for name, fn in mod.graph_funcs():
        dims: dict[str, list[int | None]] = {}
        for p in fn.params:
            for v in free_vars(p.info):
                dims.setdefault(v.name, [v.lo, v.hi])
        out[name] = {"params": [[p.name, print_info(p.info)] for p in fn.params], "returns": print_info(fn.ret_info), "dims": dims}
    return out


def compile_kernels(kernels: dict[str, Any], target: str) -> Any:
    """The kernel module of ``kernels`` for ``target``, made by the ``codegen`` backend."""
    codegen = get_backend("codegen")
    if codegen.compile is None:
        raise BuildError("the codegen backend cannot compile kernels")
    return codegen.compile(kernels, target)


register_builder(build)  # the LLM flow compiles its decoder with tilework.build
register_placement_builder(build)  # the placement search measures regions built with it

__all__ = ["build", "compile_kernels", "pipeline_name"]
