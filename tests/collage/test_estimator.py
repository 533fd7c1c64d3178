"""The estimator on this machine (small and bounded): regions built and run, failures cost
infinity, transitions measured, everything through the persistent cache; the compile surface."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import tilework as tw
from tilework.backend import Backend, Capability, lib_call, register_backend, resolve_backends, unregister_backend
from tilework.collage import CostCache, MeasuredCostModel, MockCostModel, place
from tilework.collage.candidates import block_candidates
from tilework.collage.place import PlacementPlan
from tilework.errors import UnsupportedError
from tilework.pattern import is_op, wildcard
from tilework.pattern.graph import graphs_of
from tilework.runtime.extern import register_extern
from tilework.transform.pipeline import Pipeline, graph_passes

from tests.collage.helpers import mlp, mlp_constants


def _weights(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype("float32") for s in ((32, 16), (32,), (16, 32))]


def _ref(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    return np.maximum(x @ w1.T + b1, 0) @ w2.T


def _model(path: Path, **kw: object) -> MeasuredCostModel:
    return MeasuredCostModel(CostCache(str(path)), repeat=3, max_rounds=2, time_limit_s=0.2, progress=False, **kw)  # type: ignore[arg-type]


def test_measured_placement_runs_and_a_second_search_is_served_from_the_cache(tmp_path: Path) -> None:
    mod = mlp()
    first = _model(tmp_path / "c.sqlite")
    exe = tw.build(mod, placement="auto", backends=["blas", "codegen"], placement_options={"cost_model": first, "buckets": {"n": [4]}})
    assert first.stats.measured > 0 and first.stats.failed == 0
    plan = PlacementPlan.from_dict(exe.meta["placement"])
    rows = plan.buckets[0].rows
    assert rows and all(math.isfinite(r.cost_s) and r.cost_s >= 0 for r in rows)
    rng = np.random.default_rng(0)
    w = _weights(rng)
    for n in (1, 4, 37):
        x = rng.standard_normal((n, 16)).astype("float32")
        np.testing.assert_allclose(tw.VM(exe)["main"](x, *w), _ref(x, *w), rtol=1e-4, atol=1e-4)
    second = _model(tmp_path / "c.sqlite")
    again = place(mod, ["blas", "codegen"], cost_model=second, buckets={"n": [4]})
    assert second.stats.measured == 0 and second.stats.cache_hits > 0
    assert again.buckets[0].placement.to_json() == plan.buckets[0].placement.to_json()


def _fails(*args: object) -> None:
    raise RuntimeError("this library is broken")


@pytest.fixture
def broken_backends():  # type: ignore[no-untyped-def]
    """``broken_run`` lowers but its extern raises; ``broken_lower`` refuses to lower."""
    register_extern("broken.run", _fails, override=True)
    pat = is_op("relu", wildcard("x"))

    def refuse(r: object) -> object:
        raise UnsupportedError("not today")

    register_backend(Backend("broken_run", "library", lambda: (True, "t"), [Capability("broken_run.relu", pat)], lower=lambda r: lib_call("broken.run", [r["x"]], r)), replace=True)
    register_backend(Backend("broken_lower", "library", lambda: (True, "t"), [Capability("broken_lower.relu", pat)], lower=refuse), replace=True)
    yield
    unregister_backend("broken_run")
    unregister_backend("broken_lower")


def test_a_backend_that_fails_costs_infinity_and_is_never_chosen(tmp_path: Path, broken_backends: None) -> None:
    mod = mlp()
    g = graphs_of("main", mod["main"])[0]
    model = _model(tmp_path / "c.sqlite")
    cands = block_candidates(g, resolve_backends(["broken_run", "broken_lower", "codegen"]), max_size=1)
    costs = model.region_costs(g, cands, {})
    by = {c.backend: cost for c, cost in zip(cands, costs) if c.nodes == (1,)}
    assert by["broken_run"] == math.inf and by["broken_lower"] == math.inf and math.isfinite(by["codegen"])
    plan = place(mod, ["broken_run", "broken_lower", "codegen"], cost_model=model, buckets={"n": [2]}, max_size=1, refine=False)
    assert all(not b.placement.regions for b in plan.buckets)


def test_transitions_are_measured_between_backends(tmp_path: Path) -> None:
    g = graphs_of("main", mlp()["main"])[0]
    model = _model(tmp_path / "c.sqlite")
    cands = block_candidates(g, resolve_backends(["blas", "codegen"]), max_size=1)
    costs = model.region_costs(g, cands, {})
    trans = model.transition_costs(g, cands, costs, {})
    assert set(trans) == {("blas", "codegen"), ("codegen", "blas")}
    assert all(t >= 0 and math.isfinite(t) for t in trans.values())


def test_compile_with_a_plan_explains_and_keeps_it(tmp_path: Path) -> None:
    mod, w = mlp_constants()
    optimized = Pipeline(graph_passes())(mod)  # what compile places: the plan names its bindings
    mock = MockCostModel(lambda c, ops, dims: 0.5 if c.backend == "blas" else 1.0)
    plan = place(optimized, ["blas", "codegen"], cost_model=mock, buckets={"n": [1, 64]})
    cm = tw.compile(mod, placement=plan)
    text = cm.explain()
    assert "placed automatically" in text and "blas" in text and "bucket n in [1, 8]" in text
    path = str(tmp_path / "m.tw")
    cm.save(path)
    loaded = tw.CompiledModel.load(path)
    assert loaded.placement is not None and loaded.placement.to_json() == plan.to_json()
    x = np.random.default_rng(1).standard_normal((3, 16)).astype("float32")
    np.testing.assert_allclose(loaded(x), _ref(x, *w), rtol=1e-4, atol=1e-4)
    with pytest.raises(UnsupportedError, match="no such placement file"):
        tw.compile(mod, placement=str(tmp_path / "missing.json"))


def test_a_region_whose_dims_no_input_gives_gets_them_as_a_shape(tmp_path: Path) -> None:
    from tilework import op
    from tilework.collage.regions import region_function
    from tilework.ir.builder import BlockBuilder
    from tilework.ir.graph import Var
    from tilework.ir.info import ShapeInfo, TensorInfo
    from tilework.ir.sym import SymVar

    b, s = SymVar("b", 1, 8), SymVar("s", 1, 64)
    x = Var("x", TensorInfo((b, s, 4), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            flat = bb.emit(op.reshape(x, (b * s, 4)), name="flat")
            r = bb.emit(op.relu(flat), name="r")
            y = bb.emit_output(op.reshape(r, (b, s, 4)), name="y")
        bb.emit_func_output(y)
    g = graphs_of("main", bb.get()["main"])[0]
    f = region_function(g, [2])
    assert f.params[-1].name == "tw_dims" and f.params[-1].info == ShapeInfo((b, s))
    cands = block_candidates(g, resolve_backends(["codegen"]), max_size=1)
    costs = _model(tmp_path / "c.sqlite").region_costs(g, cands, {b: 2, s: 3})
    assert all(math.isfinite(c) for c in costs)


def test_a_whole_placement_is_timed_after_warm_calls_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bursts: each timed repeat of a placement follows untimed calls of the same placement
    lasting BURST_WARM_S, at least one and at most BURST_WARM_CALLS (so its weights are back in
    the caches after the other placements ran), round-robin over the placements; without
    ``burst`` none."""
    import time

    from tilework.collage import cost

    calls: list[str] = []

    def fn(name: str):  # type: ignore[no-untyped-def]
        def run() -> None:
            calls.append(name)
            time.sleep(0.001)

        return run

    model = MeasuredCostModel(None, repeat=2, max_rounds=1, min_repeat_s=1e-4)
    for burst, warm, warm_s in ((True, cost.BURST_WARM_CALLS, 1.0), (True, 1, 1e-5), (False, 0, 1.0)):
        monkeypatch.setattr(cost, "BURST_WARM_S", warm_s)  # 1.0: the cap on ~1 ms calls; 1e-5: less than one call, which is still made
        calls.clear()
        entries = model._time_many([fn("a"), fn("b")], limit=1.0, burst=burst)
        assert all(math.isfinite(e.seconds) for e in entries)
        assert calls[:6] == ["a"] * 3 + ["b"] * 3  # first call, second, and the one that sizes a repeat
        assert calls[6:] == (["a"] * (warm + 1) + ["b"] * (warm + 1)) * 2, (burst, calls)


