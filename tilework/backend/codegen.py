"""The ``codegen`` backend: tilework's own kernels, for every op.

It is the fallback: its one capability matches any op call, and its lowering is to leave the
op where it is, so ``Legalize`` turns it into a loop-level kernel later. Bindings that no
backend of a placement claims end here too. Listing ``codegen`` before another backend gives
that backend nothing. Its kernels compile through a target (``tilework.codegen.Target``: the
C + OpenMP ``cpu`` target by default), which is how ``tilework.build`` compiles every kernel.
"""

from __future__ import annotations

from typing import Mapping

from tilework.backend.base import Backend, Capability, register_backend
from tilework.codegen.target import get_target
from tilework.ir.loop import TensorFunc
from tilework.pattern.core import op_call
from tilework.runtime.kernels import KernelModule


def _available() -> tuple[bool, str]:
    return True, "tilework's kernels (legalize + default schedules, compiled by a target), always available"


def compile_kernels(funcs: Mapping[str, TensorFunc], target: str) -> KernelModule:
    """The kernel module ``target`` makes of ``funcs``."""
    return get_target(target).build(funcs)


CODEGEN = register_backend(
    Backend(
        "codegen",
        "library",
        _available,
        (Capability("codegen.any", op_call(None)),),
        lower=None,
        compile=compile_kernels,
        description="tilework's own kernels for every op (the fallback)",
    )
)

__all__ = ["CODEGEN"]
