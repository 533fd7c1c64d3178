"""Pointwise-conv-shaped matmuls (``x[b, rows, K] @ w.T``, the weight packed in 16-column
panels, a symbolic batch): the row tiles outside the column tiles where A is large or a
shorter tile divides the rows (``matmul_order.rows_outer``), and a tile as wide as B
prefetching the next tile's rows of A (``prefetch_next_rows``), checked against NumPy at
batches 1 and 3, odd K and N, with a fused epilogue, on both register files."""

from __future__ import annotations

import numpy as np

from tilework import te
from tilework.codegen import build_library
from tilework.ir import sym
from tilework.ir.loop import Block, For, Intrin, Load, TensorFunc, stmt_scalars, walk_scalars
from tilework.ir.sym import SymVar
from tilework.schedule import default_schedule
from tilework.schedule.rules.matmul_order import least_waste, rows_outer
from tilework.schedule.analysis import main_block, matmul_parts
from tilework.schedule.tree import get_at, walk
from tilework.transform.layout_weights import lay_out

PANEL = 16
# name: (rows a batch slice, K, N, residual)
CASES = {
    "big_a": (4099, 37, 70, False),  # 4099 x 37 floats of A: past ROWS_OUTER_A_BYTES
    "seven_rows": (49, 37, 70, True),  # 49 rows: 7-row tiles divide them
    "one_column_tile": (1536, 67, 13, True),  # N within one tile, K and A large enough: prefetch A
    "small_a": (48, 67, 13, True),  # as wide, too little of A to prefetch
    "columns_outer": (48, 37, 70, False),  # small A, rows a multiple of 6 and 8: the default order
}


def _pointwise(rows: int, k: int, n: int, residual: bool) -> TensorFunc:
    b = SymVar("batch", 1)
    x = te.placeholder((b, rows, k), "float32", "x")
    w = te.placeholder((-(-n // PANEL), k, PANEL), "float32", "w")
    bias = te.placeholder((n,), "float32", "bias")
    res = te.placeholder((b, rows, n), "float32", "res")
    r = te.reduce_axis(k, "r")
    y = te.compute((b, rows, n), lambda i, p, j: te.sum(x[i, p, r] * w[sym.floordiv(j, PANEL), r, sym.floormod(j, PANEL)], axis=r), "y")
    if residual:
        out = te.compute(y.shape, lambda i, p, j: y[i, p, j] + bias[j] + res[i, p, j], "out")
    else:
        out = te.compute(y.shape, lambda i, p, j: te.minimum(te.maximum(y[i, p, j] + bias[j], 0.0), 6.0), "out")
    return te.create_func([x, w, bias, res, out])


def _loop_order(f: TensorFunc) -> list[str]:
    """The loop vars around the tile's update block ``y``, outermost first."""
    path = next(p for p, s in walk(f.body) if isinstance(s, Block) and s.name == "y")
    around = [get_at(f.body, path[:n]) for n in range(len(path))]
    return [a.var.name for a in around if isinstance(a, For)]


def _prefetched(f: TensorFunc) -> set[str]:
    """The buffers whose elements ``f`` prefetches."""
    return {
        x.args[0].buffer.name
        for _, b in walk(f.body) if isinstance(b, Block)
        for e in stmt_scalars(b.body) for x in walk_scalars(e)
        if isinstance(x, Intrin) and x.name == "prefetch" and isinstance(x.args[0], Load)
    }  # fmt: skip


def test_least_waste() -> None:
    assert least_waste(49, 8) == 7 and least_waste(196, 8) == 7
    assert least_waste(3136, 8) == 8 and least_waste(12544, 8) == 8
    assert least_waste(30, 8) == 6 and least_waste(31, 8) == 8


def test_pointwise_tiles_match_numpy(registers: str) -> None:
    funcs = {name: default_schedule(_pointwise(*case), strict=True) for name, case in CASES.items()}
    for name, f in funcs.items():
        order = _loop_order(f)
        rows_first = order[0].startswith("i_p_0")  # the parallel loop: batch and row tiles
        assert rows_first == (name in ("big_a", "seven_rows")), (name, order)
        assert ("x" in _prefetched(f)) == (name == "one_column_tile"), name
    lib = build_library(funcs)
    rng = np.random.default_rng(3)
    for name, (rows, k, n, residual) in CASES.items():
        wt = rng.standard_normal((n, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        for batch in (1, 3):
            x = rng.standard_normal((batch, rows, k)).astype(np.float32)
            res = rng.standard_normal((batch, rows, n)).astype(np.float32)
            out = np.full((batch, rows, n), np.nan, np.float32)
            lib[name].run([x, lay_out(wt, PANEL), bias, res, out])
            want = x.astype(np.float64) @ wt.T.astype(np.float64) + bias
            want = want + res if residual else np.clip(want, 0, 6)
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} batch={batch}")


def test_rows_outer_needs_static_rows() -> None:
    """A symbolic row count keeps the column tiles outside (its rest tile needs them there), as
    do fewer rows than two tiles."""
    f = _pointwise(49, 37, 70, False)
    mb = main_block(f)
    assert mb is not None
    parts = matmul_parts(mb)
    assert parts is not None
    assert rows_outer(parts, 49, 8)
    assert not rows_outer(parts, SymVar("m", 1), 8)
    assert not rows_outer(parts, 12, 8)  # under two tiles