def test_a_plan_of_our_kernels_alone_waits_for_other_runtimes_to_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole plan that runs tilework's kernels alone, timed right after a plan that loads
    another runtime, waits POOL_SETTLE_S first (that runtime's workers may still spin on the
    cores: OpenBLAS's for about 70 ms); after a plan of its kind, or between two plans that
    load other runtimes, no wait."""
    from tilework.collage import cost

    events: list[str] = []

    def fn(name: str):  # type: ignore[no-untyped-def]
        return lambda: events.append(name)

    monkeypatch.setattr(cost.time, "sleep", lambda s: events.append(f"sleep {s}"))
    monkeypatch.setattr(cost, "BURST_WARM_S", 1e-9)  # one untimed call before each timed repeat
    model = MeasuredCostModel(None, repeat=2, max_rounds=1, min_repeat_s=1e-9)
    model._time_many([fn("own"), fn("blas"), fn("torch")], limit=1.0, burst=True, own=[True, False, False])
    timed = events[9:]  # after the three calls each function gets before the rounds
    settle = f"sleep {cost.POOL_SETTLE_S}"
    # a repeat: (the wait,) an untimed call and a timed one (one call is long enough here)
    assert timed == ["own", "own", "blas", "blas", "torch", "torch", settle, "own", "own", "blas", "blas", "torch", "torch"]
