"""The many-rows matmul tiles prefetch their part of the next column panel
(``tilework.schedule.rules.matmul_prefetch``): a hint that must change no value. Checked against
NumPy through the C kernels and the reference interpreter at symbolic rows 1, 4, 7, 8, 12, 32
and 33 (the few-rows tiles, one panel or two wide, full row tiles, a rest tile, fewer row tiles
than parts), K with and without a multiple of the parts and N past the last full panel, on each
register file's tiles; the kernels pass the verifier and print and parse back. Also: at every
row count of the many-rows tiles every line of every row of the next panel is hinted.

The default run checks the layout ``tilework.compile`` gives weights (``PANEL`` columns) on each
register file: one panel a tile on AVX2, a tile spanning two panels on AVX-512 (its hints line
by line; its values only in the long tier: a hint changes no value, as AVX2's check shows, and
``test_matmul_tiles`` checks the values of that tile). The ``tile`` layouts run only in the long
tier: AVX2's is its ``panels`` one (the same kernels), AVX-512's a panel a tile as on AVX2, in
a layout ``tilework.compile`` does not give."""

from __future__ import annotations


import numpy as np
import pytest

from tests.long import long_param
from tests.schedule.helpers import well_formed
from tilework import te
from tilework.codegen import build_library
from tilework.codegen.interp import run
from tilework.ir import sym
from tilework.ir.loop import Block, Intrin, Load, Store, TensorFunc, walk_scalars, walk_stmts
from tilework.ir.sym import SymVar
from tilework.schedule import default_schedule
from tilework.schedule.rules.matmul import MIN_COLUMN_TILES, NN_SMALL_ROWS, SPAN_HINT_ROWS, panel_columns, register_tile
from tilework.schedule.tree import walk
from tilework.te.tensor import TensorLoad
from tilework.transform.panels import PANEL, lay_out

ROWS = (1, 4, 7, 8, 12, 32, 33)
DEPTHS = (37, 64)  # K: not a multiple of the parts (the last rows of a panel clamp), and one


