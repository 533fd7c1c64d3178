"""The many-rows matmul tiles as each vector register file sizes them (AVX2: 6 x 16, strips of a
wider panel; AVX-512: 8 x 32, a tile across two 16-column panels), checked against NumPy on
every host (only speed depends on the host): symbolic rows including 1 and odd counts past a
tile, K and N that no tile divides, a packed and a plain B, with a bias, an activation and a
residual fused into the tile store.

Only in the long tier: on AVX-512 (a register file variant) the rest row
tiles, the last column tile's unguarded lane stores and the narrow outputs (the rules that
AVX2's checks run, at 8 rows and 32 columns a tile; AVX-512's tile across two panels runs in
``test_tiles_match_numpy`` and ``test_partial_column_tiles``), and AVX2's partial column tiles
at widths 40, 72 and 120 (a last tile of 8 columns, as at 24 and 88)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from tests.long import LONG, long_param
from tilework import te
from tilework.codegen import build_library
from tilework.ir import sym
from tilework.ir.loop import Allocate, For, IfThenElse, TensorFunc, walk_scalars
from tilework.ir.sym import Dim, SymVar
from tilework.schedule import default_schedule
from tilework.schedule.rules.matmul import outside_guards, register_tile
from tilework.schedule.tree import dim_vars, walk
from tilework.te.tensor import TensorLoad
from tilework.transform.layout_weights import lay_out

ROWS = (1, 5, 7, 8, 13, 33, 257)
K, N = 37, 70  # no tile divides either


Epilogue = Callable[[te.Tensor, te.Tensor, te.Tensor], te.Tensor]

EPILOGUES: dict[str, tuple[Epilogue, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]]] = {
    "bias": (
        lambda y, b, r: te.compute(y.shape, lambda i, j: y[i, j] + b[j], "out"),
        lambda y, b, r: y + b,
    ),
    "bias_silu": (
        lambda y, b, r: te.compute(y.shape, lambda i, j: (y[i, j] + b[j]) * te.sigmoid(y[i, j] + b[j]), "out"),
        lambda y, b, r: (y + b) / (1 + np.exp(-(y + b))),
    ),
    "bias_relu6": (  # MobileNet's
        lambda y, b, r: te.compute(y.shape, lambda i, j: te.minimum(te.maximum(y[i, j] + b[j], 0.0), 6.0), "out"),
        lambda y, b, r: np.clip(y + b, 0, 6),
    ),
    "bias_residual": (
        lambda y, b, r: te.compute(y.shape, lambda i, j: y[i, j] + b[j] + r[i, j], "out"),
        lambda y, b, r: y + b + r,
    ),
}


def _linear(m: Dim, panel: int | None, epilogue: Epilogue, n: int = N, k: int = K) -> TensorFunc:
    """``epilogue(a @ w.T, bias, res)`` (``n`` columns, ``k`` deep) with ``w`` packed in
    column panels (``panel``) or a plain ``b[k, j]`` (None)."""
    a = te.placeholder((m, k), "float32", "a")
    if panel is None:
        w = te.placeholder((k, n), "float32", "w")
    else:
        w = te.placeholder((-(-n // panel), k, panel), "float32", "w")
    bias = te.placeholder((n,), "float32", "bias")
    res = te.placeholder((m, n), "float32", "res")

    def wv(r: object, j: object) -> TensorLoad:
        assert isinstance(j, SymVar)
        return w[r, j] if panel is None else w[sym.floordiv(j, panel), r, sym.floormod(j, panel)]

    r = te.reduce_axis(k, "r")
    y = te.compute((m, n), lambda i, j: te.sum(a[i, r] * wv(r, j), axis=r), "y")
    return te.create_func([a, w, bias, res, epilogue(y, bias, res)])


# AVX2 in the default run, AVX-512 in the long tier: the rule AVX2's check runs, at its tile
AVX2_DEFAULT = pytest.mark.parametrize(
    "registers",
    [pytest.param("32x16", id="avx2"), long_param("64x32", id="avx512", why="the rule of the AVX2 check at AVX-512's tile")],
    indirect=True,
)


def test_register_tile_fits_the_file(registers: str) -> None:
    rows, cols = register_tile("float32")
    width, count = (int(x) for x in registers.split("x"))
    assert cols == 2 * width // 4 and rows * 2 + 4 <= count  # accumulators, B vectors, a broadcast
    assert register_tile("float64") == (rows, cols // 2)


CASES = {  # name: (panel, epilogue); one library a register file keeps the test short
    "p16_bias": (16, "bias"),
    "p16_silu": (16, "bias_silu"),
    "p32_residual": (32, "bias_residual"),
    "plain_silu": (None, "bias_silu"),
}


def test_tiles_match_numpy(registers: str) -> None:
    m = SymVar("M", 1)
    funcs = {name: default_schedule(_linear(m, panel, EPILOGUES[ep][0]), strict=True) for name, (panel, ep) in CASES.items()}
    rows_, cols = register_tile("float32")
    for name, f in funcs.items():
        assert f.attrs["schedule_rule"] == "matmul"
        panel = CASES[name][0]
        shapes = {s.buffer.shape for _, s in walk(f.body) if isinstance(s, Allocate)}
        # a tile as wide as the register tile: strips of a wider panel, or across narrower ones
        assert (rows_, cols) in shapes, (name, shapes)
    lib = build_library(funcs)
    assert "/ 16" not in lib.source() and "/ 32" not in lib.source()  # packed indices without division
    rng = np.random.default_rng(7)
    wt = rng.standard_normal((N, K)).astype(np.float32)  # [out, in]
    bias = rng.standard_normal(N).astype(np.float32)
    for rows in ROWS:
        a = rng.standard_normal((rows, K)).astype(np.float32)
        res = rng.standard_normal((rows, N)).astype(np.float32)
        for name, (panel, ep) in CASES.items():
            wd = np.ascontiguousarray(wt.T) if panel is None else lay_out(wt, panel)
            out = np.full((rows, N), np.nan, np.float32)
            lib[name].run([a, wd, bias, res, out])
            want = EPILOGUES[ep][1](a.astype(np.float64) @ wt.T.astype(np.float64), bias, res)
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} rows={rows}")


# MobileNet's 1x1 convs and an odd width: no tile divides them. A 32-column tile over 16-column
# panels: 24 and 88 end in an empty panel, 37 past the last one (its panel index clamped).
# AVX2's 40, 72 and 120 (a last tile of 8 columns, as at 24 and 88) in the long tier only.
WIDTHS = {"32x16": (24, 37, 88) + ((40, 72, 120) if LONG else ()), "64x32": (24, 37, 88)}


def test_partial_column_tiles(registers: str) -> None:
    """Output widths that no tile divides: the last column tile computes whole panels (a
    packed weight is zero past ``N``; a plain B is packed so for the many-rows tiles), the
    last row tile copies of its last row, with neither a row nor a column guard in ``k``:
    only the stores are guarded."""
    m = SymVar("M", 1)
    funcs = {f"p16_{n}": _linear(m, 16, EPILOGUES["bias_relu6"][0], n) for n in WIDTHS[registers]}
    funcs["plain_37"] = _linear(m, None, EPILOGUES["bias"][0], 37)
    funcs = {name: default_schedule(f, strict=True) for name, f in funcs.items()}
    for name, f in funcs.items():  # a plain B: the many-rows tiles (its few-rows ones read B itself)
        body = f.body.else_body if name.startswith("plain") and isinstance(f.body, IfThenElse) else f.body
        assert body is not None and outside_guards(body, frozenset({"y", "y_init"})), name
    lib = build_library(funcs)
    rng = np.random.default_rng(11)
    for name, f in funcs.items():
        n = int(name.split("_")[1])
        panel = None if name.startswith("plain") else 16
        ep = "bias" if panel is None else "bias_relu6"
        wt = rng.standard_normal((n, K)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        wd = np.ascontiguousarray(wt.T) if panel is None else lay_out(wt, panel)
        for rows in (1, 7, 33):
            a = rng.standard_normal((rows, K)).astype(np.float32) / 2  # within relu6's range
            res = np.zeros((rows, n), np.float32)
            out = np.full((rows, n), np.nan, np.float32)
            lib[name].run([a, wd, bias, res, out])
            want = EPILOGUES[ep][1](a.astype(np.float64) @ wt.T.astype(np.float64), bias, res)
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} rows={rows}")


def _lane_guards(s: object) -> list[IfThenElse]:
    """The ``if``s inside a vector loop that test that loop's lane."""
    out = []
    for _, f in walk(s):  # type: ignore[arg-type]
        if isinstance(f, For) and f.kind == "vectorized":
            for _, g in walk(f.body):
                if isinstance(g, IfThenElse) and any(f.var in dim_vars(x) for x in walk_scalars(g.cond) if isinstance(x, (int, sym.SymExpr))):
                    out.append(g)
    return out


