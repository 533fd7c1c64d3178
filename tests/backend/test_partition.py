"""Partitioning by rules and the offload pass, with toy backends defined here: priority,
composites, convex regions (also through other groups), the size bound, reordering around a
region, run-time checks kept, failures that fall back, placements saved and explained."""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import pytest

import tilework
from tests.backend.helpers import close, module, offloaded, rand, run
from tests.transform.util import ir
from tilework import op
from tilework.backend import Backend, Capability, Placement, Region, lib_call, partition_by_rules, register_backend, unregister_backend
from tilework.errors import RuntimeCheckError, UnsupportedError
from tilework.ir.graph import Expr, Tuple, Var, used_vars
from tilework.ir.sym import SymVar
from tilework.pattern import op_call
from tilework.runtime import extern
from tilework.transform import rewrite_driver as drv
from tilework.backend.offload import Offload


def inline(region: Region) -> Expr:
    """The region's outputs recomputed by the same ops (a region 'lowering' that keeps the
    numerics and lets the tests watch the rewriting)."""
    values = {b.var: b.value for b in region.bindings}

    def expr(v: Var) -> Expr:
        inner = {u: expr(u) for u in used_vars(values[v]) if u in values}
        return drv.substitute(values[v], inner)

    outs = [expr(v) for v in region.outputs]
    return outs[0] if len(outs) == 1 else Tuple(tuple(outs))


@pytest.fixture
def toys() -> Iterator[dict[str, Backend]]:
    extern.register_extern("toy.exp", lambda x, out: np.exp(x, out=out), override=True)
    made = {
        "toyregion": Backend("toyregion", "region", lambda: (True, "toy"), [Capability("toy.ew", op_call(("exp", "tanh", "add", "multiply")))], lower=inline),
        "toylib": Backend("toylib", "library", lambda: (True, "toy"), [Capability("toy.exp", op_call("exp"))], lower=lambda r: lib_call("toy.exp", [r.calls[0].args[0]], r)),
        "toyrelu": Backend("toyrelu", "library", lambda: (True, "toy"), [Capability("toy.relu", op_call("relu"))], lower=inline),
    }
    for b in made.values():
        register_backend(b, replace=True)
    yield made
    for name in made:
        unregister_backend(name)


def test_priority_order_decides() -> None:
    n = SymVar("n", 1)
    mod = module([("x", (n, 8), "float32"), ("w", (4, 8), "float32")], op.linear)
    assert offloaded(mod, ["codegen", "blas"]) == {}
    assert offloaded(mod, ["blas", "codegen"]) == {"blas.f32.linear": 1}
    assert partition_by_rules(mod, "torch,blas,codegen").regions[0].backend == "torch"


def test_regions_stay_convex_even_through_other_groups(toys: dict[str, Backend]) -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n, 4), "float32")):
            n = sym(lo=1)
            with dataflow():
                a = exp(x)
                b = relu(a)
                c = add(a, b)
                d = tanh(c)
                output(d)
            return d
        """
    )
    # a -> b -> c leaves {a, c} and re-enters it, whether b is unclaimed or in a library group
    for backends in (["toyregion", "codegen"], ["toyregion", "toyrelu", "codegen"]):
        regions = [r.vars for r in partition_by_rules(mod, backends).regions if r.backend == "toyregion"]
        assert regions == [("a",), ("c", "d")]
    x = rand(np.random.default_rng(0), (3, 4))
    a = np.exp(x)
    close(run(mod, ["toyregion", "toyrelu", "codegen"], [x]), np.tanh(a + np.maximum(a, 0)))


def test_region_size_is_bounded(toys: dict[str, Backend]) -> None:
    small = dataclasses.replace(toys["toyregion"], name="toysmall", max_region_size=2)
    register_backend(small)
    try:
        n = SymVar("n", 1)
        mod = module([("x", (n, 4), "float32")], lambda x: op.tanh(op.exp(op.tanh(op.exp(op.tanh(x))))))
        sizes = [len(r.vars) for r in partition_by_rules(mod, ["toysmall"]).regions]
        assert sum(sizes) == 5 and max(sizes) == 2
    finally:
        unregister_backend("toysmall")


def test_a_region_output_read_in_between_moves_its_reader(toys: dict[str, Backend]) -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n, 4), "float32")):
            n = sym(lo=1)
            with dataflow():
                a = exp(x)
                side = relu(a)
                b = tanh(a)
                c = multiply(side, b)
                output(c)
            return c
        """
    )
    placement = partition_by_rules(mod, ["toyregion", "codegen"])
    # {a, b, c} would not be convex (a -> side -> c): {a, b} and {c}; side now reads a's output
    assert [r.vars for r in placement.regions] == [("a", "b"), ("c",)]
    out = Offload(placement)(mod)
    tilework.verify(out)
    x = rand(np.random.default_rng(1), (2, 4))
    close(run(mod, ["toyregion", "codegen"], [x]), np.maximum(np.exp(x), 0) * np.tanh(np.exp(x)))


