"""The VM's memory: carved views, the size-class pool, static arenas allocated once, counters;
numerics with and without planning; outputs that later calls never overwrite."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tilework import op
from tilework.transform.pipeline import lowering_through
from tilework.errors import RuntimeCheckError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Call, Constant, GlobalVar, Var
from tilework.ir.info import FuncInfo, TensorInfo
from tilework.ir.module import IRModule
from tilework.models.numpy_ref import encoder_ref, transformer_block_ref
from tilework.models.reference import EncoderConfig, TransformerConfig, encoder, random_weights, transformer_block
from tilework.runtime.memory import ALIGN, Memory, Storage, carve, size_class

BLOCK = TransformerConfig(layers=2, hidden=32, heads=4, ffn=64)
ENC = EncoderConfig(layers=2, hidden=32, heads=4, ffn=64)


# -- the allocator ------------------------------------------------------------------------


def test_size_classes_round_up_by_at_most_a_quarter() -> None:
    assert size_class(1) == size_class(256) == 256
    for n in [257, 1000, 4096, 4097, 123457, 10**8 + 1]:
        c = size_class(n)
        assert n <= c <= n * 1.25 + 1
        assert size_class(c) == c  # classes are fixed points


def test_carve_gives_aligned_contiguous_views() -> None:
    s = Storage(4096)
    assert s.buf.ctypes.data % ALIGN == 0
    a = carve(s, (3, 5), 0, np.dtype(np.float32))
    b = carve(s, (2, 2), 128, np.dtype(np.float64))
    assert a.flags.c_contiguous and a.dtype == np.float32 and a.shape == (3, 5)
    assert b.ctypes.data == s.buf.ctypes.data + 128 and np.shares_memory(b, s.buf)
    assert s.used == 128 + 32
    with pytest.raises(RuntimeCheckError, match="too small .* upper bound"):
        carve(s, (1024, 2), 0, np.dtype(np.float32))


def test_pool_reuses_released_blocks_by_size_class() -> None:
    m = Memory()
    a = m.acquire(1000)
    m.release(a)
    b = m.acquire(1010)  # same class: the same block
    assert b is a and m.pooled_allocations == 1 and m.pooled_reuses == 1
    c = m.acquire(1000)  # b is still in use: new memory
    assert c is not b and m.pooled_allocations == 2
    m.release(b)
    m.release(c)
    assert m.stats()["pooled_in_use_bytes"] == 0 and m.stats()["pooled_peak_bytes"] == 2010
    assert m.trim() == 2 * size_class(1000) and m.stats()["pooled_bytes"] == 0


def test_live_tracking_follows_fresh_tensors() -> None:
    m = Memory(track_live=True)
    a = m.alloc_fresh((10, 10), np.dtype(np.float32))
    b = m.alloc_fresh((5,), np.dtype(np.float64))
    assert m.live_bytes == 440
    del a
    assert m.live_bytes == 40 and m.peak_live_bytes == 440
    del b
    assert m.live_bytes == 0


# -- models through build ------------------------------------------------------------------


@pytest.fixture(scope="module")
def block_vms() -> tuple:
    mod = transformer_block(BLOCK)
    return mod, tw.VM(tw.build(mod)), tw.VM(tw.build(mod, plan_memory=False))


@pytest.fixture(scope="module")
def encoder_vms() -> tuple:
    mod = encoder(ENC)
    return mod, tw.build(mod), tw.VM(tw.build(mod, plan_memory=False))


def _encoder_inputs(b: int, s: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((b, s, ENC.hidden)).astype(np.float32)
    mask = np.where(rng.random((b, 1, 1, s)) < 0.2, -1e4, 0.0).astype(np.float32)
    mask[..., 0] = 0.0
    return x, mask


def test_block_numerics_with_and_without_planning(block_vms: tuple) -> None:
    """Unbounded batch and seq: the plan is a pooled arena with symbolic offsets."""
    mod, planned, plain = block_vms
    weights = random_weights(list(mod["main"].params[1:]))
    rng = np.random.default_rng(0)
    for b, s in [(1, 1), (2, 7), (3, 40), (1, 7)]:
        x = rng.standard_normal((b, s, BLOCK.hidden)).astype(np.float32)
        out = planned["main"](x, *weights)
        np.testing.assert_allclose(out, plain["main"](x, *weights), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out, transformer_block_ref(x, weights, BLOCK), rtol=1e-4, atol=1e-4)


def test_encoder_numerics_with_and_without_planning(encoder_vms: tuple) -> None:
    """batch <= 64 and seq <= 512: the plan is a static arena."""
    mod, exe, plain = encoder_vms
    vm = tw.VM(exe)
    weights = random_weights(list(mod["main"].params[2:]))
    rng = np.random.default_rng(1)
    for b, s in [(1, 3), (4, 19), (2, 64)]:
        x, mask = _encoder_inputs(b, s, rng)
        out = vm["main"](x, mask, *weights)
        np.testing.assert_allclose(out, plain["main"](x, mask, *weights), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out, encoder_ref(x, mask, weights, ENC), rtol=1e-4, atol=1e-4)


def test_bounded_steady_state_obtains_no_new_memory(encoder_vms: tuple) -> None:
    mod, exe, _ = encoder_vms
    vm = tw.VM(exe)
    weights = random_weights(list(mod["main"].params[2:]))
    rng = np.random.default_rng(2)
    vm["main"](*_encoder_inputs(2, 16, rng), *weights)
    first = vm.memory_stats()
    assert first["static_allocations"] == 1 and first["pooled_allocations"] == 0
    assert first["static_bytes"] > 0 and first["fresh_allocations"] == 1  # the output
    for i, (b, s) in enumerate([(2, 16), (1, 5), (8, 33), (64, 8), (2, 16)], start=1):
        out = vm["main"](*_encoder_inputs(b, s, rng), *weights)
        now = vm.memory_stats()
        # the only new memory of each call is its output, which the caller owns
        assert now["allocations"] == first["allocations"] + i
        assert now["allocated_bytes"] == first["allocated_bytes"] + sum(_out_bytes(x) for x in [(2, 16), (1, 5), (8, 33), (64, 8), (2, 16)][:i])
        assert now["static_bytes"] == first["static_bytes"]
        assert out.nbytes == _out_bytes((b, s))
    assert 0 < vm.memory_stats()["static_used_bytes"] < first["static_bytes"] // 100


def _out_bytes(shape: tuple[int, int]) -> int:
    return shape[0] * shape[1] * ENC.hidden * 4


def test_unbounded_dims_reuse_the_pool_across_calls(block_vms: tuple) -> None:
    mod, _, _ = block_vms
    vm = tw.VM(tw.build(mod))
    weights = random_weights(list(mod["main"].params[1:]))
    x = np.ones((2, 9, BLOCK.hidden), np.float32)
    vm["main"](x, *weights)
    first = vm.memory_stats()
    assert first["pooled_allocations"] == 1 and first["static_allocations"] == 0
    for _ in range(3):
        vm["main"](x, *weights)
    now = vm.memory_stats()
    assert now["pooled_allocations"] == 1 and now["pooled_reuses"] == 3
    assert now["allocations"] == first["allocations"] + 3  # outputs only
    assert now["pooled_in_use_bytes"] == 0
    vm["main"](np.ones((4, 30, BLOCK.hidden), np.float32), *weights)  # a bigger class
    assert vm.memory_stats()["pooled_allocations"] == 2


def test_outputs_stay_valid_after_later_calls(encoder_vms: tuple) -> None:
    mod, exe, _ = encoder_vms
    vm = tw.VM(exe)
    weights = random_weights(list(mod["main"].params[2:]))
    rng = np.random.default_rng(3)
    x1, m1 = _encoder_inputs(2, 8, rng)
    out1 = vm["main"](x1, m1, *weights)
    kept = out1.copy()
    arena = vm.memory.static_slots[0].storage
    assert arena is not None and not np.shares_memory(out1, arena.buf)
    out2 = vm["main"](*_encoder_inputs(2, 8, rng), *weights)
    vm["main"](*_encoder_inputs(5, 30, rng), *weights)
    np.testing.assert_array_equal(out1, kept)
    assert not np.shares_memory(out1, out2)


def _tuple_module() -> IRModule:
    n = tw.dim("n", max=64)
    x = Var("x", TensorInfo((n, 4), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        a = bb.emit(op.exp(x))
        b = bb.emit(op.neg(a))
        c = bb.emit(op.add(op.exp(b), b))
        bb.emit_func_output((a, c))
    return bb.get()


def test_tuple_outputs_are_fresh_each_call() -> None:
    vm = tw.VM(tw.build(_tuple_module()))
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    a1, c1 = vm["main"](x)
    kept = (a1.copy(), c1.copy())
    a2, c2 = vm["main"](x * 2)
    np.testing.assert_array_equal(a1, kept[0])
    np.testing.assert_array_equal(c1, kept[1])
    np.testing.assert_allclose(c1, np.exp(-np.exp(x)) - np.exp(x), rtol=1e-5, atol=1e-6)
    arena = vm.memory.static_slots[0].storage
    assert arena is not None
    assert not any(np.shares_memory(t, arena.buf) for t in (a1, c1, a2, c2))


@pytest.mark.parametrize("bounded", [True, False])
def test_if_branches_with_planning(bounded: bool) -> None:
    n = tw.dim("n", max=64) if bounded else tw.dim("n")
    c = Var("c", TensorInfo((), "bool"))
    x = Var("x", TensorInfo((n,), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [c, x]):
        t = bb.emit(op.exp(x))

        def then() -> Var:
            u = bb.emit(op.exp(t))
            return bb.emit(op.neg(u))

        r = bb.emit_if(c, then, lambda: op.neg(t))
        bb.emit_func_output(bb.emit(op.add(r, t)))
    vm = tw.VM(tw.build(bb.get()))
    seen = []
    for _ in range(2):
        for k in (1, 7, 64):
            x_ = np.linspace(-1, 1, k, dtype=np.float32)
            t_ = np.exp(x_)
            np.testing.assert_allclose(vm["main"](np.array(True), x_), t_ - np.exp(t_), rtol=1e-5)
            np.testing.assert_allclose(vm["main"](np.array(False), x_), np.zeros_like(x_), atol=1e-6)
        seen.append(vm.memory_stats())
    first, second = seen
    assert first["static_allocations" if bounded else "pooled_allocations"] >= 1
    # the second round of the same shapes obtains nothing but its six outputs
    assert second["allocations"] - first["allocations"] == 6
    assert second["fresh_allocations"] - first["fresh_allocations"] == 6


def test_each_vm_has_its_own_arenas(encoder_vms: tuple) -> None:
    mod, exe, _ = encoder_vms
    vm1, vm2 = tw.VM(exe), tw.VM(exe)
    weights = random_weights(list(mod["main"].params[2:]))
    args = (*_encoder_inputs(1, 4, np.random.default_rng(4)), *weights)
    np.testing.assert_array_equal(vm1["main"](*args), vm2["main"](*args))
    s1, s2 = vm1.memory.static_slots[0].storage, vm2.memory.static_slots[0].storage
    assert s1 is not None and s2 is not None and not np.shares_memory(s1.buf, s2.buf)


def test_planning_cuts_memory_obtained_per_call(block_vms: tuple) -> None:
    mod, planned, _ = block_vms
    plain = tw.VM(tw.build(mod, opt_level=0), track_live=True)  # every intermediate its own array
    weights = random_weights(list(mod["main"].params[1:]))
    x = np.ones((4, 50, BLOCK.hidden), np.float32)
    plain["main"](x, *weights)
    before = plain.memory_stats()
    plain.memory.reset_peaks()
    out = plain["main"](x, *weights)
    after = plain.memory_stats()
    per_call = after["fresh_bytes"] - before["fresh_bytes"]
    assert after["fresh_allocations"] - before["fresh_allocations"] > 20
    assert out.nbytes < after["peak_live_bytes"] < per_call
    planned["main"](x, *weights)
    p0 = planned.memory_stats()
    planned["main"](x, *weights)
    p1 = planned.memory_stats()
    assert p1["allocated_bytes"] - p0["allocated_bytes"] == out.nbytes
    # the arena (what this shape needs) is no more than the peak of live unplanned tensors
    # (here both reach the attention phase's lower bound: five hidden-sized tensors)
    assert p1["pooled_peak_bytes"] <= after["peak_live_bytes"] < per_call / 4


def _recursive_module() -> IRModule:
    """``f(c, x) = (f(False, t) if c else exp(t)) + t`` with ``t = exp(x)``: the inner call's
    intermediates must not land on the outer call's ``t``."""
    n = tw.dim("n", max=64)
    c = Var("c", TensorInfo((), "bool"))
    x = Var("x", TensorInfo((n,), "float32"))
    self_ref = GlobalVar("f", FuncInfo((c.info, x.info), x.info, pure=True))
    bb = BlockBuilder()
    with bb.function("f", [c, x]):
        t = bb.emit(op.exp(x))

        def recurse() -> Var:
            return bb.emit(Call(self_ref, (Constant.of(np.array(False)), t)))

        r = bb.emit_if(c, recurse, lambda: op.exp(t))
        bb.emit_func_output(bb.emit(op.add(r, t)))
    return bb.get()


