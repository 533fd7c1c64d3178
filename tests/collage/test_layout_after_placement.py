"""Weights laid out after placement: the linears left to tilework's kernels read packed weights
(``linear_io``) under ``backends=[...]`` and under a placement plan, per bucket variant; the
linears offloaded to another backend keep the ``[out, in]`` weight; weight params and weight
constants both; numerics against the model at symbolic row counts 1 and odd ones, saved and
loaded; and the estimator measures codegen regions with the packed weights."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

import tilework as tw
from tilework.backend.offload import OffloadByRules
from tilework.collage import CostCache, MeasuredCostModel, MockCostModel, place
from tilework.collage.place import apply_plan
from tilework.collage.regions import region_function
from tilework.ir.graph import Binding, Call, ExternFunc, GraphFunc, OpRef, bindings_of
from tilework.ir.module import IRModule
from tilework.pattern.graph import graphs_of
from tilework.transform.layout_weights import ATTR, COPIES, LayoutWeights, lay_out, lay_out_weights, packed_shape
from tilework.transform.weight_params import WEIGHTS

from tests.collage.helpers import mlp

torch = pytest.importorskip("torch")
ROWS = (1, 5, 33, 64)


def _ops(f: object) -> list[str]:
    assert isinstance(f, GraphFunc)
    out = []
    for b in bindings_of(f):
        v = b.value
        if isinstance(b, Binding) and isinstance(v, Call) and isinstance(v.callee, OpRef):
            out.append(v.args[0].symbol if v.callee.name == "call_lib" and isinstance(v.args[0], ExternFunc) else v.callee.name)
    return out


def _weights(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype("float32") for s in ((32, 16), (32,), (16, 32))]


def _ref(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    return np.maximum(x @ w1.T + b1, 0) @ w2.T


def test_build_lays_out_only_the_linears_left_to_codegen() -> None:
    mod = mlp()  # main(x, w1, b1, w2), the weights trailing params
    rng = np.random.default_rng(0)
    w = _weights(rng)
    for order, packed in ((("codegen", "blas"), [1, 3]), (("blas", "codegen"), [])):
        laid = LayoutWeights(params=True)(OffloadByRules(order).run(mod))
        ops = _ops(laid["main"])
        assert ops.count("linear_io") == len(packed) and "linear" not in ops
        main = laid["main"]
        assert isinstance(main, GraphFunc) and list(main.attrs.get(ATTR, ())) == packed
        if not packed:  # blas reads the [out, in] weight params as given
            assert main.params[1].info == mod["main"].params[1].info  # type: ignore[union-attr]
        exe = tw.build(mod, backends=list(order), layout_weights="params")
        assert exe.meta.get("weight_layout", {}).get("packed", []) == packed
        fn = tw.VM(exe)["main"]
        given = lay_out_weights(exe.meta.get("weight_layout", {}), w)
        for n in ROWS:
            x = rng.standard_normal((n, 16)).astype("float32")
            np.testing.assert_allclose(fn(x, *given), _ref(x, *w), rtol=1e-4, atol=1e-4)


def test_weight_copies_are_appended_in_the_layout_asked() -> None:
    rng = np.random.default_rng(1)
    w = [rng.standard_normal((40, 3)).astype("float32"), rng.standard_normal((5, 7)).astype("float32")]
    layout = {"num_inputs": 2, "transposed": [3], "packed": [3], "copies": [[2, False, True], [3, True, False]]}
    out = lay_out_weights(layout, w)
    assert len(out) == 4 and out[0] is w[0]
    np.testing.assert_array_equal(out[1], lay_out(w[1].T))
    np.testing.assert_array_equal(out[2], lay_out(w[0]))
    np.testing.assert_array_equal(out[3], w[1].T)


def test_a_saved_layout_keeps_its_panel_width() -> None:
    w = np.arange(40 * 3, dtype="float32").reshape(40, 3)
    out = lay_out_weights({"num_inputs": 0, "packed": [0], "panel": 32}, [w])
    assert out[0].shape == (2, 3, 32)
    np.testing.assert_array_equal(out[0], lay_out(w, 32))


class _Mlp(torch.nn.Module):  # type: ignore[name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(24, 40)
        self.down = torch.nn.Linear(40, 7, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _torch_model() -> tuple[object, tuple[object, ...], tuple[dict[int, object], ...]]:
    torch.manual_seed(0)
    from torch.export import Dim

    return _Mlp().eval(), (torch.randn(3, 24),), ({0: Dim("n", max=64)},)


def _check(cm: tw.CompiledModel, model: object) -> None:
    for n in ROWS:
        x = torch.randn(n, 24)
        np.testing.assert_allclose(cm(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-4, atol=1e-4)  # type: ignore[operator]


def test_compile_with_backends_packs_the_codegen_linears_weights_once() -> None:
    model, args, dims = _torch_model()
    cm = tw.compile(model, args, dims, backends=["codegen", "blas"])
    assert cm.executable.meta["weight_layout"]["packed"] == [1, 3]
    assert [w.shape for w in cm.weights] == [packed_shape(40, 24), (40,), packed_shape(7, 40)]
    _check(cm, model)
    cm = tw.compile(model, args, dims, backends=["blas", "codegen"])  # every linear on blas: [out, in]
    assert "weight_layout" not in cm.executable.meta and [w.shape for w in cm.weights] == [(40, 24), (40,), (7, 40)]
    _check(cm, model)
    cm = tw.compile(model, args, dims, backends=["codegen", "blas"], weights="constants")
    assert cm.weights == [] and "weight_layout" not in cm.executable.meta
    _check(cm, model)


def _by_bucket(c, ops, dims):
    """blas is cheap from n = 9 on, codegen below."""
    if c.backend == "blas":
        return 0.1 * len(ops) if dims["n"] > 8 else 10.0
    return float(len(ops))


def test_a_plan_lays_out_each_variants_codegen_linears(tmp_path: Path) -> None:
    model, args, dims = _torch_model()
    options = {"cost_model": MockCostModel(_by_bucket), "refine": False}
    cm = tw.compile(model, args, dims, placement="auto", backends=["blas", "codegen"], buckets={"n": [1, 64]}, placement_options=options)
    # the small bucket runs the linears on codegen (packed copies), the large on blas ([out, in])
    assert cm.executable.meta["weight_layout"]["copies"] == [[1, False, True], [3, False, True]]
    assert [w.shape for w in cm.weights] == [(40, 24), (40,), (7, 40), packed_shape(40, 24), packed_shape(7, 40)]
    _check(cm, model)
    path = os.path.join(tmp_path, "m.tw")
    cm.save(path)
    _check(tw.CompiledModel.load(path), model)
    # the variants as applied: codegen's linears read packed weights, blas reads the params as given
    assert cm.placement is not None and cm.module is not None
    laid = LayoutWeights(params=True)(apply_plan(cm.module, cm.placement))
    assert _ops(laid["main__p0"]).count("linear_io") == 2 and "linear_io" not in _ops(laid["main__p1"])
    main = laid["main"]
    assert isinstance(main, GraphFunc) and len(main.attrs[COPIES]) == 2 and len(main.params) == 6
    # weight constants: each variant its own
    cm = tw.compile(model, args, dims, placement="auto", backends=["blas", "codegen"], buckets={"n": [1, 64]}, placement_options=options, weights="constants")
    assert cm.weights == []
    _check(cm, model)


def test_a_plan_that_offloads_every_linear_keeps_the_weights_as_given() -> None:
    model, args, dims = _torch_model()
    options = {"cost_model": MockCostModel(lambda c, ops, d: (0.1 if c.backend == "blas" else 1.0) * len(ops)), "refine": False}
    cm = tw.compile(model, args, dims, placement="auto", backends=["blas", "codegen"], buckets={"n": [1, 64]}, placement_options=options)
    assert "weight_layout" not in cm.executable.meta and [w.shape for w in cm.weights] == [(40, 24), (40,), (7, 40)]
    _check(cm, model)


def test_the_estimator_builds_codegen_regions_with_packed_weights(tmp_path: Path) -> None:
    mod = mlp()
    main = mod["main"]
    assert isinstance(main, GraphFunc)
    g = graphs_of("main", main)[0]
    f = region_function(g, [0], weights=frozenset(main.params[1:]))
    assert f.attrs[WEIGHTS] == (1, 2)  # w1 and b1 (b1, read as a bias, stays as it is)
    laid = LayoutWeights(params=True)(IRModule({"c": f}))
    assert _ops(laid["c"]) == ["linear_io"] and laid["c"].attrs[ATTR] == (1,)  # type: ignore[union-attr]
    # the search tells the estimator the model's weights; every candidate builds and runs
    model = MeasuredCostModel(CostCache(str(tmp_path / "c.sqlite")), repeat=3, max_rounds=2, time_limit_s=0.2, progress=False)
    plan = place(mod, ["blas", "codegen"], cost_model=model, buckets={"n": [3]}, max_size=1, refine=False)
    assert model.weights == frozenset(main.params[1:])
    assert model.stats.measured > 0 and model.stats.failed == 0
    assert all(math.isfinite(r.cost_s) for r in plan.buckets[0].rows)