def test_offloaded_ops_keep_their_run_time_checks(toys: dict[str, Backend]) -> None:
    n, m = SymVar("n", 1), SymVar("m", 1)
    mod = module([("a", (n, 4), "float32"), ("b", (m, 4), "float32")], lambda a, b: op.exp(op.add(a, b)))
    placement = partition_by_rules(mod, ["toyregion"])
    assert len(placement.regions) == 1
    assert "assert_dims" in str(Offload(placement)(mod))
    exe = tilework.build(mod, backends=["toyregion"])
    vm = tilework.VM(exe)
    a, b = rand(np.random.default_rng(2), (3, 4)), rand(np.random.default_rng(3), (1, 4))
    close(vm["main"](a, b), np.exp(a + b))
    with pytest.raises(RuntimeCheckError):
        vm["main"](a, rand(np.random.default_rng(3), (2, 4)))


def test_a_failing_lowering_falls_back_with_a_warning(toys: dict[str, Backend]) -> None:
    def refuse(region: Region) -> Expr:
        raise UnsupportedError("not today")

    register_backend(Backend("toyfail", "library", lambda: (True, "toy"), [Capability("x", op_call("exp"))], lower=refuse))
    try:
        n = SymVar("n", 1)
        mod = module([("x", (n,), "float32")], op.exp)
        with pytest.warns(UserWarning, match="not today"):
            exe = tilework.build(mod, backends=["toyfail", "codegen"])
        x = rand(np.random.default_rng(4), (5,))
        close(tilework.VM(exe)["main"](x), np.exp(x))
    finally:
        unregister_backend("toyfail")


def test_a_failing_predicate_refuses_the_match_and_is_noted() -> None:
    def broken(m: object) -> bool:
        raise ValueError("bad predicate")

    register_backend(Backend("toybroken", "library", lambda: (True, "toy"), [Capability("x", op_call("exp"), broken)], lower=inline))
    try:
        mod = module([("x", (SymVar("n", 1),), "float32")], op.exp)
        placement = partition_by_rules(mod, ["toybroken", "codegen"])
        assert placement.regions == () and "bad predicate" in placement.notes[0]
    finally:
        unregister_backend("toybroken")


def test_placements_save_load_and_explain(toys: dict[str, Backend]) -> None:
    n = SymVar("n", 1)
    mod = module([("x", (n, 8), "float32"), ("w", (4, 8), "float32")], lambda x, w: op.exp(op.linear(x, w)))
    placement = partition_by_rules(mod, ["blas", "toylib", "codegen"])
    back = Placement.from_json(placement.to_json())
    assert back == placement and back.counts() == {"blas": 1, "toylib": 1}
    table = placement.table(mod)
    assert "blas.linear" in table and "toy.exp" in table and "linear" in table
    x, w = rand(np.random.default_rng(5), (3, 8)), rand(np.random.default_rng(6), (4, 8))
    exe = tilework.build(mod, passes=[Offload(back)])
    close(tilework.VM(exe)["main"](x, w), np.exp(x @ w.T))


def test_a_placement_for_another_module_is_refused() -> None:
    from tilework.backend import RegionSpec
    from tilework.errors import WellFormedError

    mod = module([("x", (SymVar("n", 1),), "float32")], op.exp)
    with pytest.raises(WellFormedError, match="does not bind"):
        Offload(Placement((RegionSpec("blas", "blas.linear", ("nope",)),), ("blas",)))(mod)


def test_unknown_unavailable_and_malformed_backends() -> None:
    mod = module([("x", (SymVar("n", 1),), "float32")], op.exp)
    with pytest.raises(UnsupportedError, match="unknown backend 'nope'"):
        tilework.build(mod, backends=["nope"])
    register_backend(Backend("toygone", "library", lambda: (False, "its library is not installed"), [], lower=inline))
    try:
        with pytest.raises(UnsupportedError, match="its library is not installed"):
            tilework.build(mod, backends="toygone,codegen")
        with pytest.raises(UnsupportedError, match="registered already"):
            register_backend(Backend("toygone", "library", lambda: (True, ""), []))
    finally:
        unregister_backend("toygone")
    with pytest.raises(UnsupportedError, match="kind"):
        Backend("bad", "compiler", lambda: (True, ""))
    with pytest.raises(UnsupportedError, match="unique"):
        Backend("bad", "library", lambda: (True, ""), [Capability("c", op_call("exp")), Capability("c", op_call("exp"))])
    with pytest.raises(UnsupportedError, match="needs a lowering"):
        Backend("bad", "region", lambda: (True, ""))
