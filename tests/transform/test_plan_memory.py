"""plan_memory: lifetimes through aliases, views and If branches; symbolic packing with bounds.

Every plan is checked by brute force: at several shapes within the dims' ranges, tensors
whose lifetimes overlap must occupy disjoint, 64-byte aligned byte ranges inside their arena
(and a static arena's capacity must hold the arena at every such shape).
"""

from __future__ import annotations

import itertools

import pytest

import tilework as tw
from tilework import op
from tilework.transform.pipeline import lowering_through
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Binding, Call, GraphFunc, OpRef, Var, bindings_of
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.ir.structural import structural_equal
from tilework.models.reference import EncoderConfig, TransformerConfig, encoder, transformer_block
from tilework.text import parse, print_module
from tilework.transform.pipeline import Pipeline
from tilework.transform.plan_memory import FunctionPlan, PlanMemory, plan_function
from tilework.transform.rewrite_reshape_to_view import RewriteReshapeToView

SMALL = TransformerConfig(layers=2, hidden=32, heads=4, ffn=64)


def lower_calls(mod: IRModule, views: bool = False) -> IRModule:
    """``mod`` lowered up to (and including) lower_calls: what plan_memory receives."""
    return Pipeline(lowering_through("lower_calls", kernel=[RewriteReshapeToView()] if views else []))(mod)


def _in_place_groups(plan: FunctionPlan) -> dict[str, str]:
    group = {pl.name: pl.name for pl in plan.placements}

    def root(x: str) -> str:
        while group[x] != x:
            x = group[x]
        return x

    for i, o in plan.in_place:
        group[root(o)] = root(i)
    return {name: root(name) for name in group}


def assert_valid(plan: FunctionPlan, envs: list[dict[sym.SymVar, int]]) -> None:
    """Tensors live at once never overlap (an elementwise output written over its input, as
    ``in_place`` lists, shares the input's exact bytes)."""
    group = _in_place_groups(plan)
    by_arena: dict[str, list] = {}
    for pl in plan.placements:
        by_arena.setdefault(pl.arena, []).append(pl)
    for env in envs:
        sizes = {"static": sym_walk.evaluate(plan.static_size, env), "pooled": sym_walk.evaluate(plan.pooled_size, env)}
        assert sizes["static"] <= plan.static_capacity
        for arena, pls in by_arena.items():
            spans = [(pl, sym_walk.evaluate(pl.offset, env), sym_walk.evaluate(pl.nbytes, env)) for pl in pls]
            for pl, off, n in spans:
                assert off % 64 == 0 and 0 <= off and off + n <= sizes[arena], (pl, env)
            for (a, oa, na), (b, ob, nb) in itertools.combinations(spans, 2):
                if a.start <= b.end and b.start <= a.end and na and nb:
                    if group[a.name] == group[b.name]:
                        assert oa == ob and na == nb
                        continue
                    assert oa + na <= ob or ob + nb <= oa, f"{a.name} and {b.name} overlap at {env}"


def envs_for(*dims: sym.SymVar) -> list[dict[sym.SymVar, int]]:
    values = []
    for d in dims:
        hi = d.hi if d.hi is not None else 1000
        values.append(sorted(v for v in {max(d.lo, 1), 2, 3, 17, hi} if d.lo <= v <= hi))
    return [dict(zip(dims, combo)) for combo in itertools.product(*values)]


def by_name(plan: FunctionPlan, name: str):  # type: ignore[no-untyped-def]
    (pl,) = [pl for pl in plan.placements if pl.name == name]
    return pl


def test_unbounded_dims_pack_into_a_pooled_arena() -> None:
    batch, seq = tw.dim("batch"), tw.dim("seq")
    low = lower_calls(transformer_block(SMALL, batch, seq))
    plan = plan_function(low, "main")
    assert {pl.arena for pl in plan.placements} == {"pooled"} and plan.static_capacity == 0
    assert_valid(plan, envs_for(batch, seq))
    # every intermediate but the returned one is planned; the arena is far below their sum
    assert plan.unplanned == ("l1_res2",)
    env = {batch: 8, seq: 256}
    total = sum(sym_walk.evaluate(pl.nbytes, env) for pl in plan.placements)
    assert sym_walk.evaluate(plan.pooled_size, env) * 4 < total
    assert set(sym_walk.free_vars(plan.pooled_size)) == {batch, seq}


def test_bounded_dims_pack_into_a_static_arena() -> None:
    cfg = EncoderConfig(layers=2, hidden=32, heads=4, ffn=64)
    mod = encoder(cfg)
    batch, seq = mod["main"].params[0].info.shape[:2]  # type: ignore[union-attr]
    plan = plan_function(lower_calls(mod), "main")
    assert {pl.arena for pl in plan.placements} == {"static"}
    assert plan.pooled_size == 0
    assert plan.static_capacity == sym_walk.evaluate(plan.static_size, {batch: 64, seq: 512})
    assert_valid(plan, envs_for(batch, seq))
    # a smaller shape uses a compact prefix: the size is a dim, not the capacity
    assert sym_walk.evaluate(plan.static_size, {batch: 1, seq: 8}) * 1000 < plan.static_capacity


def test_recursive_functions_and_huge_bounds_get_no_static_arena() -> None:
    mod = lower_calls(encoder(EncoderConfig(layers=1, hidden=32, heads=4, ffn=64)))
    assert plan_function(mod, "main").static_capacity > 10**6
    for plan in (plan_function(mod, "main", recursive=True), plan_function(mod, "main", static_limit=10**6)):
        assert plan.placements and {pl.arena for pl in plan.placements} == {"pooled"}
        assert plan.static_capacity == 0 and plan.pooled_size != 0


