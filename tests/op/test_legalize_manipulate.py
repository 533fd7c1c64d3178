"""Legalized shape manipulation (reshape, permute_dims, expand_dims, squeeze, flatten,
broadcast_to, concat, split, strided_slice, take, shape_of), compiled to C and run at several
values of their symbolic dims, against NumPy."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, random_array, run, shape_at
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import ShapeExpr, Var
from tilework.ir.info import TensorInfo
from tilework.ir.sym import SymVar
from tilework.transform.legalize import Legalize

n, m, k, b = tw.dim("n"), tw.dim("m"), tw.dim("k"), tw.dim("b")
ENVS = envs({n: 1, m: 1, b: 1}, {n: 7, m: 33, b: 3}, {n: 256, m: 5, b: 2})


def T(*shape: Any, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(tuple(shape), dtype)


def case(name: str, make: Callable[..., Any], infos: list[TensorInfo], ref: Callable[..., Any], env_list: Any = ENVS, **kw: Any) -> Case:
    return Case(name, make, infos, ref, env_list, **kw)


def _take_inputs(x_shape: tuple, idx_shape: tuple, axis: int | None, dtype: str) -> Callable[[dict[SymVar, int], np.random.Generator], list[np.ndarray]]:
    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        xs = shape_at(x_shape, env)
        d = int(np.prod(xs)) if axis is None else xs[axis]
        return [random_array(xs, "float32", rng), rng.integers(-d, d, size=shape_at(idx_shape, env)).astype(dtype)]

    return make


def _cases() -> list[Case]:
    c = [
        case("reshape_split_last", lambda x: op.reshape(x, (b, n, 3, 4)), [T(b, n, 12)], lambda x: x.reshape(x.shape[0], x.shape[1], 3, 4)),
        case("reshape_transpose_dims", lambda x: op.reshape(x, (m, n)), [T(n, m)], lambda x: x.reshape(x.shape[1], x.shape[0])),
        case("reshape_flat_hole", lambda x: op.reshape(x, (-1,)), [T(n, m, 4)], lambda x: x.reshape(-1)),
        case("reshape_hole_middle", lambda x: op.reshape(x, (n, 2, -1)), [T(n, 6)], lambda x: x.reshape(x.shape[0], 2, -1)),
        case("reshape_no_shared", lambda x: op.reshape(x, (3, n, 2)), [T(2, n, 3, dtype="int32")], lambda x: x.reshape(3, -1, 2)),
        case("reshape_merge", lambda x: op.reshape(x, (n * m, 2)), [T(n, m, 2)], lambda x: x.reshape(-1, 2)),
        case("permute_reverse", lambda x: op.permute_dims(x), [T(n, m, 3)], lambda x: np.transpose(x)),
        case("permute_102", lambda x: op.permute_dims(x, (1, 0, 2)), [T(n, m, 3)], lambda x: np.transpose(x, (1, 0, 2))),
        case("permute_201", lambda x: op.permute_dims(x, (2, 0, 1)), [T(n, m, 3, dtype="bool")], lambda x: np.transpose(x, (2, 0, 1))),
        case("permute_negative", lambda x: op.permute_dims(x, (-1, 0, 1)), [T(b, n, m)], lambda x: np.transpose(x, (2, 0, 1))),
        case("expand_dims_0", lambda x: op.expand_dims(x, 0), [T(n, m)], lambda x: x[None]),
        case("expand_dims_1_3", lambda x: op.expand_dims(x, (1, 3)), [T(n, m)], lambda x: np.expand_dims(x, (1, 3))),
        case("expand_dims_last", lambda x: op.expand_dims(x, -1), [T(n, m, dtype="int64")], lambda x: x[..., None]),
        case("squeeze_all", lambda x: op.squeeze(x), [T(n, 1, m, 1)], lambda x: x.reshape(x.shape[0], x.shape[2])),
        case("squeeze_1", lambda x: op.squeeze(x, 1), [T(n, 1, m, 1)], lambda x: np.squeeze(x, 1)),
        case("squeeze_last", lambda x: op.squeeze(x, -1), [T(n, 1, m, 1)], lambda x: np.squeeze(x, -1)),
        case("flatten_all", lambda x: op.flatten(x), [T(b, n, m)], lambda x: x.reshape(-1)),
        case("flatten_1", lambda x: op.flatten(x, 1), [T(b, n, m)], lambda x: x.reshape(x.shape[0], -1)),
        case("flatten_1_2", lambda x: op.flatten(x, 1, 2), [T(b, n, m, 2)], lambda x: x.reshape(x.shape[0], -1, 2)),
        case("flatten_scalar", lambda x: op.flatten(x), [T()], lambda x: x.reshape(1)),
        case("broadcast_to_cols", lambda x, y: op.broadcast_to(x, (n, m)), [T(n, 1), T(m)], lambda x, y: np.broadcast_to(x, (x.shape[0], y.shape[0]))),
        case("broadcast_to_lead", lambda x, y: op.broadcast_to(x, (b, n, m)), [T(m), T(b, n)], lambda x, y: np.broadcast_to(x, y.shape + x.shape)),
        case("broadcast_to_sym", lambda x, y: op.broadcast_to(x, (n,)), [T(k), T(n)], lambda x, y: np.broadcast_to(x, y.shape), envs({k: 1, n: 7}, {k: 33, n: 33}, {k: 1, n: 1})),
        case("broadcast_to_scalar", lambda x, y: op.broadcast_to(x, (n, m)), [T(dtype="int32"), T(n, m)], lambda x, y: np.broadcast_to(x, y.shape)),
        case("concat_axis0", lambda x, y, z: op.concat([x, y, z]), [T(n, 3), T(m, 3), T(2, 3)], lambda *a: np.concatenate(a)),
        case("concat_axis1", lambda x, y: op.concat([x, y], axis=1), [T(n, m), T(n, 2)], lambda *a: np.concatenate(a, axis=1)),
        case("concat_negative", lambda x, y: op.concat([x, y], axis=-1), [T(b, n, 1, dtype="int32"), T(b, n, m, dtype="int32")], lambda *a: np.concatenate(a, axis=-1)),
        case("concat_one", lambda x: op.concat([x], axis=0), [T(n, m)], lambda x: x),
        case("split_sections", lambda x: op.split(x, 3, axis=1), [T(n, 6)], lambda x: tuple(np.split(x, 3, axis=1))),
        case("split_sym_sections", lambda x: op.split(x, 2, axis=0), [T(n, m)], lambda x: tuple(np.split(x, 2, axis=0)), envs({n: 2, m: 1}, {n: 34, m: 7}, {n: 256, m: 3})),
        case("split_indices", lambda x: op.split(x, (2, 5), axis=1), [T(n, 8)], lambda x: tuple(np.split(x, (2, 5), axis=1))),
        case("split_indices_past_end", lambda x: op.split(x, (3, 40), axis=-1), [T(n, m)], lambda x: tuple(np.split(x, (3, 40), axis=-1))),
        case("split_sym_index", lambda x, y: op.split(x, (k,), axis=1), [T(n, m), T(k)], lambda x, y: tuple(np.split(x, (y.shape[0],), axis=1)), envs({n: 3, m: 7, k: 2}, {n: 1, m: 5, k: 9}, {n: 256, m: 33, k: 33})),
        case("slice_inner", lambda x: op.strided_slice(x, (1,), (1,), (-1,)), [T(n, m)], lambda x: x[:, 1:-1]),
        case("slice_step2", lambda x: op.strided_slice(x, (0,), (0,), (None,), (2,)), [T(n, m)], lambda x: x[::2]),
        case("slice_reverse", lambda x: op.strided_slice(x, (1,), (None,), (None,), (-1,)), [T(n, m)], lambda x: x[:, ::-1]),
        case("slice_neg_step2", lambda x: op.strided_slice(x, (1,), (-2,), (0,), (-2,)), [T(n, m)], lambda x: x[:, -2:0:-2]),
        case("slice_two_axes", lambda x: op.strided_slice(x, (0, 2), (1, 0), (None, 3), (3, 1)), [T(n, m, 5)], lambda x: x[1::3, :, 0:3]),
        case("slice_sym_bounds", lambda x, y: op.strided_slice(x, (1,), (k,), (k + 3,)), [T(n, m), T(k)], lambda x, y: x[:, y.shape[0] : y.shape[0] + 3], envs({n: 3, m: 7, k: 2}, {n: 1, m: 5, k: 9}, {n: 256, m: 33, k: 31})),
        case("slice_past_end", lambda x: op.strided_slice(x, (0,), (2,), (100,)), [T(n, m, dtype="int64")], lambda x: x[2:100]),
        case("take_axis0", lambda x, i: op.take(x, i, axis=0), [T(n, m), T(k, dtype="int64")], lambda x, i: np.take(x, i, axis=0), envs({n: 1, m: 1, k: 1}, {n: 7, m: 33, k: 5}, {n: 256, m: 3, k: 300}), inputs=_take_inputs((n, m), (k,), 0, "int64")),
        case("take_axis1_2d", lambda x, i: op.take(x, i, axis=1), [T(b, m), T(n, k, dtype="int32")], lambda x, i: np.take(x, i, axis=1), envs({b: 1, m: 1, n: 1, k: 1}, {b: 3, m: 33, n: 7, k: 2}), inputs=_take_inputs((b, m), (n, k), 1, "int32")),
        case("take_flat", lambda x, i: op.take(x, i, axis=None), [T(n, m), T(k, dtype="int64")], lambda x, i: np.take(x, i), envs({n: 1, m: 1, k: 3}, {n: 7, m: 33, k: 40}), inputs=_take_inputs((n, m), (k,), None, "int64")),
    ]
    return c


CASES = _cases()


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_numpy(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)


def test_take_clamps_out_of_range(built: Built) -> None:
    """An index outside [-d, d) is clamped into range instead of reading out of bounds."""
    case = built.cases["take_axis0"]
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([-9, 4, 100, -1], dtype=np.int64)
    case.inputs = lambda env, rng: [x, idx]
    try:
        _, (out,) = run(built, "take_axis0", {n: 4, m: 3, k: 4})
    finally:
        case.inputs = None
    np.testing.assert_array_equal(out, x[[0, 3, 3, 3]])


def test_shape_of_is_the_shape_value() -> None:
    """shape_of needs no kernel: the argument's struct info has the dims."""
    w = Var("w", T(m))  # defines m
    x = Var("x", T(n, m + 1))
    y = Var("y", TensorInfo(None, "float32", 2))
    bb = BlockBuilder()
    with bb.function("main", [w, x, y]):
        s = bb.emit(op.shape_of(x))
        t = bb.emit(op.shape_of(y))
        bb.emit_func_output([s, t])
    mod = Legalize()(bb.get())
    values = [bnd.value for blk in mod["main"].body.blocks for bnd in blk.bindings]  # type: ignore[union-attr]
    assert isinstance(values[0], ShapeExpr) and values[0].values == (n, m + 1)
    assert getattr(getattr(values[1], "callee", None), "name", None) == "shape_of"  # unknown shape: left to the VM
