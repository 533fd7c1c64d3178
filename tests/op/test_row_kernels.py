"""softmax, log_softmax, layer_norm and rms_norm as the reduction rule schedules them, against
float64 NumPy at row lengths around the 64-wide vector partials (1, 7, 33, 130, 1000) and at
several row counts; special values (a row of -inf, a NaN, huge magnitudes); float16 and
bfloat16 inputs. Also the shape of the schedule: softmax evaluates ``exp`` once per element
and keeps it in its output, the row statistics live in one element inside the row loop, the
vector partials are combined in halving steps, and fused with a prologue and an epilogue
through the VM the kernels keep their numerics."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.legalize_harness import Built, Case, build, check, envs, shape_at
from tests.op.test_legalize_nn import layer_norm_ref, rms_norm_ref, softmax_ref
from tilework.ir import sym
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.ir.loop import Allocate, For, Intrin, TensorFunc, stmt_scalars, walk_scalars, walk_stmts
from tilework.ir.sym import SymVar
from tilework.schedule import default_schedule
from tilework.schedule.tree import blocks_of
from tilework.transform.fuse_tensor import fusion_passes
from tilework.transform.legalize import Legalize

n, m = tw.dim("n"), tw.dim("m")
ROWS = envs({n: 1, m: 1}, {n: 7, m: 7}, {n: 3, m: 33}, {n: 33, m: 130}, {n: 5, m: 1000})


def T(*shape: Any, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(tuple(shape), dtype)


def _special(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
    """Rows of huge values, a row with a NaN, a row of -inf, a row with some -inf."""
    x = (rng.standard_normal(shape_at((n, m), env)) * 1e4).astype(np.float32)
    rows, cols = x.shape
    if rows >= 4:
        x[1, cols // 2] = np.nan
        x[2, :] = -np.inf
        x[3, : (cols + 1) // 2] = -np.inf
    return [x]


def _sm(log: bool) -> Callable[..., np.ndarray]:
    def ref(x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return softmax_ref(x, -1, log)

    return ref


CASES = [
    Case("softmax", op.softmax, [T(n, m)], _sm(False), ROWS),
    Case("log_softmax", op.log_softmax, [T(n, m)], _sm(True), ROWS, tol=1e-4),
    Case("softmax_special", op.softmax, [T(n, m)], _sm(False), envs({n: 4, m: 7}, {n: 5, m: 130}), inputs=_special),
    Case("log_softmax_special", op.log_softmax, [T(n, m)], _sm(True), envs({n: 4, m: 7}, {n: 5, m: 130}), inputs=_special, tol=1e-4),
    Case("softmax_axis0", lambda x: op.softmax(x, 0), [T(n, m)], lambda x: softmax_ref(x, 0), ROWS),
    Case("softmax_float64", op.softmax, [T(n, m, dtype="float64")], _sm(False), ROWS, tol=1e-12),
    Case("softmax_float16", op.softmax, [T(n, m, dtype="float16")], _sm(False), ROWS, tol=4e-3),
    Case("softmax_bfloat16", op.softmax, [T(n, m, dtype="bfloat16")], _sm(False), ROWS, tol=3e-2),
    Case("layer_norm", op.layer_norm, [T(n, m), T(m), T(m)], lambda x, g, b: layer_norm_ref(x, g, b, (1,)), ROWS, tol=1e-4),
    Case("rms_norm", op.rms_norm, [T(n, m), T(m)], lambda x, w: rms_norm_ref(x, w, (1,)), ROWS, tol=1e-4),
    Case("layer_norm_bfloat16", op.layer_norm, [T(n, m, dtype="bfloat16"), T(m, dtype="bfloat16"), T(m, dtype="bfloat16")], lambda x, g, b: layer_norm_ref(x, g, b, (1,)), ROWS, tol=3e-2),
    Case("rms_norm_float16", op.rms_norm, [T(n, m, dtype="float16"), T(m, dtype="float16")], lambda x, w: rms_norm_ref(x, w, (1,)), ROWS, tol=4e-3),
]


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def _scheduled(make: Callable[..., Any], infos: list[TensorInfo]) -> TensorFunc:
    bb = BlockBuilder()
    params = [Var(f"p{i}", info) for i, info in enumerate(infos)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make(*params))
        bb.emit_func_output(out)
    (func,) = [f for _, f in Legalize()(bb.get()).tensor_funcs()]
    return default_schedule(func, strict=True)


def _intrinsics(f: TensorFunc, name: str) -> int:
    return sum(
        1
        for st in walk_stmts(f.body)
        for x in stmt_scalars(st)
        for e in walk_scalars(x)
        if isinstance(e, Intrin) and e.name == name
    )


def _allocs(f: TensorFunc) -> dict[str, tuple[Any, ...]]:
    return {st.buffer.name: st.buffer.shape for st in walk_stmts(f.body) if isinstance(st, Allocate)}


def test_softmax_keeps_its_exp_in_the_output() -> None:
    f = _scheduled(op.softmax, [T(n, m)])
    assert f.attrs["schedule_rule"] == "reduction"
    assert _intrinsics(f, "exp") == 1  # evaluated once per element
    allocs = _allocs(f)
    assert "exp" not in allocs, allocs  # no scratch of the input's size
    assert all(sym.product(shape) in (1, 64) for shape in allocs.values()), allocs
    top = f.body
    assert isinstance(top, For) and top.kind == "parallel"  # nothing allocated outside the rows


def test_narrow_softmax_recomputes_instead_of_keeping_float32_scratch() -> None:
    f = _scheduled(op.softmax, [T(n, m, dtype="float16")])
    assert _intrinsics(f, "exp") == 3  # the sum's vector loop, its scalar rest, the output
    assert all(sym.product(shape) in (1, 64) for shape in _allocs(f).values())


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "log_softmax"])
def test_row_statistics_stay_inside_the_row_loop(name: str) -> None:
    infos = {"layer_norm": [T(n, m), T(m), T(m)], "rms_norm": [T(n, m), T(m)], "log_softmax": [T(n, m)]}[name]
    f = _scheduled(getattr(op, name), infos)
    assert isinstance(f.body, For) and f.body.kind == "parallel"
    shapes = _allocs(f)
    assert shapes and all(s in ((1,), (64,)) for s in shapes.values()), shapes
    names = [b.name for b in blocks_of(f)]
    assert any(x.endswith("_tree32") for x in names) and any(x.endswith("_tree1") for x in names), names


def test_fused_prologue_and_epilogue_through_the_vm() -> None:
    x, scale, mask = Var("x", T(n, m)), Var("scale", T(m)), Var("mask", T(m))
    bb = BlockBuilder()
    with bb.function("main", [x, scale, mask]):
        with bb.dataflow():
            scores = bb.emit(op.add(op.multiply(x, scale), mask))
            probs = bb.emit(op.softmax(scores))
            out = bb.emit_output(op.multiply(probs, scale))
        bb.emit_func_output(out)
    exe = tw.build(bb.get(), post_legalize_passes=fusion_passes())
    kernels = exe.kernel_funcs
    assert len(kernels) == 1, list(kernels)
    (fused,) = kernels.values()
    assert _intrinsics(fused, "exp") == 1
    assert all(sym.product(s) in (1, 64) for s in _allocs(fused).values()), _allocs(fused)
    vm = tw.VM(exe)
    rng = np.random.default_rng(0)
    for rows, cols in ((1, 1), (7, 33), (3, 130)):
        a = rng.standard_normal((rows, cols)).astype(np.float32)
        w = rng.standard_normal(cols).astype(np.float32)
        c = rng.standard_normal(cols).astype(np.float32)
        got = vm["main"](a, w, c)
        np.testing.assert_allclose(got, softmax_ref(a * w + c, -1) * w, rtol=1e-5, atol=1e-6)
