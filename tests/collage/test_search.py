"""The exact-cover search against brute force on small random graphs (mock costs), and the
whole placement with a mock cost model: pins, failing backends, per-bucket dispatch."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

import tilework as tw
from tilework.backend import Backend, Capability, lib_call, register_backend, unregister_backend
from tilework.collage import MockCostModel, apply_plan, place
from tilework.collage.candidates import BlockShape, Candidate
from tilework.collage.place import PlacementPlan
from tilework.collage.search import brute_force, cover_cost, exact_cover
from tilework.errors import UnsupportedError
from tilework.pattern import is_op, wildcard
from tilework.runtime.extern import register_extern

from tests.collage.helpers import mlp

BACKENDS = ("codegen", "a", "b")


class _Graph:
    """A random DAG over nodes 0..n-1 (edges go forward) with the validity facts."""

    def __init__(self, rng: random.Random, n: int) -> None:
        self.n = n
        self.succ: list[list[int]] = [[] for _ in range(n)]
        self.edges = []
        for v in range(1, n):
            for u in rng.sample(range(v), k=min(v, rng.randint(1, 2))):
                self.succ[u].append(v)
                self.edges.append((u, v))

    def convex(self, nodes: tuple[int, ...]) -> bool:
        inside = set(nodes)
        down = [set() for _ in range(self.n)]
        for i in range(self.n - 1, -1, -1):
            for s in self.succ[i]:
                down[i] |= {s} | down[s]
        out = set().union(*[down[i] for i in nodes]) - inside
        return not any(down[x] & inside for x in out)


def _random_problem(seed: int) -> tuple[_Graph, list[Candidate], list[float], dict[tuple[str, str], float]]:
    rng = random.Random(seed)
    g = _Graph(rng, rng.randint(3, 7))
    cands: list[Candidate] = [Candidate("codegen", None, (i,), "fallback") for i in range(g.n)]
    costs = [rng.uniform(1, 10) for _ in range(g.n)]
    for _ in range(rng.randint(3, 12)):
        size = rng.randint(1, 3)
        nodes = tuple(sorted(rng.sample(range(g.n), k=min(size, g.n))))
        if not g.convex(nodes):
            continue
        backend = rng.choice(BACKENDS)
        cands.append(Candidate(backend, None, nodes, "match"))
        costs.append(math.inf if rng.random() < 0.15 else rng.uniform(0.5, 6 * len(nodes)))
    trans = {(x, y): rng.uniform(0, 3) for x in BACKENDS for y in BACKENDS if x != y}
    return g, cands, costs, trans


@pytest.mark.parametrize("seed", range(60))
def test_exact_cover_matches_brute_force(seed: int) -> None:
    g, cands, costs, trans = _random_problem(seed)
    t = lambda a, b: trans[(a, b)]  # noqa: E731
    found = exact_cover(g.n, cands, costs, g.edges, t)
    best = brute_force(g.n, cands, costs, g.edges, t)
    assert best is not None
    assert found.cost == pytest.approx(best.cost)
    # the cover is exact, uses only finite candidates, and its cost is what it claims
    covered = sorted(i for k in found.chosen for i in cands[k].nodes)
    assert covered == list(range(g.n))
    assert all(math.isfinite(costs[k]) for k in found.chosen)
    assert cover_cost(g.n, cands, costs, found.chosen, g.edges, t) == pytest.approx(found.cost)


def test_transition_costs_change_the_choice() -> None:
    # a -> b -> c; backend "x" is cheaper per node but switching to and from it costs
    cands = [Candidate("codegen", None, (i,), "fallback") for i in range(3)] + [Candidate("x", None, (1,), "match")]
    costs = [1.0, 1.0, 1.0, 0.5]
    edges = [(0, 1), (1, 2)]
    assert 3 in exact_cover(3, cands, costs, edges).chosen
    assert 3 not in exact_cover(3, cands, costs, edges, lambda a, b: 0.4).chosen


def test_a_node_nothing_can_run_is_named() -> None:
    cands = [Candidate("codegen", None, (0,), "fallback"), Candidate("x", None, (1,), "match")]
    with pytest.raises(UnsupportedError, match="no backend can run %y"):
        exact_cover(2, cands, [1.0, math.inf], [(0, 1)], describe=lambda i: "%y")


def test_block_shape_agrees_with_the_random_graphs() -> None:
    from tilework.pattern.graph import graphs_of

    from tests.collage.helpers import diamond

    g = graphs_of("main", diamond()["main"])[0]
    shape = BlockShape(g)
    assert shape.down[0] == 0b1110 and shape.down[3] == 0


# -- the whole placement with a mock cost model -----------------------------------------------------

CALLS: list[str] = []


def _count(name: str):  # type: ignore[no-untyped-def]
    def run(a, b, out):  # type: ignore[no-untyped-def]
        CALLS.append(name)
        np.matmul(a, b.T, out=out)

    return run


@pytest.fixture
def probe_backend():  # type: ignore[no-untyped-def]
    """A library backend that runs linear without bias and records its calls."""
    register_extern("probe.linear", _count("probe"), override=True)
    backend = Backend(
        "probe",
        "library",
        lambda: (True, "test backend"),
        [Capability("probe.linear", is_op("linear", wildcard("a"), wildcard("b")))],
        lower=lambda r: lib_call("probe.linear", [r["a"], r["b"]], r),
    )
    register_backend(backend, replace=True)
    CALLS.clear()
    yield backend
    unregister_backend("probe")


def test_place_respects_failures_and_pins(probe_backend: Backend) -> None:
    mod = mlp()

    def cost(c, ops, dims):  # type: ignore[no-untyped-def]
        if c.backend == "probe":
            return math.inf  # the backend fails: never chosen
        return {"codegen": 1.0, "blas": 0.5}[c.backend] * len(ops)

    plan = place(mod, ["probe", "blas", "codegen"], cost_model=MockCostModel(cost), buckets={"n": [1]})
    used = {r.backend for b in plan.buckets for r in b.placement.regions}
    assert used == {"blas"}
    pinned = place(mod, ["probe", "blas", "codegen"], cost_model=MockCostModel(lambda c, o, d: 1.0 if c.backend == "probe" else cost(c, o, d)), buckets={"n": [1]}, pins={"%out": "probe"})
    regions = {r.vars: r.backend for r in pinned.buckets[0].placement.regions}
    assert regions[("out",)] == "probe" and regions[("up",)] == "blas"
    with pytest.raises(UnsupportedError, match="pinned to probe"):
        place(mod, ["probe", "codegen"], cost_model=MockCostModel(cost), pins={"%up": "probe"})  # linear with bias


def test_buckets_dispatch_at_run_time_in_one_executable(probe_backend: Backend) -> None:
    mod = mlp()

    def cost(c, ops, dims):  # type: ignore[no-untyped-def]
        small = dims["n"] <= 8
        if c.backend == "probe":
            return 0.1 if small else 10.0
        return 1.0 * len(ops)

    plan = place(mod, ["probe", "codegen"], cost_model=MockCostModel(cost), buckets={"n": [1, 64]})
    assert [b.bucket.ranges for b in plan.buckets] == [(("n", 1, 8),), (("n", 9, 256),)]
    assert [len(b.placement.regions) for b in plan.buckets] == [1, 0]
    exe = tw.build(apply_plan(mod, plan), passes=[])
    vm = tw.VM(exe)
    rng = np.random.default_rng(0)
    w1, b1, w2 = (rng.standard_normal(s).astype("float32") for s in ((32, 16), (32,), (16, 32)))
    for n, expect in ((1, ["probe"]), (8, ["probe"]), (9, []), (200, [])):
        x = rng.standard_normal((n, 16)).astype("float32")
        CALLS.clear()
        out = vm["main"](x, w1, b1, w2)
        assert CALLS == expect, n
        np.testing.assert_allclose(out, np.maximum(x @ w1.T + b1, 0) @ w2.T, rtol=1e-4, atol=1e-4)
    # the plan is data: saved and loaded, it applies the same way
    again = PlacementPlan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json()
    assert "variant 0" in plan.table() and "probe" in plan.table()


class _NonAdditive(MockCostModel):
    """Mock costs per op; end to end, offloading ``up`` without ``out`` is slow (a made-up
    interaction the additive search cannot see)."""

    def end_to_end(self, mod, placements, env, again=False):  # type: ignore[no-untyped-def, override]
        out = []
        for p in placements:
            on = {r.vars[0] for r in p.regions}
            out.append(10.0 - 3.0 * len(on) + (20.0 if on == {"up"} else 0.0) + (25.0 if on == {"up", "out"} else 0.0))
        return out


def test_evolutionary_refinement_finds_what_the_additive_search_cannot() -> None:
    mod = mlp()
    model = _NonAdditive(lambda c, ops, dims: (0.5 if c.backend == "blas" else 1.0) * len(ops))
    plan = place(mod, ["blas", "codegen"], cost_model=model, buckets={"n": [4]}, refine="evolve")
    b = plan.buckets[0]
    # the search offloads both linears (end to end 29); keeping only %out offloaded gives 7
    assert {r.vars for r in b.placement.regions} == {("out",)}
    assert b.measured_s == 7.0 and b.chosen_by.startswith("evolutionary")
    with pytest.raises(UnsupportedError, match="refine must be"):
        place(mod, ["blas", "codegen"], cost_model=model, refine="yes")