def test_views_keep_their_source_alive() -> None:
    batch, seq = tw.dim("batch", max=16), tw.dim("seq", max=128)
    low = lower_calls(transformer_block(SMALL, batch, seq), views=True)
    main = low["main"]
    assert isinstance(main, GraphFunc) and any(_is_view(b) for b in bindings_of(main))
    plan = plan_function(low, "main")
    q, k, v = (by_name(plan, f"l0_{p}") for p in "qkv")
    # q is read (through its view) by attention, after k and v are allocated
    assert q.end > v.start and k.end > v.start
    assert_valid(plan, envs_for(batch, seq))


def _is_view(b: object) -> bool:
    return isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef) and b.value.callee.name == "vm_view"


def test_elementwise_kernels_write_over_a_dying_input() -> None:
    low = lower_calls(transformer_block(SMALL))
    plan = plan_function(low, "main")
    pairs = set(plan.in_place)
    assert ("lv0", "l0_mlp_up") in pairs  # gelu over the matmul result
    assert ("l0_o", "l0_res1") in pairs  # the residual add over the projection
    assert by_name(plan, "lv0").offset is by_name(plan, "l0_mlp_up").offset
    # layer_norm is a reduction: its output never takes its input's place
    assert not any(o.endswith("ln2") for _, o in pairs)


def test_no_in_place_when_the_input_lives_on() -> None:
    n = tw.dim("n")
    x = Var("x", TensorInfo((n,), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        t = bb.emit(op.exp(x), name="t")
        y = bb.emit(op.neg(t), name="y")
        z = bb.emit(op.add(t, y), name="z")
        w = bb.emit(op.exp(z), name="w")
        bb.emit_func_output(w)
    plan = plan_function(lower_calls(bb.get()), "main")
    pairs = set(plan.in_place)
    assert ("t", "y") not in pairs  # t is read again by z
    assert ("t", "z") in pairs or ("y", "z") in pairs
    assert plan.unplanned == ("w",)
    assert_valid(plan, envs_for(n))


def test_returned_values_and_tuples_are_never_planned() -> None:
    n = tw.dim("n", max=32)
    x = Var("x", TensorInfo((n, 4), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        a = bb.emit(op.exp(x), name="a")
        b = bb.emit(op.neg(a), name="b")
        c = bb.emit(op.exp(b), name="c")
        d = bb.emit(op.add(c, b), name="d")
        bb.emit_func_output((a, d))
    plan = plan_function(lower_calls(bb.get()), "main")
    assert set(plan.unplanned) == {"a", "d"}
    assert {pl.name for pl in plan.placements} == {"b", "c"}
    assert_valid(plan, envs_for(n))


def _if_module(bounded: bool) -> IRModule:
    n = tw.dim("n", max=64) if bounded else tw.dim("n")
    c = Var("c", TensorInfo((), "bool"))
    x = Var("x", TensorInfo((n,), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [c, x]):
        t = bb.emit(op.exp(x), name="t")

        def then() -> Var:
            u = bb.emit(op.exp(t), name="u")
            return bb.emit(op.neg(u), name="v")

        r = bb.emit_if(c, then, lambda: op.neg(t), name="r")
        z = bb.emit(op.add(r, t), name="z")
        bb.emit_func_output(z)
    return bb.get()


@pytest.mark.parametrize("bounded", [True, False])
def test_if_branches(bounded: bool) -> None:
    mod = _if_module(bounded)
    n = mod["main"].params[1].info.shape[0]  # type: ignore[union-attr]
    plan = plan_function(lower_calls(mod), "main")
    names = {pl.name for pl in plan.placements}
    assert {"t", "u", "v"} <= names and plan.unplanned == ("z",)
    assert {pl.arena for pl in plan.placements} == {"static" if bounded else "pooled"}
    t = by_name(plan, "t")
    # t is read after the If (with the If's result): nothing the branches allocate outlives it,
    # and what a branch returns lives on until that read
    assert all(t.end >= pl.end for pl in plan.placements)
    assert by_name(plan, "v").end == t.end and by_name(plan, "u").end < t.end
    assert_valid(plan, envs_for(n))


def test_sizes_bound_after_entry_stay_unplanned() -> None:
    n = tw.dim("n")
    x = Var("x", TensorInfo((n,), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        m = tw.dim("m")
        y = bb.match_cast(x, TensorInfo((m,), "float32"), name="y")
        e = bb.emit(op.exp(y), name="e")
        f = bb.emit(op.exp(x), name="f")
        g = bb.emit(op.add(e, op.neg(f)), name="g")
        bb.emit_func_output(g)
    plan = plan_function(lower_calls(bb.get()), "main")
    assert "e" in plan.unplanned and "f" in {pl.name for pl in plan.placements}


def test_planned_ir_round_trips_through_text() -> None:
    low = lower_calls(transformer_block(SMALL, tw.dim("b", max=4), tw.dim("s", max=8)), views=True)
    planned = PlanMemory()(low)
    text = print_module(planned)
    assert "vm_alloc_storage" in text and "vm_alloc_tensor_from_storage" in text
    assert structural_equal(parse(text), planned)
    # idempotent: nothing is left to plan the second time
    assert structural_equal(PlanMemory()(planned), planned)
