"""The default schedule rules: which rule each kernel gets, the shape of the schedule it
makes, and numerics against NumPy, through the interpreter at small sizes (1 and odd ones)
and through the compiled C kernels at sizes spanning several tiles and vectors."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest

from tests.schedule import kernels
from tests.schedule.helpers import SIZES, check_kernel, well_formed
from tilework.codegen import CKernelModule, build_library
from tilework.codegen.interp import run
from tilework.ir.loop import Allocate, Binary, Buffer, For, IfThenElse, Load, Store, TensorFunc
from tilework import te
from tilework.ir import sym
from tilework.ir.sym import Dim, SymVar
from tilework.schedule import default_schedule
from tilework.schedule.rules import elementwise, fallback, gemv, matmul, reduction
from tilework.schedule.rules.common import top_nests
from tilework.schedule.rules.matmul import register_tile
from tilework.schedule.tree import blocks_of, walk

F32 = "float32"

EXPECTED_RULE = {
    "add": "elementwise",
    "broadcast_add": "elementwise",
    "transpose": "elementwise",
    "add_relu": "elementwise",
    "gather": "elementwise",
    "row_sum": "reduction",
    "softmax": "reduction",
    "layer_norm": "reduction",
    "matmul": "matmul",
    "matmul_rows": "matmul",
    "linear": "matmul",
    "gemv_dot": "gemv",
    "gemv_axpy": "gemv",
    "cumsum": "fallback",
}


def _kinds(f: TensorFunc) -> list[str]:
    return [s.kind for _, s in walk(f.body) if isinstance(s, For)]


def _allocs(f: TensorFunc) -> dict[str, tuple]:
    return {s.buffer.name: s.buffer.shape for _, s in walk(f.body) if isinstance(s, Allocate)}


@pytest.fixture(scope="module")
def scheduled() -> dict[str, TensorFunc]:
    return {name: default_schedule(mk(), strict=True) for name, (mk, _, _) in kernels.KERNELS.items()}


@pytest.mark.parametrize("name", sorted(EXPECTED_RULE))
def test_unscheduled_kernels_match_numpy(name: str) -> None:
    check_kernel(kernels.KERNELS[name][0](), name)  # the baseline every schedule is held to


@pytest.mark.parametrize("name", sorted(EXPECTED_RULE))
def test_rule_and_numerics(name: str, scheduled: dict[str, TensorFunc]) -> None:
    f = scheduled[name]
    assert f.attrs["scheduled"] is True
    assert f.attrs["schedule_rule"] == EXPECTED_RULE[name]
    check_kernel(f, name)
    well_formed(f)


def test_default_schedule_leaves_a_scheduled_function_alone(scheduled: dict[str, TensorFunc]) -> None:
    f = scheduled["matmul"]
    assert default_schedule(f) is f


def test_elementwise_schedule_shape(scheduled: dict[str, TensorFunc]) -> None:
    assert _kinds(scheduled["add"]) == ["parallel", "vectorized"]
    assert _kinds(scheduled["transpose"]) == ["parallel", "serial", "vectorized"]  # 16 x 16 tiles
    f = scheduled["add_relu"]  # one dim: split so that it can be both parallel and vector
    assert [b.name for b in blocks_of(f)] == ["c"]
    assert _kinds(f) == ["parallel", "vectorized"]


def test_reduction_keeps_each_row_under_one_parallel_loop(scheduled: dict[str, TensorFunc]) -> None:
    for name in ("softmax", "layer_norm"):
        f = scheduled[name]
        (top,) = top_nests(f)
        assert top.kind == "parallel"
        names = [b.name for b in blocks_of(f)]
        assert all(any(s is b for _, s in walk(top)) for b in blocks_of(f)), names
        assert sum(n.endswith("_rf") for n in names) == 2, names  # both reductions vectorized
    f = scheduled["row_sum"]
    # partial sums in vectors; the last, partial vector is a separate copy with bounds tests;
    # the partials are then added pairwise in halving steps
    tree = [f"c_tree{h}" for h in (32, 16, 8, 4, 2, 1)]
    assert [b.name for b in blocks_of(f)] == ["c_rf_init", "c_rf", "c_rf_1", *tree, "c"]
    assert _allocs(f) == {"c_rf": (64,)}
    assert _kinds(f)[0] == "parallel" and "vectorized" in _kinds(f)


def test_matmul_schedule_shape(scheduled: dict[str, TensorFunc]) -> None:
    f = default_schedule(kernels.matmul(m=64), strict=True)
    # b packed in panels as wide as the tile once a call, then tiles of 8 x 32 (AVX-512) or 6 x 16
    # (AVX2); the store of a tile whose columns are all in bounds (N symbolic) runs unguarded
    assert [b.name for b in blocks_of(f)] == ["b_panels", "c_init", "c", "c_store", "c_store"]
    rows, cols = register_tile("float32")
    allocs = _allocs(f)
    assert allocs.keys() == {"b_panels", "c_local"} and allocs["c_local"] == (rows, cols) and allocs["b_panels"][-1] == cols
    kinds = _kinds(f)
    assert kinds[0] == "parallel" and "unrolled" in kinds and "vectorized" in kinds
    update = next(b for b in blocks_of(f) if b.name == "c")
    assert update.init is None


def _cond(c: object) -> str:
    assert isinstance(c, Binary)
    return f"{c.a} {c.op} {c.b}"


def test_symbolic_rows_choose_a_schedule_at_run_time(scheduled: dict[str, TensorFunc]) -> None:
    f = scheduled["matmul"]
    assert isinstance(f.body, IfThenElse) and _cond(f.body.cond) == "M < 8"
    few, many = f.body.then_body, f.body.else_body
    assert many is not None
    # few rows: a tile of exactly M rows, picked by M's value (N symbolic: 16 vectors wide,
    # the accumulators in L1)
    assert {s.buffer.shape for _, s in walk(few) if isinstance(s, Allocate)} == {(r, 256) for r in range(1, 8)}
    assert isinstance(few, IfThenElse) and _cond(few.cond) == "M == 1"
    shapes = {s.buffer.shape for _, s in walk(many) if isinstance(s, Allocate)}
    assert register_tile("float32") in shapes and len(shapes) == 2  # and b packed in panels
    g = scheduled["linear"]  # dot products for few rows; a transposed copy of w and tiles for many
    assert isinstance(g.body, IfThenElse) and _cond(g.body.cond) == "n < 64"
    assert any(b.name == "w_cache" for b in blocks_of(g))
    assert any(b.name == "y_sum_rf" for b in blocks_of(g))


def test_gemv_schedules(scheduled: dict[str, TensorFunc]) -> None:
    dot = scheduled["gemv_dot"]
    tree = [f"y_tree{h}" for h in (32, 16, 8, 4, 2, 1)]
    assert [b.name for b in blocks_of(dot)] == ["y_rf_init", "y_rf", "y_rf_1", *tree, "y"]
    axpy = scheduled["gemv_axpy"]
    assert _allocs(axpy) == {"y_local": (1, 256)}
    assert _kinds(axpy)[0] == "parallel"


def test_fallback_parallelizes_the_independent_rows_of_a_scan(scheduled: dict[str, TensorFunc]) -> None:
    assert _kinds(scheduled["cumsum"]) == ["parallel", "serial"]


def test_fallback_on_stores_outside_blocks() -> None:
    n, i = SymVar("n", 1), SymVar("i")
    a, b = Buffer("a", (n,), "float32"), Buffer("b", (n,), "float32")
    f = TensorFunc((a, b), For(i, n, Store(b, (i,), Load(a, (i,)))))
    g = default_schedule(f, strict=True)
    assert g.attrs["schedule_rule"] == "fallback"
    assert _kinds(g) == ["parallel"]
    x = np.arange(5, dtype=np.float32)
    y = np.zeros(5, np.float32)
    run(g, [x, y])
    np.testing.assert_array_equal(x, y)


def test_rules_decline_other_kinds() -> None:
    add, mm, rs = kernels.add(), kernels.matmul(), kernels.row_sum()
    assert matmul.apply(add) is None and matmul.apply(rs) is None
    assert gemv.apply(mm) is None and gemv.apply(add) is None
    assert reduction.apply(add) is None and reduction.apply(kernels.cumsum()) is None
    assert elementwise.apply(rs) is None and elementwise.apply(mm) is None
    assert fallback.apply(kernels.cumsum()) is not None


def test_matmul_variants() -> None:
    cases = {
        "static": (kernels.matmul(m=24, n=64, k=16), [dict(n=24, m=64, k=16)]),
        "batched": (kernels.matmul(batch=SymVar("B", 1)), None),
        "epilogue": (kernels.matmul_bias_relu(), None),
        "one_row": (kernels.matmul(m=1), [dict(n=1, m=40, k=9)]),
    }
    rng = np.random.default_rng(1)
    for label, (f, sizes) in cases.items():
        g = default_schedule(f, strict=True)
        want_rule = "gemv" if label == "one_row" else "matmul"
        assert g.attrs["schedule_rule"] == want_rule, label
        well_formed(g)
        if label == "batched":
            a = rng.standard_normal((3, 9, 5)).astype(np.float32)
            b = rng.standard_normal((3, 5, 33)).astype(np.float32)
            _check(g, [a, b], a @ b)
        elif label == "epilogue":
            # relu(c + bias) is inlined into the tile store of every schedule (1..7 rows, many)
            names = [b.name for b in blocks_of(g)]
            assert {n.split("_1")[0] for n in names} == {"b_panels", "c_init", "c", "c_store"}
            assert sum(n.startswith("c_store") for n in names) >= 8
            for rows in (1, 2, 5, 7, 8, 11):
                a = rng.standard_normal((rows, 24)).astype(np.float32)
                b = rng.standard_normal((24, 48)).astype(np.float32)
                bias = rng.standard_normal(48).astype(np.float32)
                _check(g, [a, b, bias], np.maximum(a @ b + bias, 0))
        else:
            assert sizes is not None
            check_kernel(g, "matmul", sizes)


def _check(f: TensorFunc, ins: list[np.ndarray], want: np.ndarray) -> None:
    out = np.full(want.shape, np.nan, np.float32)
    run(f, [*ins, out])
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


# -- compiled C ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def library(scheduled: dict[str, TensorFunc]) -> Iterator[CKernelModule]:
    yield build_library(scheduled)


C_SIZES = SIZES + [dict(n=67, m=130, k=259), dict(n=16, m=64, k=128)]


@pytest.mark.parametrize("name", sorted(EXPECTED_RULE))
def test_compiled_kernels_match_numpy(name: str, library: CKernelModule, scheduled: dict[str, TensorFunc]) -> None:
    kern = library[name]
    check_kernel(scheduled[name], name, C_SIZES, runner=lambda f, arrays: kern.run(arrays), seed=2)


def test_compiled_matmul_at_every_few_rows_count(library: CKernelModule, scheduled: dict[str, TensorFunc]) -> None:
    """Each row count below the many-rows schedule runs its own tile (M == 1 .. 7), and the
    many-rows tiles start at 8: every count there and just past it, odd column and k sizes."""
    kern = library["matmul"]
    sizes = [dict(n=rows, m=37, k=70) for rows in range(1, 12)] + [dict(n=3, m=300, k=5)]
    check_kernel(scheduled["matmul"], "matmul", sizes, runner=lambda f, arrays: kern.run(arrays), seed=3)


def _packed_matmul(m: Dim, k: Dim, n: int, panel: int) -> TensorFunc:
    """``c = a @ w.T`` with ``w`` packed in column panels: ``wp[j // panel, r, j % panel]``."""
    a = te.placeholder((m, k), F32, "a")
    wp = te.placeholder((-(-n // panel), k, panel), F32, "wp")
    r = te.reduce_axis(k, "r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * wp[sym.floordiv(j, panel), r, sym.floormod(j, panel)], axis=r), "c")
    return te.create_func([a, wp, c])


def test_packed_weights_take_register_tiles_one_panel_wide() -> None:
    """A B packed in column panels is a matmul (and a GEMV for one row) whose tiles are one
    panel wide, at every row count, odd column and k sizes (symbolic k: the linear_io cases of
    tests/op/test_legalize_linalg.py); the C index of the packed weight has no division left
    (the compiler would gather)."""
    from tilework.transform.layout_weights import lay_out

    funcs = {
        "sym": _packed_matmul(SymVar("M", 1), 37, 70, 32),
        "one_row": _packed_matmul(1, 29, 70, 32),
    }
    scheduled = {name: default_schedule(f, strict=True) for name, f in funcs.items()}
    assert scheduled["one_row"].attrs["schedule_rule"] == "gemv"
    assert scheduled["sym"].attrs["schedule_rule"] == "matmul"
    # few rows: one panel; many: one panel, or strips of it as wide as the host's register tile
    assert {s.buffer.shape[-1] for _, s in walk(scheduled["sym"].body) if isinstance(s, Allocate)} == {32, min(32, register_tile("float32")[1])}
    lib = build_library(scheduled)
    assert "/ 32" not in lib.source() and "% 32" not in lib.source()
    rng = np.random.default_rng(4)
    for name, rows_list, k, n, panel in (("sym", range(1, 20), 37, 70, 32), ("one_row", (1,), 29, 70, 32)):
        w = rng.standard_normal((n, k)).astype(np.float32)
        for rows in rows_list:
            a = rng.standard_normal((rows, k)).astype(np.float32)
            out = np.full((rows, n), np.nan, np.float32)
            lib[name].run([a, lay_out(w, panel), out])
            np.testing.assert_allclose(out, a @ w.T, rtol=2e-5, atol=2e-5, err_msg=f"{name} rows={rows}")


def test_a_failing_rule_declines_unless_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(func: TensorFunc) -> TensorFunc:
        raise RuntimeError("a bug in the rule")

    monkeypatch.setattr(elementwise, "apply", broken)
    g = default_schedule(kernels.add())
    assert g.attrs["schedule_rule"] == "fallback"
    check_kernel(g, "add")
    with pytest.raises(RuntimeError, match="a bug in the rule"):
        default_schedule(kernels.add(), strict=True)
    monkeypatch.setattr(fallback, "apply", broken)
    h = default_schedule(kernels.add())  # even the fallback failed: left serial, as it was
    assert h.attrs["schedule_rule"] == "none" and h.attrs["scheduled"] is True
    assert _kinds(h) == ["serial", "serial"]


@pytest.mark.parametrize("static", [False, True])
def test_a_reduction_over_outer_axes_vectorizes_along_the_kept_axis(static: bool) -> None:
    """The mean of ``[N, H, W, C]`` over ``H, W`` (a global average pool, channel-last): the
    channel loop moves inside the reduction loops and runs vectorized (a scalar sum strided
    by ``C`` before); numerics against NumPy at 1 and odd sizes, compiled and interpreted."""
    nv, hv, wv, cv = (SymVar(s) for s in "nhwc")
    shape: tuple[Dim, ...] = (3, 70, 67, 17) if static else (nv, hv, wv, cv)
    x = te.placeholder(shape, F32, "x")
    kh, kw = te.reduce_axis(shape[1], "kh"), te.reduce_axis(shape[2], "kw")
    area = te.cast(sym.mul(shape[1], shape[2]), F32)
    out = te.compute((shape[0], 1, 1, shape[3]), lambda b, _i, _j, ch: te.sum(x[b, kh, kw, ch], axis=[kh, kw]) / area, "pool")
    f = default_schedule(te.create_func([x, out]), strict=True)
    assert f.attrs["schedule_rule"] == "reduction"
    well_formed(f)
    (update,) = [b for b in blocks_of(f) if b.name.endswith("_sum")]
    loops = [s for p, s in walk(f.body) if isinstance(s, For) and any(b is update for _, b in walk(s))]
    assert loops[-1].kind == "vectorized" and loops[-3].var.name == "kh"  # kh, kw, then the channels
    lib = build_library({"pool": f})
    rng = np.random.default_rng(3)
    for dims in [(3, 70, 67, 17)] if static else [(1, 1, 1, 1), (2, 5, 3, 17), (1, 9, 70, 33)]:
        xs = rng.standard_normal(dims).astype(F32)
        want = xs.mean(axis=(1, 2), keepdims=True)
        got = np.empty(want.shape, F32)
        lib["pool"].run([xs, got])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        if dims[1] * dims[2] <= 64:
            interp = np.empty(want.shape, F32)
            run(f, [xs, interp])
            np.testing.assert_allclose(interp, want, rtol=1e-5, atol=1e-6)
