"""``tilework.build``: compile an IRModule once into an Executable that serves every shape.

The pipeline: legalize (ops -> kernels) -> default_schedule -> to_non_dataflow -> lower_calls
(explicit allocation, destination-passing calls) -> plan_memory (storage reuse, static arenas
for bounded dims) -> lower_shapes (shape heap, run-time checks) -> kill_after_last_use -> VM
bytecode; all kernels compile in one call of the C compiler.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from tilework.errors import BuildError
from tilework.ir.module import IRModule
from tilework.runtime.executable import Executable
from tilework.transform.pipeline import Pass, Pipeline

TARGETS = ("cpu",)


def lowering_passes(plan_memory: bool = True) -> list[Pass]:
    from tilework.transform.default_schedule import DefaultSchedule
    from tilework.transform.kill_after_last_use import KillAfterLastUse
    from tilework.transform.legalize import Legalize
    from tilework.transform.lower_calls import LowerCalls
    from tilework.transform.lower_shapes import LowerShapes
    from tilework.transform.plan_memory import PlanMemory
    from tilework.transform.to_non_dataflow import ToNonDataflow

    planning: list[Pass] = [PlanMemory()] if plan_memory else []
    return [Legalize(), DefaultSchedule(), ToNonDataflow(), LowerCalls(), *planning, LowerShapes(), KillAfterLastUse()]


def build(
    mod: IRModule,
    target: str = "cpu",
    *,
    passes: Sequence[Pass] | None = None,
    post_legalize_passes: Sequence[Pass] | None = None,
    dump_dir: str | None = None,
    verify: bool = False,
    plan_memory: bool = True,
    backends: str | Sequence[Any] | None = None,
) -> Executable:
    """Compile ``mod`` for ``target``. ``passes`` replaces the optimization passes that run
    before lowering (none by default); ``post_legalize_passes`` run right after legalize,
    before scheduling (e.g. ``RewriteReshapeToView``); ``dump_dir`` writes the IR after every
    pass; ``verify`` runs the well-formedness verifier after every pass; ``plan_memory=False``
    leaves every intermediate its own allocation (freed after its last use), for comparison.
    ``backends`` (names in priority order, ``"blas,torch,codegen"`` or a list; see
    ``tilework.backend``) offloads what each backend claims, by rules, before lowering; what no
    backend claims compiles to tilework's kernels."""
    if target not in TARGETS:
        raise BuildError(f"unknown target {target!r}; this build supports: {', '.join(TARGETS)}")
    if not isinstance(mod, IRModule):
        raise BuildError(f"build expects an IRModule, got {type(mod).__name__}")
    from tilework.runtime import bytecode

    t0 = time.perf_counter()
    lowering = lowering_passes(plan_memory)
    at = 1 + next(i for i, p in enumerate(lowering) if p.name == "legalize")
    lowering[at:at] = list(post_legalize_passes or [])
    offload: list[Pass] = []
    if backends is not None:
        from tilework.transform.offload import OffloadByRules, check_backends

        backend_names = check_backends(backends)
        offload.append(OffloadByRules(tuple(backend_names)))
    pipeline = Pipeline([*(passes or []), *offload, *lowering], verify=verify, dump_dir=dump_dir)
    lowered = pipeline(mod)
    t1 = time.perf_counter()
    functions, constants = bytecode.generate(lowered)
    kernels = dict(lowered.tensor_funcs())
    library: Any = None
    cache_hit = None
    if kernels:
        from tilework.codegen import build_library

        library = build_library(kernels)
        cache_hit = getattr(library, "cache_hit", None)
    t2 = time.perf_counter()
    meta = {
        "target": target,
        "passes_s": round(t1 - t0, 4),
        "codegen_s": round(t2 - t1, 4),
        "kernel_cache_hit": cache_hit,
    }
    if backends is not None:
        meta["backends"] = backend_names
    return Executable(functions, constants, kernels, library, meta)
