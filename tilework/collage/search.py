"""The search: the cheapest exact cover of a block by candidates.

Every node must be covered by exactly one chosen candidate. The cost of a cover is the sum of
its candidates' costs plus, for every dataflow edge ``u -> v`` whose endpoints run on different
backends ``A -> B``, the transition cost ``T(A, B)`` (what alternating thread pools and
data hand-over cost in the whole model; measured by ``tilework.collage.cost``).

Shortest path over states (Dijkstra). A state is the set of covered nodes plus the backend of
each covered node that still has an uncovered neighbour (the *frontier*: the only facts the
transition costs of later steps depend on). A step expands from the first uncovered node, with
the candidates that contain it and are disjoint from what is covered (all of them start at that
node, so each cover is reached in one canonical order, never as permutations). Candidates of
infinite cost (a backend that failed to build or run) are never taken; a node no finite
candidate covers makes the search fail with a message naming it.

``brute_force`` enumerates every exact cover with the same cost: the oracle of the tests.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from tilework.collage.candidates import Candidate
from tilework.errors import UnsupportedError

Transition = Callable[[str, str], float]


@dataclass(frozen=True)
class Cover:
    """The chosen candidates (indices into the list searched, in expansion order) and the
    total cost (candidates plus transitions)."""

    chosen: tuple[int, ...]
    cost: float
    states: int = 0


def _no_transition(a: str, b: str) -> float:
    return 0.0


def _nbr_masks(n: int, edges: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    pred, succ = [0] * n, [0] * n
    for u, v in edges:
        succ[u] |= 1 << v
        pred[v] |= 1 << u
    return pred, succ


def _step_transition(c: Candidate, backend_of: dict[int, str], covered: int, pred: list[int], succ: list[int], t: Transition) -> float:
    total = 0.0
    inside = c.mask
    for j in c.nodes:
        for k in _bits(pred[j] & covered & ~inside):
            if backend_of[k] != c.backend:
                total += t(backend_of[k], c.backend)
        for k in _bits(succ[j] & covered & ~inside):
            if backend_of[k] != c.backend:
                total += t(c.backend, backend_of[k])
    return total


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def exact_cover(n: int, cands: Sequence[Candidate], costs: Sequence[float], edges: Sequence[tuple[int, int]] = (), transition: Transition | None = None, describe: Callable[[int], str] | None = None) -> Cover:
    """The cheapest exact cover of nodes ``0..n-1`` (see the module docstring). ``edges`` are
    the dataflow edges ``(producer, consumer)``; ``describe(node)`` names a node in errors."""
    if n == 0:
        return Cover((), 0.0)
    t = transition or _no_transition
    pred, succ = _nbr_masks(n, edges)
    nbr = [pred[i] | succ[i] for i in range(n)]
    by_first: list[list[int]] = [[] for _ in range(n)]
    for k, c in enumerate(cands):
        if math.isfinite(costs[k]):
            by_first[c.first].append(k)
    for i in range(n):
        if not by_first[i] and not any(i in cands[k].nodes and math.isfinite(costs[k]) for k in range(len(cands))):
            name = describe(i) if describe else f"node {i}"
            raise UnsupportedError(f"placement: no backend can run {name} (every candidate covering it failed or was refused)")
    full = (1 << n) - 1
    Key = tuple[int, tuple[tuple[int, str], ...]]
    start: Key = (0, ())
    best: dict[Key, float] = {start: 0.0}
    back: dict[Key, tuple[Key, int]] = {}
    tie = itertools.count()
    heap: list[tuple[float, int, Key]] = [(0.0, next(tie), start)]
    states = 0
    while heap:
        d, _, key = heapq.heappop(heap)
        if d > best.get(key, math.inf):
            continue
        covered, frontier = key
        states += 1
        if covered == full:
            chosen: list[int] = []
            while key != start:
                key, k = back[key]
                chosen.append(k)
            return Cover(tuple(reversed(chosen)), d, states)
        first = (~covered & (covered + 1)).bit_length() - 1
        backend_of = dict(frontier)
        for k in by_first[first]:
            c = cands[k]
            mask = c.mask
            if mask & covered:
                continue
            step = costs[k] + _step_transition(c, backend_of, covered, pred, succ, t)
            new_cov = covered | mask
            assigned = {**backend_of, **{j: c.backend for j in c.nodes}}
            new_front = tuple(sorted((j, b) for j, b in assigned.items() if nbr[j] & ~new_cov))
            new_key: Key = (new_cov, new_front)
            nd = d + step
            if nd < best.get(new_key, math.inf):
                best[new_key] = nd
                back[new_key] = (key, k)
                heapq.heappush(heap, (nd, next(tie), new_key))
    name = describe(0) if describe else "the block"
    raise UnsupportedError(f"placement: no exact cover of {name}'s block exists with the candidates given")


def cover_cost(n: int, cands: Sequence[Candidate], costs: Sequence[float], chosen: Sequence[int], edges: Sequence[tuple[int, int]] = (), transition: Transition | None = None) -> float:
    """The cost of the cover ``chosen`` by the definition (candidates plus transitions)."""
    t = transition or _no_transition
    backend = {}
    for k in chosen:
        for j in cands[k].nodes:
            backend[j] = cands[k].backend
    total = sum(costs[k] for k in chosen)
    for u, v in edges:
        if backend[u] != backend[v]:
            total += t(backend[u], backend[v])
    return total


def brute_force(n: int, cands: Sequence[Candidate], costs: Sequence[float], edges: Sequence[tuple[int, int]] = (), transition: Transition | None = None) -> Cover | None:
    """Every exact cover enumerated; the cheapest (None when there is none). Exponential: for
    tests on small graphs."""
    best: Cover | None = None
    full = (1 << n) - 1

    def go(covered: int, chosen: list[int]) -> None:
        nonlocal best
        if covered == full:
            cost = cover_cost(n, cands, costs, chosen, edges, transition)
            if best is None or cost < best.cost:
                best = Cover(tuple(chosen), cost)
            return
        first = (~covered & (covered + 1)).bit_length() - 1
        for k, c in enumerate(cands):
            if first in c.nodes and not (c.mask & covered) and math.isfinite(costs[k]):
                go(covered | c.mask, chosen + [k])

    go(0, [])
    return best


__all__ = ["Cover", "Transition", "exact_cover", "cover_cost", "brute_force"]
