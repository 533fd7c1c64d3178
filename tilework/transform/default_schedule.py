"""default_schedule: give every TensorFunc of the module a schedule from the default rules.

Each kernel not yet marked scheduled goes through ``tilework.schedule.default_schedule``, which
tries the rules (matmul, GEMV, reduction, elementwise/injective) in order and falls back to a
rule that always applies. Guarantees: every kernel is scheduled; numerics are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilework.ir.module import IRModule
from tilework.transform.pipeline import Pass


@dataclass(frozen=True)
class DefaultSchedule(Pass):
    name: str = "default_schedule"

    def run(self, mod: IRModule) -> IRModule:
        from tilework.schedule import default_schedule

        out = mod
        for name, f in mod.tensor_funcs():
            out = out.with_func(name, default_schedule(f))
        return out
