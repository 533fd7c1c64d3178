"""End-to-end validation of each bucket's plan (``tilework.collage.validate``): with mock region
costs and a mock end-to-end timer (no timing thresholds), the fastest measured plan is kept, a
plan that fails to build falls back, pins hold, the persistent cache serves a second compile;
and, on this machine, a plan that fails to build costs infinity and a second timing is cached."""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Callable

import pytest

from tilework.backend import Backend, Capability, lib_call, register_backend, unregister_backend
from tilework.backend.partition import Placement, RegionSpec
from tilework.collage import CostCache, MeasuredCostModel, MockCostModel, place
from tilework.collage.place import PlacementPlan
from tilework.errors import UnsupportedError
from tilework.pattern import is_op, wildcard

from tests.collage.helpers import mlp


def _cost(c, ops, dims):  # type: ignore[no-untyped-def]
    """blas costs half of codegen per op (the search offloads both linears to it)."""
    return {"codegen": 1.0, "blas": 0.5, "probe": 1.0}[c.backend] * len(ops)


def _timer(table: Callable[[frozenset[tuple[str, str]]], float]):  # type: ignore[no-untyped-def]
    """An end-to-end timer from ``table(regions as {(first var, backend)})``."""

    def time_it(p: Placement, dims: dict[str, int]) -> float:
        return table(frozenset((r.vars[0], r.backend) for r in p.regions))

    return time_it


def _on(p: Placement) -> dict[str, str]:
    return {r.vars[0]: r.backend for r in p.regions}


def test_the_fastest_plan_end_to_end_is_kept_and_every_time_is_in_the_plan() -> None:
    # the search offloads both linears to blas; end to end, codegen alone is faster
    model = MockCostModel(_cost, e2e=_timer(lambda on: 3.0 if not on else 5.0 + len(on)))
    plan = place(mlp(), ["blas", "codegen"], cost_model=model, buckets={"n": [4]})
    b = plan.buckets[0]
    assert b.placement.regions == () and b.measured_s == 3.0
    assert b.chosen_by.startswith("codegen") and b.estimate_s is None and b.rows == ()
    times = {a.label: a.seconds for a in b.alternatives}
    search = next(label for label in times if label.startswith("search"))
    assert times[search] == 7.0 and times["codegen"] == 3.0
    assert model.e2e_calls == len(b.alternatives)  # duplicates (the cover over blas+codegen is the search's) timed once
    # where the search's cover is fastest it is kept, with its rows and estimate
    model = MockCostModel(_cost, e2e=_timer(lambda on: 9.0 - len(on)))
    b = place(mlp(), ["blas", "codegen"], cost_model=model, buckets={"n": [4]}).buckets[0]
    assert _on(b.placement) == {"up": "blas", "out": "blas"} and b.measured_s == 7.0
    assert b.chosen_by.startswith("search") and b.rows and b.estimate_s is not None
    # the alternatives survive the plan's JSON and show in the explanation
    again = PlacementPlan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json() and again.buckets[0].alternatives == plan.buckets[0].alternatives
    assert "end to end, ms: " in plan.table() and "codegen 3000.000" in plan.table()


def test_plans_within_a_few_percent_are_timed_again_head_to_head(tmp_path: Path) -> None:
    """A first timing puts the search's cover (both linears on blas) 2% ahead of codegen
    alone, within one timing's noise: the close plans are timed again together and the second
    timing decides; plans further apart are timed once. The second timing is cached like
    the first: a second placement decides alike and times nothing."""
    counts: dict[str, int] = {}

    def e2e(p: Placement, dims: dict[str, int]) -> float:
        on = _on(p)
        n = counts[repr(sorted(on.items()))] = counts.get(repr(sorted(on.items())), 0) + 1
        if not on:
            return 1.00
        if on == {"up": "blas", "out": "blas"}:
            return 0.98 if n == 1 else 1.03
        return 1.5

    model = MockCostModel(_cost, e2e=e2e, cache=CostCache(str(tmp_path / "c.sqlite")))
    b = place(mlp(), ["blas", "codegen"], cost_model=model, buckets={"n": [4]}).buckets[0]
    assert b.placement.regions == () and b.measured_s == 1.00 and b.chosen_by.startswith("codegen")
    times = {a.label.split(" = ")[0]: a.seconds for a in b.alternatives}
    assert times["search"] == 1.03 and times["codegen"] == 1.00
    assert counts[repr([])] == 2 and counts[repr([("out", "blas"), ("up", "blas")])] == 2
    replay = MockCostModel(_cost, e2e=e2e, cache=CostCache(str(tmp_path / "c.sqlite")))
    assert place(mlp(), ["blas", "codegen"], cost_model=replay, buckets={"n": [4]}).buckets[0].placement == b.placement
    assert replay.e2e_calls == 0
    # 10% apart: each plan is timed once
    far = MockCostModel(_cost, e2e=lambda p, d: 1.10 if p.regions else 1.00)
    assert place(mlp(), ["blas", "codegen"], cost_model=far, buckets={"n": [4]}).buckets[0].placement.regions == ()
    assert far.e2e_calls == 2


