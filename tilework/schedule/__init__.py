"""Schedules: pure transformations of loop-level TensorFuncs that keep their meaning.

``default_schedule(func)`` gives a kernel a good schedule without tuning: the rules
(attention, matmul, GEMV, reduction, stencil, elementwise/injective; ``rules/``) are tried in order
and the first that applies wins; the fallback rule applies to every function, so this never
fails. The result is
marked ``scheduled`` (and ``schedule_rule`` names the rule) in its attrs; a function already
marked is returned as is. ``primitives`` holds the transformations the rules are made of, and
``analysis`` the classification they dispatch on.
"""

from __future__ import annotations

from typing import Any, Sequence

from tilework.errors import TileworkError
from tilework.ir.loop import TensorFunc
from tilework.schedule.analysis import FuncKind, classify, op_pattern
from tilework.schedule.loop_primitives import hoist_guards
from tilework.schedule.rules import RULES, fallback

__all__ = ["FuncKind", "classify", "default_schedule", "op_pattern"]


def default_schedule(func: TensorFunc, strict: bool = False, rules: Sequence[Any] | None = None) -> TensorFunc:
    """``func`` scheduled by the first default rule that applies (see the module doc);
    ``rules`` replaces the standard rules (the fallback is always tried last).

    A rule that refuses (``TileworkError``) declines. A rule that fails otherwise has a bug:
    with ``strict`` the error propagates (tests use it); else that rule declines too, so that
    compiling a model never stops on a schedule, and if even the fallback fails the function
    stays as it is (serial code is always correct), marked ``schedule_rule="none"``.
    """
    if func.attrs.get("scheduled"):
        return func
    for rule in (*(RULES if rules is None else rules), fallback):
        try:
            out = rule.apply(func)
        except TileworkError:
            out = None
        except Exception:
            if strict:
                raise
            out = None
        if out is not None:
            return _finish(out, rule.NAME)
    return func.replace(attrs=func.attrs.with_(scheduled=True, schedule_rule="none"))


def _finish(func: TensorFunc, rule: str) -> TensorFunc:
    func = hoist_guards(func)
    return func.replace(attrs=func.attrs.with_(scheduled=True, schedule_rule=rule))
