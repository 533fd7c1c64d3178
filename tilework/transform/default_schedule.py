"""default_schedule: give every TensorFunc of the module a schedule from the default rules.

Each kernel not yet marked scheduled goes through ``tilework.schedule.default_schedule``, which
tries the rules in order (``rules``: a target's own, or the standard matmul, GEMV, reduction,
elementwise/injective rules when None) and falls back to a rule that always applies.
Guarantees: every kernel is scheduled; numerics are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilework.ir.module import IRModule
from tilework.schedule import default_schedule
from tilework.transform.base import Pass


@dataclass(frozen=True)
class DefaultSchedule(Pass):
    rules: tuple[Any, ...] | None = None
    name: str = "default_schedule"

    def run(self, mod: IRModule) -> IRModule:
        out = mod
        for name, f in mod.tensor_funcs():
            out = out.with_func(name, default_schedule(f, rules=self.rules))
        return out
