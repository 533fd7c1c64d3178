"""Evolutionary refinement on measured end-to-end time (Collage's second stage, small).

The search's cover assumes costs add up; they do not quite (caches, thread pools, fusion
across region borders). Genes are the cover's offloaded regions: 1 keeps a region on its
backend, 0 returns it to tilework's kernels. The population starts from the cover itself (all
ones), tilework alone (all zeros) and random individuals; each generation keeps the fittest by
tournament, recombines with two-point crossover and flips bits, and is timed end to end as a
whole (the cost model's ``end_to_end``: built, run side by side, cached by placement). It stops
after ``generations`` or when ``deadline`` (``time.perf_counter()``) passes, and returns the
fastest placement seen with its time.
"""

from __future__ import annotations

import random
import time
from typing import Any, Mapping, Sequence

from tilework.backend.partition import Placement
from tilework.collage.cost import CostModel
from tilework.ir.module import IRModule


def evolve(mod: IRModule, model: CostModel, searched: Placement, env: Mapping[Any, int], *, deadline: float | None, population: int = 8, generations: int = 6, seed: int = 0, fixed: frozenset[int] = frozenset()) -> tuple[Placement, float] | None:
    """See the module docstring; None when the cost model does not time whole placements.
    ``fixed``: indices of regions that always stay offloaded (they hold pinned bindings)."""
    genes = len(searched.regions)
    if genes == 0 or len(fixed) >= genes:
        return None
    rng = random.Random(seed)

    def placement(bits: Sequence[int]) -> Placement:
        return Placement(tuple(r for k, (r, b) in enumerate(zip(searched.regions, bits)) if b or k in fixed), searched.backends)

    fitness: dict[tuple[int, ...], float] = {}

    def score(pop: list[tuple[int, ...]]) -> bool:
        todo = [p for p in dict.fromkeys(pop) if p not in fitness]
        if not todo:
            return True
        times = model.end_to_end(mod, [placement(p) for p in todo], env)
        if times is None:
            return False
        fitness.update(zip(todo, times))
        return True

    pop = [tuple([1] * genes), tuple([0] * genes)]
    pop += [tuple(rng.randint(0, 1) for _ in range(genes)) for _ in range(population - len(pop))]
    if not score(pop):
        return None
    for _ in range(generations):
        if deadline is not None and time.perf_counter() > deadline:
            break
        nxt = [min(pop, key=fitness.__getitem__)]  # the best so far survives
        while len(nxt) < population:
            a = min(rng.sample(pop, k=min(3, len(pop))), key=fitness.__getitem__)
            b = min(rng.sample(pop, k=min(3, len(pop))), key=fitness.__getitem__)
            child = list(a)
            if genes > 1 and rng.random() < 0.5:
                i, j = sorted(rng.sample(range(genes + 1), 2))
                child[i:j] = b[i:j]
            child = [1 - g if rng.random() < max(0.05, 1 / genes) else g for g in child]
            nxt.append(tuple(child))
        pop = nxt
        if not score(pop):
            break
    best = min(fitness, key=fitness.__getitem__)
    return placement(best), fitness[best]


__all__ = ["evolve"]
