"""Apache TVM (its Relax compiler) as a peer of the benchmarks: a torch module imported with
``tvm.relax.frontend.torch.from_exported_program``, compiled for the host CPU and run on
Relax's VM.

TVM is in no extra of tilework's: install it in a venv of its own (see pyproject.toml's comment
beside the ``bench`` extra). Two ways of building a model:

- ``untuned``: ``tvm.compile`` with the default Relax pipeline for the target, once, with the
  dynamic dims left symbolic. On CPU that pipeline legalizes every op to TIR and fuses, but
  schedules nothing: each kernel is the loop nest as legalized (no tiling, vectorizing or
  threading), which is what a user gets without tuning.
- ``tuned``: MetaSchedule (``tune_relax``, the XGBoost cost model) at static shapes, with a
  bounded number of trials per task, its records in a JSON database in a directory of the
  caller's (a second run finds every task there and does not tune again), then
  ``compile_relax`` with that database.

The weights are bound into the module as constants (the deployment path of TVM's frontend:
the transposes of the linear weights are folded at compile time, as tilework packs its
weights once with ``layout_weights="params"``); the callable takes the model's inputs only.
The thread count is ``TVM_NUM_THREADS``, which must be set before tvm is imported.

MetaSchedule's builder, as shipped in apache-tvm 0.27, imports ``tvm.s_tir.tensor_intrin`` in
every build worker, and that registers the CUDA tensor intrinsics from TVMScript: about 35 s
of CPU (about 60 s on a loaded 2-core machine) per worker, and the builder's default timeout
is 30 s, so every candidate failed as a "build error". :func:`tune` gives the builder a build
function that leaves that import out (the intrinsics only serve tensorization, which float32
on x86 does not use) and a longer timeout. The tuning process itself still imports them once
(``TuneContext`` does); :func:`tune` reports that time apart from the search.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


def available() -> tuple[bool, str]:
    """Whether tvm (with its torch frontend) imports here, and a line saying which or why not."""
    if importlib.util.find_spec("tvm") is None:
        return False, "apache-tvm is not installed (pip install apache-tvm; see pyproject.toml)"
    try:
        import tvm
        from tvm.relax.frontend.torch import from_exported_program  # noqa: F401
    except Exception as e:  # an optional peer: any failure to import it is a reason to skip it
        return False, f"tvm does not import: {type(e).__name__}: {e}"
    return True, f"apache-tvm {tvm.__version__}, target {host_target(0)}"


def host_target(threads: int) -> Any:
    """``llvm`` for this CPU (LLVM's name of the host, e.g. znver4), ``num-cores`` = ``threads``
    (0: every CPU). apache-tvm 0.27 takes targets as dicts only (the string form is gone)."""
    import tvm

    cpu = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUName")()
    return tvm.target.Target({"kind": "llvm", "mcpu": str(cpu), "num-cores": threads or os.cpu_count() or 1})


def _import(module: Any, example: tuple[Any, ...], dynamic_shapes: Any) -> Any:
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    ep = torch.export.export(module, example, dynamic_shapes=dynamic_shapes)
    return from_exported_program(ep)


def _runner(ex: Any) -> Callable[..., np.ndarray]:
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    main = vm["main"]

    def run(*arrays: np.ndarray) -> np.ndarray:
        out = main(*[tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in arrays])
        return out[0].numpy()  # type: ignore[no-any-return,unused-ignore]  # the frontend returns a tuple

    return run


def compile_untuned(module: Any, example: tuple[Any, ...], dynamic_shapes: Any, threads: int) -> Callable[..., np.ndarray]:
    """``module`` exported with ``dynamic_shapes``, compiled once by ``tvm.compile``'s default
    pipeline for the host; returns a callable on NumPy arrays (the module's inputs)."""
    import tvm

    return _runner(tvm.compile(_import(module, example, dynamic_shapes), host_target(threads)))


@dataclass(frozen=True)
class Tuned:
    """A model built with MetaSchedule: ``run`` on NumPy arrays; ``tune_s`` the seconds spent
    tuning in this call (0 when the database had every task), of which ``intrin_import_s``
    importing MetaSchedule's tensor intrinsics; ``compile_s`` the rest (export, import,
    ``compile_relax``); ``tasks`` and ``trials`` the tuning tasks and trials run per task."""

    run: Callable[..., np.ndarray]
    tune_s: float
    intrin_import_s: float
    compile_s: float
    tasks: int
    trials: int
    reused: bool


def _build_without_intrinsics(mod: Any, target: Any, _params: Any) -> Any:
    """MetaSchedule's default build function less its ``import tvm.s_tir.tensor_intrin``."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def tune(module: Any, example: tuple[Any, ...], trials: int, db_dir: str, threads: int) -> Tuned:
    """``module`` exported at the static shapes of ``example``, its tasks tuned with up to
    ``trials`` trials each unless ``db_dir``'s JSON database already holds every one of them,
    compiled with the database."""
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    t = time.perf_counter()
    mod = _import(module, example, None)
    target = host_target(threads)
    with target:  # the fusion compile_relax runs before it applies the database: the same tasks
        fused = tvm.transform.Sequential(
            relax.backend.cpu_generic.library_dispatch_passes(target)
            + [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
        )(mod)
    tasks = ms.relax_integration.extract_tasks(fused, target)
    os.makedirs(db_dir, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=db_dir)
    reused = all(db.has_workload(task.dispatched[0]) for task in tasks)
    compile_s = time.perf_counter() - t
    tune_s = intrin_s = 0.0
    if not reused:
        t = time.perf_counter()
        import tvm.s_tir.tensor_intrin  # noqa: F401  # TuneContext imports it: timed apart

        intrin_s = time.perf_counter() - t
        # the build workers unpickle _build_without_intrinsics by reference: they must find this module
        here = os.path.dirname(os.path.abspath(__file__))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
        ms.relax_integration.tune_relax(
            fused,
            {},
            target,
            db_dir,
            max_trials_global=trials * len(tasks),
            max_trials_per_task=trials,
            num_trials_per_iter=min(trials, 64),
            builder=ms.builder.LocalBuilder(f_build=_build_without_intrinsics, timeout_sec=300),
            runner=ms.runner.LocalRunner(timeout_sec=120),
            database=db,
            cost_model="xgb",
            seed=0,
        )
        tune_s = time.perf_counter() - t
    t = time.perf_counter()
    ex = ms.relax_integration.compile_relax(db, mod, target, None)
    compile_s += time.perf_counter() - t
    return Tuned(_runner(ex), tune_s, intrin_s, compile_s, len(tasks), 0 if reused else trials, reused)
