"""The many-rows matmul tiles prefetch their part of the next column panel
(``tilework.schedule.rules.matmul_prefetch``): a hint that must change no value. Checked against
NumPy through the C kernels and the reference interpreter at symbolic rows 1, 7, 32 and 33 (the
few-rows tiles, full row tiles, a rest tile), K with and without a multiple of the parts and N
past the last full panel, on each register file's tiles; the kernels pass the verifier and
print and parse back."""

from __future__ import annotations


import numpy as np

from tests.schedule.helpers import well_formed
from tilework import te
from tilework.codegen import build_library
from tilework.codegen.interp import run
from tilework.ir import sym
from tilework.ir.loop import Block, Intrin, Load, Store, TensorFunc, walk_scalars
from tilework.ir.sym import SymVar
from tilework.schedule import default_schedule
from tilework.schedule.rules.matmul import MIN_COLUMN_TILES, register_tile
from tilework.schedule.tree import walk
from tilework.te.tensor import TensorLoad
from tilework.transform.layout_weights import lay_out

ROWS = (1, 7, 32, 33)
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
        x for _, b in walk(func.body) if isinstance(b, Block) and isinstance(b.body, Store)
        for x in walk_scalars(b.body.value) if isinstance(x, Intrin) and x.name == "prefetch"
    ]  # fmt: skip


def test_prefetch_changes_no_value(registers: str) -> None:
    panel = register_tile("float32")[1]  # one panel a tile: the tiles prefetch
    n = panel * MIN_COLUMN_TILES + 5  # enough column tiles to run in parallel alone; a partial panel
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