@pytest.mark.parametrize("lead, offloaded", [(0.015, False), (0.03, True)])
def test_an_offloading_plan_must_beat_codegen_alone_by_the_margin(lead: float, offloaded: bool) -> None:
    """Head to head, the search's cover (both linears on blas) leads codegen alone by 1.5% or
    3%: within ``OWN_MARGIN`` (2%) tilework's kernels alone are kept, with a note; beyond it
    the cover is."""
    from tilework.collage.validate import OWN_MARGIN

    assert 0.015 < OWN_MARGIN < 0.03
    model = MockCostModel(_cost, e2e=_timer(lambda on: 1.0 if not on else (1.0 / (1 + lead) if len(on) == 2 else 2.0)))
    plan = place(mlp(), ["blas", "codegen"], cost_model=model, buckets={"n": [4]})
    b = plan.buckets[0]
    assert bool(b.placement.regions) is offloaded
    assert b.measured_s == (1.0 / (1 + lead) if offloaded else 1.0)
    margin_notes = [n for n in plan.notes if "within the margin" in n]
    assert bool(margin_notes) is not offloaded
    if margin_notes:
        assert "search was 1.5% faster than codegen" in margin_notes[0]


@pytest.mark.parametrize("lead, evolved", [(0.01, False), (0.05, True)])
def test_an_evolved_plan_must_beat_codegen_alone_by_the_margin_too(lead: float, evolved: bool) -> None:
    """Codegen alone is kept over the search's cover (1.5% behind it); the evolutionary
    refinement then finds %out alone on blas, ``lead`` faster than codegen alone: kept only
    beyond ``OWN_MARGIN``."""

    def e2e(p: Placement, dims: dict[str, int]) -> float:
        on = frozenset(_on(p))
        return {frozenset(): 1.0, frozenset({"up", "out"}): 1.0 / 1.015, frozenset({"out"}): 1.0 / (1 + lead)}.get(on, 2.0)

    model = MockCostModel(_cost, e2e=e2e)
    b = place(mlp(), ["blas", "codegen"], cost_model=model, buckets={"n": [4]}, refine="evolve").buckets[0]
    if evolved:
        assert _on(b.placement) == {"out": "blas"} and b.chosen_by.startswith("evolutionary")
    else:
        assert b.placement.regions == () and b.measured_s == 1.0


def test_a_plan_that_fails_to_build_falls_back() -> None:
    def e2e(p: Placement, dims: dict[str, int]) -> float:
        if any(r.backend == "blas" and r.vars == ("out",) for r in p.regions):
            raise RuntimeError("blas cannot build this")
        return 5.0 - len(p.regions)

    model = MockCostModel(_cost, e2e=e2e)
    b = place(mlp(), ["blas", "codegen"], cost_model=model, buckets={"n": [4]}).buckets[0]
    failed = [a for a in b.alternatives if not math.isfinite(a.seconds)]
    assert failed and all("blas cannot build this" in a.detail for a in failed)
    assert "out" not in _on(b.placement) and math.isfinite(b.measured_s or math.inf)
    # when every plan fails, the search's cover is kept (the compile will say why) with a note
    model = MockCostModel(_cost, e2e=lambda p, d: math.inf)
    plan = place(mlp(), ["blas", "codegen"], cost_model=model, buckets={"n": [4]})
    b = plan.buckets[0]
    assert _on(b.placement) == {"up": "blas", "out": "blas"} and b.measured_s is None
    assert "every plan failed" in b.chosen_by and any("every plan failed" in n for n in plan.notes)


@pytest.fixture
def probe():  # type: ignore[no-untyped-def]
    """A library backend for linear without bias (never built here)."""
    backend = Backend("probe", "library", lambda: (True, "test backend"), [Capability("probe.linear", is_op("linear", wildcard("a"), wildcard("b")))], lower=lambda r: lib_call("probe.linear", [r["a"], r["b"]], r))
    register_backend(backend, replace=True)
    yield backend
    unregister_backend("probe")


