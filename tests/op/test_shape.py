"""Shapes as tensors and back (``tilework.op.shape``): ``shape_to_tensor`` as a kernel, and
``tensor_to_shape``, which has none: it legalizes to the VM op ``vm_tensor_to_shape`` and a
``match_cast`` binds its values to fresh sym vars."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import T, infer, info_of
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs
from tilework.errors import InferenceError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Binding, Call, GraphFunc, OpRef, Var, bindings_of
from tilework.ir.info import ShapeInfo, TensorInfo
from tilework.ir.structural import assert_structural_equal
from tilework.ir.sym import SymVar
from tilework.op import shape as op_shape
from tilework.text import parse, print_module
from tilework.transform.legalize import Legalize

n, m = tw.dim("n"), tw.dim("m")


def test_inference() -> None:
    assert info_of(lambda x: op_shape.shape_to_tensor((n, 4, m * 2)), T(1)) == T(3, dtype="int64")
    assert info_of(op_shape.tensor_to_shape, T(3, dtype="int64")) == ShapeInfo(None, 3)
    with pytest.raises(InferenceError, match="static length"):
        infer(op_shape.tensor_to_shape, T(n, dtype="int64"))


ENVS = envs({n: 1, m: 3}, {n: 5, m: 7}, {n: 9, m: 2})
CASES = [
    Case("shape_to_tensor", lambda x: op_shape.shape_to_tensor((n, 4, m * 2)), [T(n, m)], lambda x: np.array([x.shape[0], 4, 2 * x.shape[1]], np.int64), ENVS),
]


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)


def test_tensor_to_shape_legalizes_to_the_vm_op() -> None:
    """No kernel and no extern: a call of ``vm_tensor_to_shape``, which the VM runs as the
    builtin of that name."""
    t = Var("t", TensorInfo((2,), "int64"))
    bb = BlockBuilder()
    with bb.function("main", [t]):
        bb.emit_func_output(bb.emit(op_shape.tensor_to_shape(t)))
    mod = Legalize()(bb.get())
    assert_structural_equal(mod, parse(print_module(mod)))
    main = mod["main"]
    assert isinstance(main, GraphFunc)
    calls = [b.value for b in bindings_of(main) if isinstance(b, Binding) and isinstance(b.value, Call)]
    assert [c.callee.name for c in calls if isinstance(c.callee, OpRef)] == ["vm_tensor_to_shape"]
    assert calls[0].info == ShapeInfo(None, 2)


def test_shapes_to_tensors_and_back_at_run_time() -> None:
    """shape_to_tensor of symbolic dims, and tensor_to_shape + match_cast lifting a tensor's
    values into fresh dims that shape a later op, compiled once."""
    a, b = SymVar("a", 1), SymVar("b", 1)
    x = Var("x", TensorInfo((n, m), "float32"))
    t = Var("t", TensorInfo((2,), "int64"))
    bb = BlockBuilder()
    with bb.function("main", [x, t]):
        with bb.dataflow():
            dims = bb.emit(op_shape.shape_to_tensor((n, m * 2)))
            s = bb.emit(op_shape.tensor_to_shape(t))
            s2 = bb.match_cast(s, ShapeInfo((a, b)))
            y = bb.emit(op.reshape(x, s2))
            out = bb.emit_output(op.concat([dims, bb.emit(op_shape.shape_to_tensor(s2))]))
            yo = bb.emit_output(y)
        bb.emit_func_output([out, yo])
    fn = tw.VM(tw.build(bb.get()))["main"]
    xs = np.arange(12, dtype=np.float32).reshape(3, 4)
    d, y = fn(xs, np.array([2, 6], np.int64))
    np.testing.assert_array_equal(d, [3, 8, 2, 6])
    np.testing.assert_array_equal(y, xs.reshape(2, 6))
    d, y = fn(xs[:2], np.array([8, 1], np.int64))
    np.testing.assert_array_equal(d, [2, 8, 8, 1])
    assert y.shape == (8, 1)