def _linear_silu(m: SymVar, k: int, n: int, panel: int) -> TensorFunc:
    """``silu(a @ w.T + bias)`` with ``w`` packed in column panels ``panel`` wide."""
    a = te.placeholder((m, k), "float32", "a")
    w = te.placeholder((-(-n // panel), k, panel), "float32", "w")
    bias = te.placeholder((n,), "float32", "bias")

    def wv(r: object, j: object) -> TensorLoad:
        assert isinstance(j, SymVar)
        return w[sym.floordiv(j, panel), r, sym.floormod(j, panel)]

    r = te.reduce_axis(k, "r")
    y = te.compute((m, n), lambda i, j: te.sum(a[i, r] * wv(r, j), axis=r), "y")
    out = te.compute((m, n), lambda i, j: (y[i, j] + bias[j]) * te.sigmoid(y[i, j] + bias[j]), "out")
    return te.create_func([a, w, bias, out])


def _prefetches(func: TensorFunc) -> list[Intrin]:
    return [
        x for _, b in walk(func.body) if isinstance(b, Block)
        for st in walk_stmts(b.body) if isinstance(st, Store)
        for x in walk_scalars(st.value) if isinstance(x, Intrin) and x.name == "prefetch"
    ]  # fmt: skip


# (register file, layout): AVX2's tiles are PANEL columns wide, its "tile" layout the same kernels
# The values at AVX-512's tile spanning two panels in the long tier too: the hints it places
# (both panels of the next tile) are checked line by line in the default run
VALUE_LAYOUTS = pytest.mark.parametrize(
    ("registers", "layout"),
    [
        long_param("32x16", "tile", id="avx2-tile", why="AVX2's panels layout again (its tile is PANEL wide)"),
        pytest.param("32x16", "panels", id="avx2-panels"),
        long_param("64x32", "tile", id="avx512-tile", why="a panel a tile, as on AVX2, in a layout tilework.compile does not give"),
        long_param("64x32", "panels", id="avx512-panels", why="the hints of a tile over two panels are checked line by line, the values on AVX2"),
    ],
    indirect=["registers"],
)
LAYOUTS = pytest.mark.parametrize(
    ("registers", "layout"),
    [
        long_param("32x16", "tile", id="avx2-tile", why="AVX2's panels layout again (its tile is PANEL wide)"),
        pytest.param("32x16", "panels", id="avx2-panels"),
        long_param("64x32", "tile", id="avx512-tile", why="a panel a tile, as on AVX2, in a layout tilework.compile does not give"),
        pytest.param("64x32", "panels", id="avx512-panels"),
    ],
    indirect=["registers"],
)


@VALUE_LAYOUTS
def test_prefetch_changes_no_value(registers: str, layout: str) -> None:
    """``tile``: panels as wide as a register tile (one panel a tile); ``panels``: the layout
    ``tilework.compile`` gives weights (``PANEL`` columns: AVX-512's tiles span two)."""
    tile = register_tile("float32")[1]
    panel = tile if layout == "tile" else PANEL
    n = tile * MIN_COLUMN_TILES + 5  # enough column tiles to run in parallel alone; a partial panel
    m = SymVar("M", 1)
    funcs = {f"k{k}": default_schedule(_linear_silu(m, k, n, panel), strict=True) for k in DEPTHS}
    for f in funcs.values():
        hints = _prefetches(f)
        assert len(hints) >= 2, "the full row tiles and the rest tile prefetch"
        assert all(isinstance(h.args[0], Load) and h.args[0].buffer.name == "w" for h in hints)
        well_formed(f)
    lib = build_library(funcs)
    assert "__builtin_prefetch(&w[" in lib.source()
    rng = np.random.default_rng(3)
    for k in DEPTHS:
        wt = rng.standard_normal((n, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        wd = lay_out(wt, panel)
        for rows in ROWS:
            a = rng.standard_normal((rows, k)).astype(np.float32)
            y = a.astype(np.float64) @ wt.T.astype(np.float64) + bias
            want = y / (1 + np.exp(-y))
            out = np.full((rows, n), np.nan, np.float32)
            lib[f"k{k}"].run([a, wd, bias, out])
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=f"C, K={k}, rows={rows}")
            if rows in (7, 33):  # the interpreter: the hint is 0 and reads nothing
                ref = np.full((rows, n), np.nan, np.float32)
                run(funcs[f"k{k}"], [a, wd, bias, ref])
                np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-4, err_msg=f"interp, K={k}, rows={rows}")


def test_no_prefetch_without_enough_panels() -> None:
    """Few column panels (the row tiles join the parallel loop): no prefetch."""
    m = SymVar("M", 1)
    f = default_schedule(_linear_silu(m, 37, 16 * 3, 16), strict=True)
    assert not _prefetches(f)


def _covered_lines(func: TensorFunc, m: SymVar, rows: int) -> list[tuple[int, int, int]]:
    """The (panel, row, first column) of each cache line of the next panels that the row tiles
    of column tile 0 prefetch at ``rows`` rows (a hint a line of a row, one row a ``k`` step):
    the statements run with the sym evaluator, branches taken on their conditions, loops
    enumerated where they hold a hint."""
    import operator

    from tilework.ir.loop import Binary, For, IfThenElse
    from tilework.ir.sym_walk import evaluate
    from tilework.schedule.tree import children

    ops = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "&&": operator.and_, "||": operator.or_}

    def value(c: object, env: dict[SymVar, int]) -> int:
        if isinstance(c, Binary):
            return int(ops[c.op](value(c.a, env), value(c.b, env)))
        return evaluate(c, env)  # type: ignore[arg-type]

    def hints(s: object) -> bool:
        return any(isinstance(x, Block) and x.name.startswith("w_next") for _, x in walk(s))  # type: ignore[arg-type]

    out: list[tuple[int, int, int]] = []

    def run_(s: object, env: dict[SymVar, int]) -> None:
        if not hints(s):
            return
        if isinstance(s, Block):
            bind = {iv.var: evaluate(iv.binding, env) for iv in s.iter_vars}
            for st in walk_stmts(s.body):
                if not isinstance(st, Store):
                    continue
                (hint,) = [x for x in walk_scalars(st.value) if isinstance(x, Intrin)]
                ahead = hint.args[0]
                assert isinstance(ahead, Load)
                panel, row, col = ahead.indices
                assert isinstance(panel, (int, sym.SymExpr)) and isinstance(row, (int, sym.SymExpr)) and isinstance(col, int)
                out.append((evaluate(panel, {**env, **bind}), evaluate(row, {**env, **bind}), col))
        elif isinstance(s, IfThenElse):
            branch = s.then_body if value(s.cond, env) else s.else_body
            if branch is not None:
                run_(branch, env)
        elif isinstance(s, For):
            for i in range(1 if s.kind == "parallel" else evaluate(s.extent, env)):  # panel 0
                run_(s.body, {**env, s.var: i})
        else:
            for c in children(s):  # type: ignore[arg-type]
                run_(c, env)

    run_(func.body, {m: rows})
    return out


@LAYOUTS
def test_fewer_row_tiles_than_parts_prefetch_the_whole_panel(registers: str, layout: str) -> None:
    """With 4 row tiles or more the first 4 prefetch a quarter of the next panel each; with 2
    or 3 (the rest tile counts) the first 2 a half each, with one it all: at every row count
    every line of every row of the next panel is prefetched (K a multiple of the parts; a hint
    a line of a row each ``k`` step, a row every 4, 2 or 1 steps; AVX-512's panel rows of 32
    floats are two lines). A tile spanning two 16-column panels (``panels`` on AVX-512)
    prefetches both panels of the next tile; the few-rows tiles too from ``SPAN_HINT_ROWS`` rows
    on (one panel wide, from one row on)."""
    mr, tile = register_tile("float32")
    panel = tile if layout == "tile" else PANEL
    n = 2 * tile * MIN_COLUMN_TILES + 5  # enough column tiles for the widest few-rows tiles
    m, k = SymVar("M", 1), 64
    f = default_schedule(_linear_silu(m, k, n, panel), strict=True)
    for rows in range(1, 6 * mr):  # the few-rows tiles, then 1 .. 6 many-rows tiles
        width = panel_columns(panel, rows, "float32") if rows < NN_SMALL_ROWS else tile
        nxt = range(width // panel, 2 * width // panel)  # the panels of column tile 1
        if width > panel and rows < SPAN_HINT_ROWS:
            nxt = range(0)  # 1 or 2 rows over several panels: no hints
        want = {(p, r, c) for p in nxt for r in range(k) for c in range(0, panel, 16)}
        assert set(_covered_lines(f, m, rows)) == want, f"rows={rows}"