@pytest.mark.parametrize("refine", [True, "evolve"])
def test_pins_hold_whatever_end_to_end_prefers(probe: Backend, refine: bool | str) -> None:
    # end to end, fewer regions is faster (codegen alone fastest), but %out is pinned to probe
    model = MockCostModel(_cost, e2e=_timer(lambda on: 1.0 + len(on)))
    plan = place(mlp(), ["probe", "blas", "codegen"], cost_model=model, buckets={"n": [4]}, pins={"%out": "probe"}, refine=refine)
    b = plan.buckets[0]
    assert _on(b.placement).get("out") == "probe"
    assert all("codegen" != a.label for a in b.alternatives)  # codegen alone breaks the pin: not timed
    assert any("breaks the pin %out=probe" in n for n in plan.notes)
    with pytest.raises(UnsupportedError, match="pinned to probe"):
        place(mlp(), ["probe", "codegen"], cost_model=model, pins={"%up": "probe"})


def _mixed_cost(c, ops, dims):  # type: ignore[no-untyped-def]
    if c.backend == "blas" and 2 in c.nodes:
        return 1.5  # blas is slow on %out
    return {"codegen": 1.0, "blas": 0.5, "probe": 0.4}[c.backend] * len(ops)


def test_a_cover_over_codegen_and_one_backend_can_win(probe: Backend) -> None:
    # the search puts %up on blas and %out on probe; end to end, %up alone on blas is fastest:
    # neither the search's cover nor any single-backend plan, but the cover over blas+codegen
    model = MockCostModel(_mixed_cost, e2e=_timer(lambda on: 2.0 if on == {("up", "blas")} else 5.0))
    b = place(mlp(), ["blas", "probe", "codegen"], cost_model=model, buckets={"n": [4]}).buckets[0]
    assert _on(b.placement) == {"up": "blas"} and b.measured_s == 2.0
    assert b.chosen_by.startswith("cover over blas+codegen") and b.rows and b.estimate_s is not None
    times = {a.label: a.seconds for a in b.alternatives}
    assert times["search"] == 5.0 and times["probe by rules = cover over codegen+probe"] == 5.0


