"""Candidates: from the backends' patterns, valid (convex, no taps, bounded), pins, the
codegen fallback."""

from __future__ import annotations

import pytest

from tilework.backend import resolve_backends
from tilework.collage.candidates import BlockShape, block_candidates
from tilework.errors import UnsupportedError
from tilework.pattern.graph import graphs_of

from tests.collage.helpers import diamond, mlp


def _block(mod):  # type: ignore[no-untyped-def]
    return graphs_of("main", mod["main"])[0]


def test_every_binding_has_a_codegen_singleton_and_library_matches_are_closed() -> None:
    g = _block(mlp())
    cands = block_candidates(g, resolve_backends(["blas", "codegen"]))
    singles = {c.nodes for c in cands if c.origin == "fallback"}
    assert singles == {(i,) for i in range(len(g))}
    blas = sorted((c.capability, c.nodes) for c in cands if c.backend == "blas")
    assert blas == [("blas.linear", (0,)), ("blas.linear", (2,))]
    # codegen intervals let fusion be measured: the whole chain is one candidate
    assert any(c.backend == "codegen" and c.nodes == (0, 1, 2) for c in cands)


def test_region_backend_intervals_and_max_size() -> None:
    pytest.importorskip("onnxruntime")
    g = _block(mlp())
    cands = block_candidates(g, resolve_backends(["onnxruntime", "codegen"]), max_size=2)
    ort = {c.nodes for c in cands if c.backend == "onnxruntime"}
    assert {(0, 1), (1, 2)} <= ort
    # the rules' maximal region is kept even above max_size; other intervals are bounded
    assert (0, 1, 2) in ort
    assert all(len(c.nodes) <= 2 for c in cands if c.origin == "interval")


def test_validity_convexity_and_taps() -> None:
    g = _block(diamond())
    shape = BlockShape(g)
    a, b, c, d = 0, 1, 2, 3
    assert not shape.convex((1 << a) | (1 << c))  # a -> b -> c leaves and re-enters
    assert shape.convex((1 << a) | (1 << b) | (1 << c))
    assert shape.has_tap((1 << a) | (1 << b))  # a is read inside (b) and outside (c)
    assert not shape.has_tap((1 << a) | (1 << b) | (1 << c))
    assert not shape.valid((1 << a) | (1 << b) | (1 << c), size_limit=2)
    cands = block_candidates(g, resolve_backends(["codegen"]))
    nodes = {cd.nodes for cd in cands}
    assert (a, b) not in nodes and (a, b, c) in nodes and (c, d) in nodes


def test_pins_restrict_and_name_the_impossible() -> None:
    g = _block(mlp())
    cands = block_candidates(g, resolve_backends(["blas", "codegen"]), pins={"linear": "blas"})
    for c in cands:
        if 0 in c.nodes or 2 in c.nodes:
            assert c.backend == "blas"
    by_var = block_candidates(g, resolve_backends(["blas", "codegen"]), pins={"%up": "blas"})
    assert all(c.backend == "blas" for c in by_var if 0 in c.nodes)
    assert any(c.backend == "codegen" and c.nodes == (2,) for c in by_var)
    with pytest.raises(UnsupportedError, match=r"%act = relu.*pinned to blas"):
        block_candidates(g, resolve_backends(["blas", "codegen"]), pins={"relu": "blas"})
    with pytest.raises(UnsupportedError, match="not among the backends"):
        block_candidates(g, resolve_backends(["codegen"]), pins={"relu": "blas"})


def test_region_functions_lift_weights_so_layers_share_a_measurement() -> None:
    import numpy as np

    from tilework import op
    from tilework.collage.regions import input_arrays, region_function
    from tilework.ir.builder import BlockBuilder
    from tilework.ir.graph import Constant, Var
    from tilework.ir.info import TensorInfo
    from tilework.ir.structural import structural_hash
    from tilework.ir.sym import SymVar

    rng = np.random.default_rng(0)
    n = SymVar("n", 1, 64)
    x = Var("x", TensorInfo((n, 16), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.linear(x, Constant.of(rng.standard_normal((16, 16)).astype("float32"))), name="a")
            b = bb.emit_output(op.linear(a, Constant.of(rng.standard_normal((16, 16)).astype("float32"))), name="b")
        bb.emit_func_output(b)
    g = _block(bb.get())
    f0, f1 = region_function(g, [0]), region_function(g, [1])
    assert [p.name for p in f0.params] == ["x", "tw_weight0"] and [p.name for p in f1.params] == ["a", "tw_weight0"]
    assert structural_hash(f0) == structural_hash(f1)
    arrays = input_arrays(f0, {n: 5})
    assert [a.shape for a in arrays] == [(5, 16), (16, 16)]
