"""``tilework.build``: compile an IRModule once into an Executable that serves every shape.

The pipeline:

1. graph passes (``default_graph_passes``): canonicalize bindings, fold constants, merge common
   subexpressions, drop dead code;
2. backend offload by rules when ``backends`` is given (``tilework.backend``);
3. legalize (ops -> loop-level kernels), then the kernel passes (``default_kernel_passes``):
   copies that only reshape become views, fusion (op patterns, grouping, merged kernels);
4. default_schedule -> to_non_dataflow -> lower_calls (explicit allocation, destination-passing
   calls) -> plan_memory (storage reuse, static arenas for bounded dims) -> lower_shapes (shape
   heap, run-time checks) -> kill_after_last_use -> VM bytecode; all kernels compile in one call
   of the C compiler.

``opt_level=0`` skips steps 1 and 3's kernel passes (and memory planning), for comparisons and
debugging.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from tilework.errors import BuildError
from tilework.ir.module import IRModule
from tilework.runtime.executable import Executable
from tilework.transform.pipeline import Pass, Pipeline

TARGETS = ("cpu",)


def default_graph_passes() -> list[Pass]:
    """Graph-level clean-ups run before anything is lowered."""
    from tilework.transform.canonicalize_bindings import CanonicalizeBindings
    from tilework.transform.common_subexpr_elim import CommonSubexprElim
    from tilework.transform.dead_code_elimination import DeadCodeElimination
    from tilework.transform.fold_constant import FoldConstant

    return [CanonicalizeBindings(), FoldConstant(), CommonSubexprElim(), DeadCodeElimination()]


def default_kernel_passes() -> list[Pass]:
    """Passes on the kernels right after legalize: reshape copies become views, then fusion."""
    from tilework.transform.fuse_tensor import fusion_passes
    from tilework.transform.rewrite_reshape_to_view import RewriteReshapeToView

    return [RewriteReshapeToView(), *fusion_passes()]


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
    opt_level: int = 1,
    plan_memory: bool | None = None,
    backends: str | Sequence[Any] | None = None,
) -> Executable:
    """Compile ``mod`` for ``target``. ``passes`` replaces the graph passes that run before
    lowering (``default_graph_passes()``); ``post_legalize_passes`` replaces the kernel passes
    that run right after legalize (``default_kernel_passes()``: views, fusion); ``opt_level=0``
    runs neither and no memory planning; ``dump_dir`` writes the IR after every pass;
    ``verify`` runs the well-formedness verifier after every pass; ``plan_memory`` overrides
    the opt level's choice (False: every intermediate its own allocation, freed after its last
    use).
    ``backends`` (names in priority order, ``"blas,torch,codegen"`` or a list; see
    ``tilework.backend``) offloads what each backend claims, by rules, before lowering; what no
    backend claims compiles to tilework's kernels."""
    if target not in TARGETS:
        raise BuildError(f"unknown target {target!r}; this build supports: {', '.join(TARGETS)}")
    if not isinstance(mod, IRModule):
        raise BuildError(f"build expects an IRModule, got {type(mod).__name__}")
    from tilework.runtime import bytecode

    t0 = time.perf_counter()
    if opt_level not in (0, 1):
        raise BuildError(f"opt_level must be 0 or 1, got {opt_level!r}")
    optimize = opt_level >= 1
    if passes is None:
        passes = default_graph_passes() if optimize else []
    if post_legalize_passes is None:
        post_legalize_passes = default_kernel_passes() if optimize else []
    lowering = lowering_passes(optimize if plan_memory is None else plan_memory)
    at = 1 + next(i for i, p in enumerate(lowering) if p.name == "legalize")
    lowering[at:at] = list(post_legalize_passes)
    offload: list[Pass] = []
    if backends is not None:
        from tilework.transform.offload import OffloadByRules, check_backends

        backend_names = check_backends(backends)
        offload.append(OffloadByRules(tuple(backend_names)))
    pipeline = Pipeline([*passes, *offload, *lowering], verify=verify, dump_dir=dump_dir)
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