def test_recursive_calls_do_not_share_an_arena() -> None:
    from tilework.transform.plan_memory import plan_function

    mod = _recursive_module()
    vm = tw.VM(tw.build(mod))
    x = np.linspace(-2, -1, 9, dtype=np.float32)
    e1 = np.exp(x)
    e2 = np.exp(e1)
    want = np.exp(e2) + e2 + e1
    for _ in range(2):
        np.testing.assert_allclose(vm["f"](np.array(True), x), want, rtol=1e-5)
    stats = vm.memory_stats()
    assert stats["static_allocations"] == 0 and stats["pooled_allocations"] == 2  # two activations
    lowered = mod
    for p in lowering_through("lower_calls"):
        lowered = p(lowered)
    assert {pl.arena for pl in plan_function(lowered, "f").placements} == {"pooled"}


def test_a_failed_call_gives_its_pooled_blocks_back() -> None:
    n = tw.dim("n")
    x = Var("x", TensorInfo((2, 3), "float32"))
    y = Var("y", TensorInfo((2, n), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, y]):
        t = bb.emit(op.exp(y))
        u = bb.emit(op.exp(t))
        bb.emit_func_output(bb.emit(op.add(x, u)))  # n must be 3 or 1: checked at run time
    vm = tw.VM(tw.build(bb.get()))
    a = np.ones((2, 3), np.float32)
    vm["main"](a, np.zeros((2, 3), np.float32))
    with pytest.raises(RuntimeCheckError, match="must be equal or 1"):
        vm["main"](a, np.zeros((2, 2), np.float32))
    stats = vm.memory_stats()
    assert stats["pooled_in_use_bytes"] == 0 and not vm.memory.lent
    np.testing.assert_allclose(vm["main"](a, np.zeros((2, 3), np.float32)), a + np.e, rtol=1e-6)
    assert vm.memory_stats()["pooled_allocations"] == stats["pooled_allocations"]
