"""``tilework.build``: compile an IRModule once into an Executable that serves every shape.

The pipeline: legalize (ops -> kernels) -> default_schedule -> to_non_dataflow -> lower_calls
(explicit allocation, destination-passing calls) -> lower_shapes (shape heap, run-time checks)
-> kill_after_last_use -> VM bytecode; all kernels compile in one call of the C compiler.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from tilework.errors import BuildError
from tilework.ir.module import IRModule
from tilework.runtime.executable import Executable
from tilework.transform.pipeline import Pass, Pipeline

TARGETS = ("cpu",)


def lowering_passes() -> list[Pass]:
    from tilework.transform.default_schedule import DefaultSchedule
    from tilework.transform.kill_after_last_use import KillAfterLastUse
    from tilework.transform.legalize import Legalize
    from tilework.transform.lower_calls import LowerCalls
    from tilework.transform.lower_shapes import LowerShapes
    from tilework.transform.to_non_dataflow import ToNonDataflow

    return [Legalize(), DefaultSchedule(), ToNonDataflow(), LowerCalls(), LowerShapes(), KillAfterLastUse()]


def build(
    mod: IRModule,
    target: str = "cpu",
    *,
    passes: Sequence[Pass] | None = None,
    dump_dir: str | None = None,
    verify: bool = False,
) -> Executable:
    """Compile ``mod`` for ``target``. ``passes`` replaces the optimization passes that run
    before lowering (none by default); ``dump_dir`` writes the IR after every pass;
    ``verify`` runs the well-formedness verifier after every pass."""
    if target not in TARGETS:
        raise BuildError(f"unknown target {target!r}; this build supports: {', '.join(TARGETS)}")
    if not isinstance(mod, IRModule):
        raise BuildError(f"build expects an IRModule, got {type(mod).__name__}")
    from tilework.runtime import bytecode

    t0 = time.perf_counter()
    pipeline = Pipeline([*(passes or []), *lowering_passes()], verify=verify, dump_dir=dump_dir)
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
    return Executable(functions, constants, kernels, library, meta)
