"""End-to-end validation of a bucket's placement: the plan kept is the fastest measured whole.

The search adds up region costs and transition costs; the whole model does not quite (caches,
thread pools handing the cores over, fusion across region borders, what each runtime does
between calls). So, per shape bucket, candidate *plans* are built whole and timed at the
bucket's dims through the cost model's ``end_to_end`` (the estimator's discipline: a first
call, warm-up, repeats in bursts round-robin over the plans, the median, more rounds while the
spread is high, a time limit per plan; a plan that fails to build or run costs infinity, never
an error; every time kept in the persistent cost cache, so a second compile builds nothing):

1. the search's cover;
2. every single-backend plan: everything on codegen (tilework's kernels), and each other
   backend by its rules with codegen for the rest (what ``backends=[b, "codegen"]``
   compiles). One that would move a pinned binding off its backend is left out, with a note;
3. *extra* plans the caller adds (``place`` adds the cheapest cover over codegen and each one
   other backend: mixed plans without the alternation of several runtimes), timed only while
   the budget lasts;
4. with ``evolve``, the evolutionary refinement (``tilework.collage.evolve``) of the fastest
   plan so far that offloads anything (else of the search's cover).

Plans that are the same placement are timed once, their labels joined. Plans within ``CLOSE``
of the fastest are timed again, together and with more repeats (a few percent is within one
timing's noise), and these times stand. The fastest measured plan is kept (ties: the earlier
in the order above), except that a plan offloading anything must beat tilework's kernels alone
by more than ``OWN_MARGIN`` (a note says when the lead was smaller); every plan's time is
returned for the bucket's plan and its explanation.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tilework.backend.partition import Placement
from tilework.collage.candidates import FALLBACK, pinned_backend
from tilework.collage.cost import CostModel
from tilework.ir.module import IRModule
from tilework.pattern.graph import BlockGraph

CLOSE = 0.05  # plans within this fraction of the fastest are timed again, head to head, before one is kept
# A plan that offloads must beat tilework's own kernels alone (timed head to head) by more than
# this to be kept: a smaller lead is within what one machine's timings vary by, and the plan
# that loads no other runtime cannot lose to pools handing the cores over later.
OWN_MARGIN = 0.02


@dataclass(frozen=True)
class Alternative:
    """One plan timed end to end: its label and seconds (``math.inf``: it failed to build or
    run; ``detail`` says why when known)."""

    label: str
    seconds: float
    detail: str = ""


@dataclass(frozen=True)
class Option:
    """A plan to time: ``required`` ones always are, the others while the budget lasts."""

    label: str
    placement: Placement
    required: bool = True


@dataclass(frozen=True)
class Verdict:
    """``chosen``: the index of the option kept (into the options given), None when the
    evolutionary refinement found the placement; ``seconds``: its time (None: the cost model
    does not time whole plans, the search's cover stands); ``alternatives``: every plan timed,
    in order."""

    chosen: int | None
    placement: Placement
    seconds: float | None
    label: str
    alternatives: tuple[Alternative, ...] = ()
    notes: tuple[str, ...] = ()
    evolved_from: int | None = None  # the option the evolved placement refines (when ``chosen`` is None)


def pin_conflict(placement: Placement, blocks: Sequence[BlockGraph], pins: Mapping[str, str] | None) -> str | None:
    """The first pinned binding ``placement`` runs on another backend than its pin, as
    ``%var=backend``; None when it honours every pin."""
    if not pins:
        return None
    where: dict[tuple[str, int, str], str] = {}
    for r in placement.regions:
        for v in r.vars:
            where[(r.func, r.block, v)] = r.backend
    for g in blocks:
        for i, b in enumerate(g.bindings):
            pinned = pinned_backend(g, i, pins)
            if pinned is not None and where.get((g.func_name, g.block_index, b.var.name), FALLBACK) != pinned:
                return f"%{b.var.name}={pinned}"
    return None


def validate(
    mod: IRModule, model: CostModel, env: Mapping[Any, int], options: Sequence[Option], *, deadline: float | None = None, evolve: bool = False,
    evolve_deadline: float | None = None, blocks: Sequence[BlockGraph] = (), pins: Mapping[str, str] | None = None,
) -> Verdict:  # fmt: skip
    """See the module docstring; ``options[0]`` is the search's cover (kept when nothing can
    be timed); ``blocks`` and ``pins``: the evolutionary refinement never moves a pinned
    binding."""
    labels: list[str] = []
    plans: list[Placement] = []
    first_of: list[int] = []  # per distinct plan, the first option that is it
    required: list[bool] = []
    seen: dict[str, int] = {}
    for k, o in enumerate(options):
        key = o.placement.to_json()
        if key in seen:
            j = seen[key]
            labels[j] = f"{labels[j]} = {o.label}"
            required[j] = required[j] or o.required
            continue
        seen[key] = len(plans)
        labels.append(o.label)
        plans.append(o.placement)
        first_of.append(k)
        required.append(o.required)
    times: list[float | None] = [None] * len(plans)
    must = [j for j in range(len(plans)) if required[j]]
    got = model.end_to_end(mod, [plans[j] for j in must], env)
    if got is None:
        return Verdict(0, options[0].placement, None, "search")
    for j, s in zip(must, got):
        times[j] = s
    extra = [j for j in range(len(plans)) if not required[j]]
    notes: list[str] = []
    if extra and (deadline is None or time.perf_counter() < deadline):
        more = model.end_to_end(mod, [plans[j] for j in extra], env) or []
        for j, s in zip(extra, more):
            times[j] = s
    elif extra:
        notes.append(f"the budget was spent: {len(extra)} extra plan(s) not timed end to end")
    timed = [j for j in range(len(plans)) if times[j] is not None]
    details = getattr(getattr(model, "whole", None), "details", {})
    best = min(timed, key=lambda j: (times[j], j))
    close = [j for j in timed if (times[j] or 0.0) <= (times[best] or 0.0) * (1 + CLOSE)]
    if len(close) > 1 and math.isfinite(times[best] or 0.0) and (deadline is None or time.perf_counter() < deadline):
        for j, s in zip(close, model.end_to_end(mod, [plans[j] for j in close], env, again=True) or []):
            times[j] = s
        best = min(timed, key=lambda j: (times[j], j))
    own = next((j for j in timed if not plans[j].regions), None)
    if own is not None and own != best and (times[own] or 0.0) <= (times[best] or 0.0) * (1 + OWN_MARGIN):
        notes.append(f"{labels[best].split(' = ')[0]} was {100 * ((times[own] or 0.0) / (times[best] or 1.0) - 1):.1f}% faster than {labels[own].split(' = ')[0]}, within the margin ({100 * OWN_MARGIN:.0f}%): tilework's kernels alone are kept")
        best = own
    alts = [Alternative(labels[j], float(times[j] or 0.0), details.get(plans[j].to_json(), "") if not math.isfinite(times[j] or 0.0) else "") for j in timed]
    best_s = times[best]
    assert best_s is not None
    if not math.isfinite(best_s):
        notes.append("every plan failed to build or run end to end; the search's cover is kept")
        return Verdict(0, options[0].placement, None, "search", tuple(alts), tuple(notes))
    chosen: int | None = first_of[best]
    placement, label = plans[best], labels[best]
    if evolve:
        from tilework.collage.evolve import evolve as run_evolve

        base_j = best if plans[best].regions else 0
        base = plans[base_j]
        fixed = frozenset(k for k, r in enumerate(base.regions) if pin_conflict(Placement(tuple(x for x in base.regions if x is not r), base.backends), blocks, pins))
        found = run_evolve(mod, model, base, env, deadline=evolve_deadline, fixed=fixed)
        if found is not None:
            evolved_label = f"evolutionary refinement of {labels[base_j].split(' = ')[0]}"
            if found[0].to_json() not in seen:
                alts.append(Alternative(evolved_label, found[1]))
            margin = OWN_MARGIN if found[0].regions and not plans[best].regions else 0.0  # an offloading plan against tilework alone
            if found[1] * (1 + margin) < best_s:
                return Verdict(None, found[0], found[1], evolved_label, tuple(alts), tuple(notes), first_of[base_j])
    return Verdict(chosen, placement, best_s, label, tuple(alts), tuple(notes))


__all__ = ["Alternative", "Option", "Verdict", "validate", "pin_conflict"]