@AVX2_DEFAULT
def test_last_column_tile_stores_its_lanes_in_bounds_without_tests(registers: str) -> None:
    """A static width that the tile (16 columns on AVX2, 32 across two panels on AVX-512) does
    not divide: the last column tile's store runs its lanes in bounds (``N`` modulo the tile)
    as a vector loop of that length, with no lane test (a lane-tested store made GCC keep the
    accumulators of every tile in memory). Nothing is written past the output (a sentinel row
    after it), at row counts that end in a partial row tile."""
    m = SymVar("M", 1)
    funcs = {f"p16_{n}": default_schedule(_linear(m, 16, EPILOGUES["bias_relu6"][0], n, k=16), strict=True) for n in (24, 37, 72, 88)}
    for name, f in funcs.items():
        assert not _lane_guards(f.body), name
    lib = build_library(funcs)
    rng = np.random.default_rng(5)
    for name in funcs:
        n = int(name.split("_")[1])
        wt = rng.standard_normal((n, 16)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        for rows in (1, 7, 33):
            a = rng.standard_normal((rows, 16)).astype(np.float32) / 2
            res = np.zeros((rows, n), np.float32)
            out = np.full((rows + 1, n), np.nan, np.float32)
            lib[name].run([a, lay_out(wt, 16), bias, res, out[:rows]])
            want = EPILOGUES["bias_relu6"][1](a.astype(np.float64) @ wt.T.astype(np.float64), bias, res)
            np.testing.assert_allclose(out[:rows], want, rtol=1e-4, atol=1e-4, err_msg=f"{name} rows={rows}")
            assert np.isnan(out[rows]).all(), f"{name} rows={rows}: written past the output"


@AVX2_DEFAULT
def test_narrow_outputs_take_tiles_no_wider_than_b(registers: str) -> None:
    """At most one tile's width of columns (a stem conv's 16 output channels as a linear of
    its column matrix, in one 16-column panel, or 5 and 9 columns of a plain B): the many-rows
    tile is as wide as the columns rounded up to a vector, not the register tile's two vectors
    (half of them zero columns), and the values are NumPy's at odd row counts."""
    m = SymVar("M", 1)
    width = int(registers.split("x")[0]) // 4  # floats of a vector
    cases = {"p16_16": (16, 16), "plain_5": (None, 5), "plain_9": (None, 9)}
    funcs = {name: default_schedule(_linear(m, panel, EPILOGUES["bias"][0], n, 27), strict=True) for name, (panel, n) in cases.items()}
    rows_, _ = register_tile("float32")
    for name, f in funcs.items():
        n = cases[name][1]
        shapes = {s.buffer.shape for _, s in walk(f.body) if isinstance(s, Allocate)}
        assert (rows_, -(-n // width) * width) in shapes, (name, shapes)
    lib = build_library(funcs)
    rng = np.random.default_rng(5)
    for name, (panel, n) in cases.items():
        wt = rng.standard_normal((n, 27)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        wd = np.ascontiguousarray(wt.T) if panel is None else lay_out(wt, panel)
        for rows in (1, 7, 9, 33, 100):
            a = rng.standard_normal((rows, 27)).astype(np.float32)
            out = np.full((rows, n), np.nan, np.float32)
            lib[name].run([a, wd, bias, np.zeros((rows, n), np.float32), out])
            np.testing.assert_allclose(out, a.astype(np.float64) @ wt.T.astype(np.float64) + bias, rtol=1e-4, atol=1e-4, err_msg=f"{name} rows={rows}")


@AVX2_DEFAULT
def test_rest_row_tiles(registers: str) -> None:
    """Enough column tiles that they alone run in parallel: the row tiles are ``M // MR`` full
    ones and, when rows are left, one of that many rows rounded up to an even count (chosen at
    run time; an 8-row matmul on 6-row tiles computed 12 rows), every one without guards in
    ``k``. Checked at symbolic M past and within each rest size, an odd K and a partial last
    column tile; a plain B of 16 panels is packed in groups of panels."""
    m = SymVar("M", 1)
    n = 16 * 8 * (2 if registers == "64x32" else 1) + 5
    widths = {"p16": n, "plain": n, "plain_grouped": 16 * 16 * (2 if registers == "64x32" else 1) - 3}
    funcs = {
        "p16": _linear(m, 16, EPILOGUES["bias_silu"][0], n),
        "plain": _linear(m, None, EPILOGUES["bias"][0], n),
        "plain_grouped": _linear(m, None, EPILOGUES["bias"][0], widths["plain_grouped"]),
    }
    funcs = {name: default_schedule(f, strict=True) for name, f in funcs.items()}
    rows_ = register_tile("float32")[0]
    for name, f in funcs.items():
        body = f.body.else_body if isinstance(f.body, IfThenElse) else f.body  # the many-rows tiles
        assert body is not None and outside_guards(body, frozenset({"y", "y_init"})), name
        unrolled = {x.extent for _, x in walk(body) if isinstance(x, For) and x.kind == "unrolled"}
        assert set(range(2, rows_ + 1, 2)) <= unrolled, (name, unrolled)  # the rest tiles' rows
    groups = [x for _, x in walk(funcs["plain_grouped"].body) if isinstance(x, For) and x.var.name.endswith("_panels_g")]
    assert groups and groups[0].kind == "parallel"
    lib = build_library(funcs)
    rng = np.random.default_rng(5)
    for name, f in funcs.items():
        nn = widths[name]
        wt = rng.standard_normal((nn, K)).astype(np.float32)
        bias = rng.standard_normal(nn).astype(np.float32)
        panel = 16 if name == "p16" else None
        ep = "bias_silu" if panel else "bias"
        wd = np.ascontiguousarray(wt.T) if panel is None else lay_out(wt, panel)
        for rows in (1, 3, 7, 8, 9, 10, 11, 13, 14, 15, 17, 24, 31):
            a = rng.standard_normal((rows, K)).astype(np.float32)
            res = np.zeros((rows, nn), np.float32)
            out = np.full((rows, nn), np.nan, np.float32)
            lib[name].run([a, wd, bias, res, out])
            want = EPILOGUES[ep][1](a.astype(np.float64) @ wt.T.astype(np.float64), bias, res)
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} rows={rows}")


def test_one_row_tile_spans_a_threads_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """Few rows of A against a plain B: the tile spans a thread's share of the columns (here two
    threads, 1037 columns: tiles of 528 and a partial one; 512 at 7 rows, its accumulators
    within 16 KB) and, when 4 divides K, adds 4 rows of B at a time (``jam_k``); checked
    against NumPy at M = 1, 2, 3, 5, 7 and a many-rows count, K = 36 and 37."""
    from tilework.schedule.rules import matmul

    monkeypatch.setattr(matmul, "host_threads", lambda: 2)
    n = 1037
    m = SymVar("M", 1)
    funcs = {f"k{k}": default_schedule(_linear(m, None, EPILOGUES["bias"][0], n, k), strict=True) for k in (36, 37)}
    for name, f in funcs.items():
        widths = {x.extent for _, x in walk(f.body) if isinstance(x, For) and x.kind == "vectorized"}
        assert {528, 512} <= widths, widths
        tiles = [x for _, x in walk(f.body) if isinstance(x, For) and x.kind == "vectorized" and x.extent == 528]
        jammed = [y for x in tiles for _, y in walk(x.body) if isinstance(y, For) and y.kind == "unrolled" and y.extent == 4]
        assert bool(jammed) == (name == "k36"), name
    lib = build_library(funcs)
    rng = np.random.default_rng(3)
    for name in funcs:
        k = int(name[1:])
        wt = rng.standard_normal((n, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        for rows in (1, 2, 3, 5, 7, 9):
            a = rng.standard_normal((rows, k)).astype(np.float32)
            out = np.full((rows, n), np.nan, np.float32)
            lib[name].run([a, np.ascontiguousarray(wt.T), bias, np.zeros((rows, n), np.float32), out])
            want = a.astype(np.float64) @ wt.T.astype(np.float64) + bias
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} rows={rows}")


def test_few_rows_tiles_over_panels_fit_the_registers(registers: str) -> None:
    """A few-rows tile over a B packed in 16-float panels is two panels wide (two streams of
    B) while its accumulators fit the register file with a vector of B and a broadcast of A,
    else one: with AVX2's 16 registers of 8 floats from 4 rows on, never with AVX-512's."""
    from tilework.schedule.rules.matmul import panel_columns

    for r in range(1, 8):
        want = 16 if registers == "32x16" and r >= 4 else 32
        assert panel_columns(16, r, "float32") == want, (registers, r)
    assert panel_columns(32, 7, "float32") == 32  # one panel already


# (columns, the tile on AVX-512's register file): widths of whole 16-column panels that a
# 32-column tile does not divide take a tile of 3 or 5 vectors that does (EfficientNet's
# 80-output 1x1 convs, MobileNetV2's 144); 96 keeps the 8 x 32 tile; 112 (7 vectors: a tile
# of 3 rows, slower) and 208 (13) have no exact tile and keep it too. AVX2's 16-column tile
# is a panel: unchanged.
EXACT = {48: (8, 48), 80: (5, 80), 112: (8, 32), 144: (8, 48), 96: (8, 32), 208: (8, 32)}


def test_exact_column_tiles(registers: str) -> None:
    """A tile as wide as a divisor of the output width, in whole panels: no last column tile
    computing zeros; numerics against NumPy at rows of one tile, a partial one and several."""
    m = SymVar("M", 1)
    funcs = {f"p16_{n}": default_schedule(_linear(m, 16, EPILOGUES["bias_silu"][0], n), strict=True) for n in EXACT}
    rows_, cols = register_tile("float32")
    for name, f in funcs.items():
        n = int(name.split("_")[1])
        want = EXACT[n] if registers == "64x32" else (rows_, cols)
        shapes = {s.buffer.shape for _, s in walk(f.body) if isinstance(s, Allocate)}
        assert want in shapes, (name, shapes)
        assert outside_guards(f.body, frozenset({"y", "y_init"})), name
    lib = build_library(funcs)
    rng = np.random.default_rng(13)
    for name in funcs:
        n = int(name.split("_")[1])
        wt = rng.standard_normal((n, K)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        for rows in (1, 5, 8, 33):
            a = rng.standard_normal((rows, K)).astype(np.float32)
            out = np.full((rows, n), np.nan, np.float32)
            lib[name].run([a, lay_out(wt, 16), bias, np.zeros((rows, n), np.float32), out])
            want_ = EPILOGUES["bias_silu"][1](a.astype(np.float64) @ wt.T.astype(np.float64), bias, np.zeros((rows, n)))
            np.testing.assert_allclose(out, want_, rtol=1e-4, atol=1e-4, err_msg=f"{name} rows={rows}")
