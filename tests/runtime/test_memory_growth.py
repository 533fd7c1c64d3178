"""Static arenas of large bounds are sized by need (tilework.runtime.memory.GROW_ABOVE): a
3-row call of a model declared for a million rows holds kilobytes, and larger shapes grow the
arena up to the bound, with the same numerics."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tilework import op
from tilework.errors import RuntimeCheckError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.runtime.memory import GROW_ABOVE, Memory, Storage, carve


def _chain(max_rows: int) -> tw.IRModule:
    """exp(x) * 2 + sin(exp(x)), built without fusion (one kernel per op): intermediates of
    (n, 256) float32 between kernels, planned in the static arena (3 GB at n = 10**6)."""
    n = tw.dim("n", max=max_rows)
    x = Var("x", TensorInfo((n, 256), "float32"))
    two = Var("two", TensorInfo((), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, two]):
        with bb.dataflow():
            e = bb.emit(op.exp(x))
            s = bb.emit(op.sin(e))
            m = bb.emit(op.multiply(e, two))
            r = bb.emit_output(op.add(m, s))
        bb.emit_func_output(r)
    return bb.get()


def _build(max_rows: int) -> tw.Executable:
    return tw.build(_chain(max_rows), opt_level=0, plan_memory=True)


W = np.array(2.0, np.float32)


def _ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x)
    return e * 2 + np.sin(e)


def test_three_rows_of_a_million_hold_kilobytes() -> None:
    exe = _build(10**6)
    vm = tw.VM(exe)
    rng = np.random.default_rng(0)
    x3 = rng.standard_normal((3, 256)).astype(np.float32)
    np.testing.assert_allclose(vm["main"](x3, W), _ref(x3), rtol=1e-4, atol=1e-5)
    st = vm.memory_stats()
    assert st["static_allocations"] >= 1, "the plan puts the intermediates in a static arena"
    assert st["static_bytes"] < 1 << 20, st  # not the gigabytes of the bound
    x1k = rng.standard_normal((1000, 256)).astype(np.float32)
    np.testing.assert_allclose(vm["main"](x1k, W), _ref(x1k), rtol=1e-4, atol=1e-5)  # grows
    grown = vm.memory_stats()
    assert 1000 * 256 * 4 <= grown["static_bytes"] < 64 * 1000 * 256 * 4
    np.testing.assert_allclose(vm["main"](x3, W), _ref(x3), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(vm["main"](x1k, W), _ref(x1k), rtol=1e-4, atol=1e-5)
    after = vm.memory_stats()
    assert after["static_allocations"] == grown["static_allocations"]  # no new memory for seen shapes
    assert after["static_bytes"] == grown["static_bytes"]


def test_small_bounds_keep_one_block_for_the_bound() -> None:
    vm = tw.VM(_build(64))
    x = np.ones((2, 256), np.float32)
    vm["main"](x, W)
    first = vm.memory_stats()
    vm["main"](np.ones((64, 256), np.float32), W)
    assert vm.memory_stats()["static_allocations"] == first["static_allocations"]
    assert first["static_bytes"] >= 64 * 256 * 4 and first["static_bytes"] <= GROW_ABOVE


def test_growth_keeps_earlier_tensors_and_stops_at_the_limit() -> None:
    m = Memory()
    s = m._obtain_static(GROW_ABOVE * 2)
    assert s.capacity < 4096 and s.limit == GROW_ABOVE * 2
    a = carve(s, (16,), 0, np.dtype(np.float32))
    a[:] = 7
    b = carve(s, (1 << 20,), 1024, np.dtype(np.float32))  # does not fit: a larger block
    assert s.capacity >= 1024 + 4 * (1 << 20) and np.shares_memory(b, s.buf)
    assert (a == 7).all() and not np.shares_memory(a, b)
    with pytest.raises(RuntimeCheckError, match="exceeds the upper bound"):
        carve(s, (GROW_ABOVE,), 0, np.dtype(np.float32))  # beyond the limit
    assert isinstance(Storage(256).limit, int)
