"""legalize: a call equal to one legalized before (op, attributes, argument struct info and
aliasing) calls the kernel built then, without building it again; the module comes out as it
did when every call was legalized on its own, and calls that differ get kernels of their own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
import tilework.transform.legalize as legalize_mod
from tests.transform.util import ir, run
from tilework import te
from tilework.ir.graph import Call, GlobalVar, OpRef, Var, bindings_of
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.ir.structural import assert_structural_equal
from tilework.ir.sym import SymVar
from tilework.models.reference import EncoderConfig, encoder
from tilework.op.calls import call_tensor
from tilework.transform.legalize import Legalize, _reusable

ADDS = """
@graph
def main(x: Tensor((n, 3), "float32"), y: Tensor((n, 3), "float32")):
    n = sym(lo=0)
    with dataflow():
        a = add(x, x)
        b = add(x, y)
        c = add(a, b)
        d = add(c, c)
        e = multiply(d, y)
        f = multiply(e, x)
        output(f)
    return f
"""


def _kernel_calls(mod: IRModule) -> list[tuple[str, tuple[str, ...]]]:
    """(kernel, argument names) of each ``call_tensor`` in ``main``, in order."""
    out = []
    for b in bindings_of(mod["main"]):
        v = b.value
        if isinstance(v, Call) and isinstance(v.callee, OpRef) and v.callee.name == "call_tensor":
            gv, args = v.args[0], v.args[1]
            assert isinstance(gv, GlobalVar)
            out.append((gv.name, tuple(a.name for a in args.fields if isinstance(a, Var))))
    return out


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made = [0]
    create = te.create_func

    def counted(*a: Any, **k: Any) -> Any:
        made[0] += 1
        return create(*a, **k)

    monkeypatch.setattr(te, "create_func", counted)
    return made


def _without_reuse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(legalize_mod, "_reuse_key", lambda call: None)


def test_repeated_calls_share_the_kernel_built_once_and_alias_patterns_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = ir(ADDS)
    made = _counting(monkeypatch)
    after = Legalize()(mod)
    calls = _kernel_calls(after)
    # add(x, x) reads one tensor twice: its key differs from add(x, y)'s; add(a, b) is add(x, y)
    # again, add(c, c) is add(x, x) again; the multiplies share one kernel
    assert [args for _, args in calls] == [("x", "x"), ("x", "y"), ("a", "b"), ("c", "c"), ("d", "y"), ("e", "x")]
    assert calls[2][0] == calls[1][0] and calls[3][0] == calls[0][0] and calls[5][0] == calls[4][0]
    reused = made[0]
    _without_reuse(monkeypatch)
    made[0] = 0
    alone = Legalize()(mod)
    assert made[0] == 6 and reused < made[0]  # each call built its kernel before
    assert_structural_equal(after, alone)
    rng = np.random.default_rng(0)
    for n in (0, 1, 7):
        x, y = (rng.standard_normal((n, 3)).astype(np.float32) for _ in range(2))
        np.testing.assert_allclose(run(mod, [x, y]), (((x + x) + (x + y)) * 2) * y * x, rtol=1e-6)


def test_an_encoder_legalizes_to_the_same_module_building_each_kernel_once(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = encoder(EncoderConfig(layers=3, hidden=32, heads=2, ffn=64))
    made = _counting(monkeypatch)
    after = Legalize()(mod)
    reused = made[0]
    _without_reuse(monkeypatch)
    made[0] = 0
    alone = Legalize()(mod)
    assert_structural_equal(after, alone)
    kernels = len(list(after.tensor_funcs()))
    assert reused <= kernels < made[0]  # no kernel built twice; before, every layer built its own


def test_a_legalization_naming_a_dim_of_its_own_is_not_repeated() -> None:
    n, fresh = SymVar("n"), SymVar("k")
    x = Var("x", TensorInfo((n, 3), "float32"))
    call = tw.op.add(x, x)
    gv = GlobalVar("kernel")
    assert _reusable(call_tensor(gv, [x], TensorInfo((n, 3), "float32")), call) is not None
    assert _reusable(call_tensor(gv, [x], TensorInfo((fresh, 3), "float32")), call) is None  # a dim made up for this call
    assert _reusable(call_tensor(gv, [x], TensorInfo((n, 3), "float32"), [fresh]), call) is None
    other = Var("other", TensorInfo((n, 3), "float32"))
    assert _reusable(call_tensor(gv, [other], TensorInfo((n, 3), "float32")), call) is None  # not the call's own argument
