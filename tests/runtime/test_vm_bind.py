"""``VM.bind``: the checks of the bound params' static shapes and dtypes run once, when binding
(with the messages a call would give), and the bound function checks only what the caller
passes at each call; its results are those of the unbound function. A dispatching ``main`` (one
copy per shape bucket) hands its copies the bound params already checked: their checks of those
params go too, unless they expect another shape or dtype."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tilework import op
from tilework.errors import RuntimeCheckError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.runtime.vm import without_bound_checks


def _module() -> tw.IRModule:
    """``main(x: [n, 4], s: [4], w: [4, 4], b: [4]) = x @ w + b + s``: s, w and b are static."""
    n = tw.dim("n", max=64)
    x = Var("x", TensorInfo((n, 4), "float32"))
    s = Var("s", TensorInfo((4,), "float32"))
    w = Var("w", TensorInfo((4, 4), "float32"))
    b = Var("b", TensorInfo((4,), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, s, w, b]):
        with bb.dataflow():
            y = bb.emit(op.matmul(x, w))
            y = bb.emit(op.add(y, b))
            r = bb.emit_output(op.add(y, s))
        bb.emit_func_output(r)
    return bb.get()


@pytest.fixture(scope="module")
def vm() -> tw.VM:
    return tw.VM(tw.build(_module()))


def _arrays(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in [(n, 4), (4,), (4, 4), (4,)]]


def _static_checks(code: tuple) -> list[tuple]:
    return [ins for ins in code if ins[0] == "call" and ins[2] == ("builtin", "vm_check_static_tensors")]


def test_bound_checks_leave_the_call_and_the_others_stay(vm: tw.VM) -> None:
    fn = vm.exe.functions["main"]
    (full,) = _static_checks(fn.code)
    assert [v for tag, v in full[3] if tag == "r"] == [1, 2, 3]
    rest, taken = without_bound_checks(fn, 2)
    (kept,) = _static_checks(rest.code)
    assert [v for tag, v in kept[3] if tag == "r"] == [1]  # s, passed at every call
    assert kept[3][-4:] == (("i", ((4,),)), ("i", ("float32",)), ("i", ("s",)), full[3][-1])
    assert [[v for tag, v in ins[3] if tag == "r"] for ins in taken] == [[2, 3]]
    everything, taken = without_bound_checks(fn, 1)
    assert not _static_checks(everything.code) and len(everything.code) == len(fn.code)
    assert len(without_bound_checks(fn, 4)[0].code) == len(fn.code) and not without_bound_checks(fn, 4)[1]


@pytest.mark.parametrize("lead", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 5, 64])
def test_bound_results_are_the_unbound_ones(vm: tw.VM, lead: int, n: int) -> None:
    args = _arrays(n, seed=n)
    want = vm["main"](*args)
    np.testing.assert_allclose(want, args[0] @ args[2] + args[3] + args[1], rtol=1e-5, atol=1e-5)
    bound = vm.bind("main", *args[lead:])
    np.testing.assert_array_equal(bound(*args[:lead]), want)
    np.testing.assert_array_equal(bound(*args[:lead]), want)  # and again, on the same memory


def test_a_wrong_bound_param_fails_at_bind_with_the_calls_message(vm: tw.VM) -> None:
    x, s, w, b = _arrays(3)
    with pytest.raises(RuntimeCheckError) as at_call:
        vm["main"](x, s, w[:3].copy(), b)
    with pytest.raises(RuntimeCheckError) as at_bind:
        vm.bind("main", w[:3].copy(), b)
    assert str(at_bind.value) == str(at_call.value) and "w.shape[0] = 3" in str(at_bind.value)
    with pytest.raises(RuntimeCheckError, match="expects dtype float32"):
        vm.bind("main", w, b.astype(np.float64))


def test_an_unbound_static_param_is_still_checked_at_every_call(vm: tw.VM) -> None:
    x, s, w, b = _arrays(3)
    bound = vm.bind("main", w, b)
    bound(x, s)
    with pytest.raises(RuntimeCheckError, match=r"s\.shape\[0\] = 3 but it must be 4"):
        bound(x, s[:3].copy())
    with pytest.raises(RuntimeCheckError, match="expects dtype float32"):
        bound(x, s.astype(np.float64))


def test_reshaping_the_callers_array_after_bind_changes_nothing(vm: tw.VM) -> None:
    x, s, w, b = _arrays(5)
    want = vm["main"](x, s, w, b)
    bound = vm.bind("main", w, b)
    w.shape = (2, 8)  # the caller's object; the bound function holds a view of its own
    b.dtype = np.int32
    np.testing.assert_array_equal(bound(x, s), want)


def _dispatching_module() -> tw.IRModule:
    """``_module``'s main as copies ``main__p0..`` (one per shape bucket of ``n``) that a
    dispatching ``main`` calls with its params, as ``placement="auto"`` builds it."""
    from tilework.collage.buckets import bucket_vars, dispatch_module, make_buckets

    mod = _module()
    buckets = make_buckets(bucket_vars(mod["main"]), {"n": [1, 8, 64]})
    return dispatch_module(mod, "main", [(b, k) for k, b in enumerate(buckets)], len(buckets))


def test_a_dispatching_main_hands_its_copies_the_bound_params_checked() -> None:
    vm = tw.VM(tw.build(_dispatching_module()))
    names = [n for n in vm.exe.functions if n.startswith("main__p")]
    assert len(names) == 3 and all(_static_checks(vm.exe.functions[n].code) for n in names)
    for n in (1, 5, 8, 30, 64):
        args = _arrays(n, seed=n)
        want = vm["main"](*args)
        np.testing.assert_allclose(want, args[0] @ args[2] + args[3] + args[1], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(vm.bind("main", *args[2:])(*args[:2]), want)
    variants = {key[0]: v for key, v in vm._own.variants.items()}
    assert set(names) <= set(variants)  # every bucket's copy ran as a variant
    for n in names:  # w and b (params 2, 3) checked once at bind; s, passed at every call, still
        (kept,) = _static_checks(variants[n].fn.code)
        assert [v for tag, v in kept[3] if tag == "r"] == [1]
    x, s, w, b = _arrays(5)
    with pytest.raises(RuntimeCheckError, match=r"s\.shape\[0\] = 3 but it must be 4"):
        vm.bind("main", w, b)(x, s[:3].copy())


def test_a_callee_expecting_another_shape_keeps_its_check() -> None:
    vm = tw.VM(tw.build(_dispatching_module()))
    own = vm._own
    assert own.checked_variant("main__p0", {2: ((4, 4), "float32")}) is not own.funcs["main__p0"]
    assert own.checked_variant("main__p0", {2: ((4, 5), "float32")}) is own.funcs["main__p0"]
    assert own.checked_variant("main__p0", {2: ((4, 4), "float64")}) is own.funcs["main__p0"]
