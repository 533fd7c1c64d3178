"""Two bytes side by side combined into a 16-bit word, ``int32(uint8(hi)) * 256 +
int32(uint8(lo))`` (an int8 KV pool's bfloat16 scales: ``tilework.op.paged_attention_base
.scale_of``), are read by the C emitter as one 16-bit load (``tw_u16_at``,
``codegen.c.dot.byte_pair``): compiled and interpreted, the same words as NumPy's, bytes of
both signs, through a page table and at odd lane counts. Bytes not side by side, in the other
order, or of different buffers keep their two loads."""

from __future__ import annotations

import numpy as np
import pytest

from tilework.codegen import build_library, interp
from tilework.codegen.c import emit_function
from tilework.ir.loop import Buffer, Cast, For, Load, Scalar, SeqStmt, Store, TensorFunc, binary, const
from tilework.ir.sym import SymVar
from tilework.op.paged_attention_base import scale_bytes, scale_of


def _word(hi: Load, lo: Load) -> Scalar:
    return binary("+", binary("*", Cast("int32", Cast("uint8", hi)), const(256, "int32")), Cast("int32", Cast("uint8", lo)))


def _pairs(lanes: int, hi_at: int, lo_at: int) -> TensorFunc:
    """``out[r, j] = word of kv[table[r], j, hi_at] (high) and kv[table[r], j, lo_at] (low)``."""
    rows, pages = SymVar("rows", 0), SymVar("pages", 0)
    r, j = SymVar("r", 0), SymVar("j", 0)
    kv, table, out = Buffer("kv", (pages, lanes, 4), "int8"), Buffer("table", (rows,), "int32"), Buffer("out", (rows, lanes), "int32")
    page = Load(table, (r,))
    word = _word(Load(kv, (page, j, hi_at)), Load(kv, (page, j, lo_at)))
    return TensorFunc((kv, table, out), For(r, rows, For(j, lanes, Store(out, (r, j), word), "vectorized"), "parallel"), 2)


def _data(lanes: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(lanes)
    kv = rng.integers(-128, 128, (7, lanes, 4)).astype(np.int8)
    kv[0, 0] = [-1, -128, 127, 0]  # 0xffff's halves, the sign bits, a zero
    return kv, np.array([3, 0, 6, 0, 5], np.int32)


@pytest.mark.parametrize("lanes", [16, 5, 1])
@pytest.mark.parametrize("hi_at, lo_at", [(1, 0), (3, 2), (0, 1), (2, 0)])
def test_a_pair_of_bytes_is_one_word(lanes: int, hi_at: int, lo_at: int) -> None:
    func = _pairs(lanes, hi_at, lo_at)
    assert ("tw_u16_at(" in emit_function(func, "tw_x")) == (hi_at == lo_at + 1)
    kv, table = _data(lanes)
    u = kv.view(np.uint8).astype(np.int32)
    want = u[table][:, :, hi_at] * 256 + u[table][:, :, lo_at]
    lib = build_library({"pairs": func})
    for run in (lib["pairs"].run, lambda arrays: interp.run(func, arrays)):
        arrays = [kv, table, np.zeros((len(table), lanes), np.int32)]
        run(arrays)
        np.testing.assert_array_equal(arrays[-1], want)


def test_bytes_of_two_buffers_or_rows_are_not_a_pair() -> None:
    """Only bytes side by side in one row of one buffer are a word."""
    j = SymVar("j", 0)
    a, b, out = Buffer("a", (16, 2), "int8"), Buffer("b", (16, 2), "int8"), Buffer("out", (16,), "int32")
    rows = Buffer("rows", (2, 16), "int8")  # hi and lo in rows a stride apart
    for word in (_word(Load(a, (j, 1)), Load(b, (j, 0))), _word(Load(rows, (1, j)), Load(rows, (0, j)))):
        text = emit_function(TensorFunc((a, b, rows, out), For(j, 16, Store(out, (j,), word), "vectorized"), 3), "tw_x")
        assert "tw_u16_at(" not in text


def test_an_int8_pools_scales_round_trip_through_the_word() -> None:
    """``scale_of`` over the bytes ``scale_bytes`` wrote gives the bfloat16 back, compiled (one
    16-bit load) and interpreted: 0, the smallest normal, 1 / 127, 1, a large scale."""
    j = SymVar("j", 0)
    scales = np.array([0.0, 2.0**-126, 1 / 127, 1.0, 3.0e38], np.float32)
    bf16 = (scales.view(np.uint32) & 0xFFFF0000).view(np.float32)  # their high halves: what scale_bytes keeps
    n = len(scales)
    src, pool, out = Buffer("src", (n,), "float32"), Buffer("pool", (n, 4), "int8"), Buffer("out", (n,), "float32")
    lo, hi = scale_bytes(Load(src, (j,)))
    write = For(j, n, Store(pool, (j, 2), lo), "serial"), For(j, n, Store(pool, (j, 3), hi), "serial")
    read = For(j, n, Store(out, (j,), scale_of(Load(pool, (j, 2)), Load(pool, (j, 3)))), "vectorized")
    func = TensorFunc((src, pool, out), SeqStmt((*write, read)), 1)
    assert "tw_u16_at(&pool[" in emit_function(func, "tw_x")
    lib = build_library({"scales": func})
    for run in (lib["scales"].run, lambda arrays: interp.run(func, arrays)):
        arrays = [bf16, np.zeros((n, 4), np.int8), np.zeros(n, np.float32)]
        run(arrays)
        np.testing.assert_array_equal(arrays[-1], bf16)