def test_the_budget_bounds_the_search(probe: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clock that each region cost advances by a second (9 a bucket here), a budget of
    12 s over 3 buckets (4 s each): the first bucket, past its part once its costs are
    measured, times end to end only its cover and codegen alone (no other single-backend
    plan, no cover over one backend); the second begins within the budget but past its part,
    alike; the third, not begun when the budget is spent, takes codegen alone unmeasured. A
    budget of 30 s (10 a bucket) times every plan of every bucket."""
    clock = [0.0]
    monkeypatch.setattr("time.perf_counter", lambda: clock[0])

    def cost(c, ops, dims):  # type: ignore[no-untyped-def]
        clock[0] += 1.0
        return _mixed_cost(c, ops, dims)

    model = MockCostModel(cost, e2e=_timer(lambda on: 3.0 + len(on)))
    plan = place(mlp(), ["blas", "probe", "codegen"], cost_model=model, buckets={"n": [4, 64, 200]}, budget_s=12.0)
    *begun, last = plan.buckets
    for b in begun:
        assert {a.label.split(" = ")[0] for a in b.alternatives} == {"search", "codegen"}
        assert b.placement.regions == () and b.measured_s == 3.0
    assert last.placement.regions == () and last.measured_s is None and last.alternatives == ()
    assert last.chosen_by.startswith("default (the budget was spent")
    assert any("extra plan(s) not timed" in n for n in plan.notes) and any("spent before bucket n in" in n for n in plan.notes)
    assert "the budget was spent" in plan.table()
    clock[0] = 0.0
    plan = place(mlp(), ["blas", "probe", "codegen"], cost_model=MockCostModel(cost, e2e=_timer(lambda on: 3.0 + len(on))), buckets={"n": [4, 64, 200]}, budget_s=30.0)
    for b in plan.buckets:
        assert {"blas by rules", "probe by rules"} <= {x for a in b.alternatives for x in a.label.split(" = ")}
    assert not any("budget" in n for n in plan.notes)


def test_the_cache_serves_the_second_compile(tmp_path: Path) -> None:
    path = tmp_path / "costs.sqlite"
    table = _timer(lambda on: 3.0 + len(on))
    first = MockCostModel(_cost, e2e=table, cache=CostCache(str(path)))
    one = place(mlp(), ["blas", "codegen"], cost_model=first, buckets={"n": [1, 64]})
    assert first.e2e_calls > 0
    second = MockCostModel(_cost, e2e=table, cache=CostCache(str(path)))
    two = place(mlp(), ["blas", "codegen"], cost_model=second, buckets={"n": [1, 64]})
    assert second.e2e_calls == 0
    assert [(b.placement.to_json(), b.measured_s, b.alternatives) for b in two.buckets] == [(b.placement.to_json(), b.measured_s, b.alternatives) for b in one.buckets]
    # another bucket's dims are another key: measured anew
    third = MockCostModel(_cost, e2e=table, cache=CostCache(str(path)))
    place(mlp(), ["blas", "codegen"], cost_model=third, buckets={"n": [2]})
    assert third.e2e_calls > 0


def _refuse(r: object) -> object:
    raise UnsupportedError("not today")


def test_on_this_machine_a_plan_that_fails_to_build_costs_infinity_and_times_are_cached(tmp_path: Path) -> None:
    register_backend(Backend("e2e_broken", "library", lambda: (True, "t"), [Capability("e2e_broken.relu", is_op("relu", wildcard("x")))], lower=_refuse), replace=True)
    try:
        mod = mlp()
        names = ("e2e_broken", "codegen")
        plans = [Placement((), names), Placement((RegionSpec("e2e_broken", "e2e_broken.relu", ("act",), "main", 0),), names)]
        env = {v: 3 for v in {d for p in mod["main"].params for d in getattr(p.info, "shape", ()) if not isinstance(d, int)}}
        model = MeasuredCostModel(CostCache(str(tmp_path / "c.sqlite")), repeat=3, max_rounds=2, time_limit_s=0.2, progress=False)
        times = model.end_to_end(mod, plans, env)
        assert times is not None and math.isfinite(times[0]) and times[0] > 0 and times[1] == math.inf
        assert "not today" in model.whole.details[plans[1].to_json()]
        assert model.stats.e2e_measured == 2 and model.stats.builds == 1
        other = {v: 5 for v in env}  # another bucket: timed anew, the executable built for the first reused
        assert model.end_to_end(mod, plans[:1], other) is not None and model.stats.builds == 1 and model.stats.e2e_measured == 3
        again = MeasuredCostModel(CostCache(str(tmp_path / "c.sqlite")), repeat=3, max_rounds=2, time_limit_s=0.2, progress=False)
        assert again.end_to_end(mod, plans, env) == times
        assert again.stats.e2e_cache_hits == 2 and again.stats.builds == 0
    finally:
        unregister_backend("e2e_broken")


def test_a_null_function_has_the_regions_params_and_does_nothing() -> None:
    from tilework.collage.regions import null_function, region_function
    from tilework.pattern.graph import graphs_of

    g = graphs_of("main", mlp()["main"])[0]
    f = region_function(g, [0, 1])
    null = null_function(f)
    assert null is not None and [p.info for p in null.params] == [p.info for p in f.params]
    assert null.body.body is null.params[0] and not null.body.blocks


class _Deadlined(MeasuredCostModel):
    """The estimator's budget contract on mock costs: what is asked past ``deadline`` is not
    measured (infinite); region costs advance the fake clock a second each."""

    def __init__(self, clock: list[float], e2e: Callable[[Placement, dict[str, int]], float]) -> None:
        super().__init__(CostCache(":memory:"))
        self.clock = clock
        self.mock = MockCostModel(_mixed_cost, e2e=e2e)

    def region_costs(self, g, cands, env):  # type: ignore[no-untyped-def, override]
        out = []
        for c in cands:
            if self.deadline is not None and self.clock[0] > self.deadline:
                out.append(math.inf)
                continue
            self.clock[0] += 1.0
            out.extend(self.mock.region_costs(g, [c], env))
        return out

    def transition_costs(self, g, cands, costs, env):  # type: ignore[no-untyped-def, override]
        return {}

    def end_to_end(self, mod, placements, env, again=False):  # type: ignore[no-untyped-def, override]
        return self.mock.end_to_end(mod, placements, env, again)


def test_pins_hold_when_the_budget_runs_out(probe: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pin holds in every plan: a bucket past its part of the budget still measures the
    pinned candidates (with its fallback), and a bucket the budget never reached takes
    tilework's kernels with the pinned regions (it took them alone, the pin broken)."""
    clock = [0.0]
    monkeypatch.setattr("time.perf_counter", lambda: clock[0])
    model = _Deadlined(clock, _timer(lambda on: 1.0 + len(on)))
    plan = place(mlp(), ["blas", "probe", "codegen"], cost_model=model, buckets={"n": [4, 64, 200]}, budget_s=2.0, pins={"%out": "probe"})
    first, *rest = plan.buckets
    assert _on(first.placement) == {"out": "probe"} and first.measured_s == 2.0  # measured past its part: the pin's candidate too
    for b in rest:
        assert _on(b.placement) == {"out": "probe"} and b.measured_s is None
        assert b.chosen_by == "default (the budget was spent before this bucket: tilework's kernels alone and the pinned regions, not measured)"
    assert any("spent before bucket n in [" in n and "the 1 bucket(s) before it took" in n for n in plan.notes)


def test_the_setup_does_not_spend_the_budget(probe: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolving the backends and making the candidates (here 50 s on a fake clock) is not
    counted against the budget: the first (only) bucket is measured with its pin (it took
    codegen alone, unmeasured, "the budget was spent before" it); the setup shows in the
    stats and the table."""
    place_module = importlib.import_module("tilework.collage.place")  # the package's place is the function
    clock = [0.0]
    monkeypatch.setattr("time.perf_counter", lambda: clock[0])
    slow = place_module.block_candidates

    def block_candidates(*args, **kwargs):  # type: ignore[no-untyped-def]
        clock[0] += 50.0
        return slow(*args, **kwargs)

    monkeypatch.setattr(place_module, "block_candidates", block_candidates)
    model = _Deadlined(clock, _timer(lambda on: 1.0 + len(on)))
    plan = place(mlp(), ["blas", "probe", "codegen"], cost_model=model, buckets={"n": [4]}, budget_s=2.0, pins={"%out": "probe"})
    (b,) = plan.buckets
    assert _on(b.placement) == {"out": "probe"} and b.measured_s == 2.0
    assert not b.chosen_by.startswith("default")
    assert plan.stats["setup_s"] == 50.0 and "(setup 50.00 s: backends, candidates)" in plan.table()


def test_a_pin_that_matches_nothing_is_named_with_what_there_is(probe: Backend) -> None:
    model = MockCostModel(_cost)
    with pytest.raises(UnsupportedError, match=r"pin matmul=blas matches no binding of @main \(its ops: linear, relu; .*\); did you mean linear\?"):
        place(mlp(), ["blas", "codegen"], cost_model=model, pins={"matmul": "blas"})
    with pytest.raises(UnsupportedError, match=r"pin relux=blas matches no binding .*; did you mean relu\?"):
        place(mlp(), ["blas", "codegen"], cost_model=model, pins={"relux": "blas"})
    with pytest.raises(UnsupportedError, match=r"pin %lv99=probe matches no binding of @main \(its bindings: %up, %act, %out\)"):
        place(mlp(), ["probe", "codegen"], cost_model=model, pins={"%out": "probe", "%lv99": "probe"})
    assert model.calls == 0  # refused before anything is measured


@pytest.mark.parametrize(
    "options, message",
    [
        ({"pins": ["linear"]}, "pins must map op names or %vars to backends"),
        ({"pins": {"linear": 3}}, "pins: 'linear': 3 is not an op name"),
        ({"budget_s": "5"}, "budget_s must be a positive number of seconds, got '5'"),
        ({"budget_s": -1}, "budget_s must be a positive number of seconds, got -1"),
        ({"budget_s": 0}, "budget_s must be a positive number of seconds, got 0"),
        ({"budget_s": math.nan}, "budget_s must be a positive number of seconds, got nan"),
        ({"buckets": [1, 8]}, "buckets must map dim names to their points"),
        ({"buckets": {"n": 8}}, r"buckets\['n'\] must be a non-empty list of integer points"),
        ({"buckets": {"n": ["8"]}}, r"buckets\['n'\] must be a non-empty list of integer points"),
        ({"buckets": {"n": []}}, r"buckets\['n'\] must be a non-empty list of integer points"),
    ],
)
def test_the_search_arguments_are_checked(options: dict[str, object], message: str) -> None:
    import tilework as tw

    model = MockCostModel(_cost)
    with pytest.raises(UnsupportedError, match=message):
        place(mlp(), ["blas", "codegen"], cost_model=model, **options)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedError, match=message):  # the same from tilework.compile, before the model is imported
        tw.compile(mlp(), placement="auto", **options)  # type: ignore[arg-type]
    assert model.calls == 0
