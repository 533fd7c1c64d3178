"""``dot_u8i8x4`` (``tilework.ir.loop.DOT_U8I8X4``): hand-built kernels of a vectorized loop
of it, compiled (one ``vpdpbusd`` a 16 lanes where the compiler targets AVX-512 VNNI, the
portable loop under ``TW_NO_INTRINSICS`` or elsewhere) and interpreted, against NumPy's int64
sums wrapped to int32. Two forms: ``u`` (the uint8 operands are the lanes' own, read from an
int8 pool through a page table as ``Cast("uint8", ...)``; the int8 ones four bytes side by
side, one 32-bit load broadcast) and ``s`` (the int8 operands the lanes' own; the uint8 ones
four separate values packed into one broadcast word). 20 lanes are not a multiple of 16: the
loop as written."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import pytest

from tilework.codegen import CKernelModule, build_library, interp
from tilework.codegen.c import emit_function, emit_module, toolchain
from tilework.errors import WellFormedError
from tilework.ir.loop import DOT_U8I8X4, Block, Buffer, Cast, For, Intrin, Load, Scalar, Store, TensorFunc
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar
from tilework.ir.verify import verify
from tilework.text import parse, print_module

I32 = np.iinfo(np.int32)


def _func(form: str, lanes: int, vectorized: bool = True) -> TensorFunc:
    """``acc[r, j] += sum_p sum_k u[..k] * s[..k]`` over steps ``p``, ``j`` the lanes (the
    vectorized loop). ``u``: ``u_k = uint8(kv[table[r, p], j, k])`` (an int8 pool read as uint8
    through a page table), ``s_k = q[r, p, k]``. ``s``: ``s_k = w[r, p, j, k]``, ``u_k = x[k, p]``
    (a stride of ``steps`` apart: not side by side)."""
    rows, steps, pages = SymVar("rows", 0), SymVar("steps", 0), SymVar("pages", 0)
    r, p, j = SymVar("r", 0), SymVar("p", 0), SymVar("j", 0)
    acc = Buffer("acc", (rows, lanes), "int32")
    us: list[Scalar]
    ss: list[Scalar]
    if form == "u":
        kv, table, q = Buffer("kv", (pages, lanes, 4), "int8"), Buffer("table", (rows, steps), "int32"), Buffer("q", (rows, steps, 4), "int8")
        us = [Cast("uint8", Load(kv, (Load(table, (r, p)), j, k))) for k in range(4)]
        ss = [Load(q, (r, p, k)) for k in range(4)]
        inputs: tuple[Buffer, ...] = (kv, table, q)
    else:
        w, x = Buffer("w", (rows, steps, lanes, 4), "int8"), Buffer("x", (4, steps), "uint8")
        us = [Load(x, (k, p)) for k in range(4)]
        ss = [Load(w, (r, p, j, k)) for k in range(4)]
        inputs = (w, x)
    dot = Intrin(DOT_U8I8X4, (Load(acc, (r, j)), *us, *ss), "int32")
    body = For(j, lanes, Block("dot", (), (acc, *inputs), (acc,), Store(acc, (r, j), dot)), "vectorized" if vectorized else "serial")
    return TensorFunc((*inputs, acc), For(r, rows, For(p, steps, body, "serial"), "parallel"), len(inputs))


def _case(form: str, lanes: int, data: str, rows: int = 3, steps: int = 5) -> tuple[list[np.ndarray], np.ndarray]:
    """The input arrays and the starting ``acc`` of one case, and the wanted result: the
    exact products' sums in int64, wrapped to int32. ``data``: random bytes and sums, or every
    product 255 * -128 (``low``) or 255 * 127 (``high``) from an ``acc`` near the int32 limit
    the sums run past."""
    rng = np.random.default_rng([lanes, steps, "us".index(form), ("random", "low", "high").index(data)])
    u = rng.integers(0, 256, (rows, steps, lanes, 4) if form == "u" else (steps, 4)).astype(np.uint8)
    s = rng.integers(-128, 128, (rows, steps, 4) if form == "u" else (rows, steps, lanes, 4)).astype(np.int8)
    start = rng.integers(I32.min, I32.max, (rows, lanes), endpoint=True).astype(np.int32)
    if data != "random":
        u[...] = 255
        s[...] = -128 if data == "low" else 127
        start[...] = I32.min + 1000 if data == "low" else I32.max - 1000
    if form == "u":
        us, ss = u.astype(np.int64), s.astype(np.int64)[:, :, None, :]  # (rows, steps, lanes, 4)
        pages = rng.permutation(rows * steps).reshape(rows, steps).astype(np.int32)  # page of (r, p)
        kv = np.empty((rows * steps, lanes, 4), np.int8)
        kv[pages] = u.view(np.int8)
        arrays: list[np.ndarray] = [kv, pages, s]
    else:
        us, ss = u.astype(np.int64)[None, :, None, :], s.astype(np.int64)
        arrays = [s, np.ascontiguousarray(u.T)]
    want = start.astype(np.int64) + (us * ss).sum(axis=(1, 3))
    return [*arrays, start], ((want - I32.min) % 2**32 + I32.min).astype(np.int32)


@pytest.fixture(scope="module", params=["native", "portable"])
def build(request: pytest.FixtureRequest) -> Iterator[str]:
    """The compiler's flags: the host's (``vpdpbusd`` where it has AVX-512 VNNI), or with
    ``TW_NO_INTRINSICS`` defined (the portable copy of every such loop)."""
    flags = toolchain.DEFAULT_CFLAGS + (" -DTW_NO_INTRINSICS" if request.param == "portable" else "")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEWORK_CFLAGS", flags)
        yield request.param


def _library(func: TensorFunc) -> CKernelModule:
    return build_library({"dot": func})


@pytest.mark.parametrize("form", ["u", "s"])
@pytest.mark.parametrize("lanes", [16, 32, 20])
def test_dot_u8i8x4_matches_numpy_and_the_interpreter(build: str, form: str, lanes: int) -> None:
    """Compiled and interpreted, bit for bit the int64 sums wrapped to int32: random bytes,
    and every product at its most negative or positive (255 * -128, 255 * 127) from an ``acc``
    the sums carry past the int32 limit (two's complement wrap, no saturation)."""
    func = _func(form, lanes)
    text = emit_function(func, "tw_x")
    recognized = lanes % 16 == 0
    assert ("_mm512_dpbusd_epi32(" in text) == recognized and ("#if defined(TW_DOT_U8I8)" in text) == recognized
    assert "tw_dot_u8i8x4(" in text  # the portable copy, or the loop as written
    if recognized:
        broadcast = "_mm512_set1_epi32(tw_u32_at(&q[" if form == "u" else "_mm512_set1_epi32((int)((uint32_t)(uint8_t)(x["
        assert broadcast in text
    lib = _library(func)
    for data in ("random", "low", "high"):
        arrays, want = _case(form, lanes, data)
        for run in (lib["dot"].run, lambda arrays: interp.run(func, arrays)):
            given = [a.copy() for a in arrays]
            run(given)
            np.testing.assert_array_equal(given[-1], want)


def test_not_a_multiple_of_16_or_serial_is_the_scalar_loop() -> None:
    """Only a vectorized loop whose extent 16 divides becomes ``vpdpbusd``; C without one
    leaves the prelude's intrinsics out (``TW_NO_INTRINSICS``), C with one keeps them."""
    assert "_mm512_dpbusd_epi32(" not in emit_function(_func("u", 20), "tw_x")
    assert "_mm512_dpbusd_epi32(" not in emit_function(_func("s", 32, vectorized=False), "tw_x")
    assert emit_module({"dot": _func("u", 20)}).text.startswith("#define TW_NO_INTRINSICS 1\n")
    assert not emit_module({"dot": _func("u", 32)}).text.startswith("#define TW_NO_INTRINSICS")


def _lanes_func(us: Sequence[Scalar], ss: Sequence[Scalar], buffers: tuple[Buffer, ...], j: SymVar) -> TensorFunc:
    acc = Buffer("acc", (16,), "int32")
    dot = Intrin(DOT_U8I8X4, (Load(acc, (j,)), *us, *ss), "int32")
    return TensorFunc((*buffers, acc), For(j, 16, Store(acc, (j,), dot), "vectorized"), len(buffers))


def test_which_lanes_are_one_vpdpbusd() -> None:
    """Four bytes side by side, four a step of the loop, of a buffer of the operand's dtype or
    of the other byte dtype cast: one load of the lanes. Bytes a stride apart, a step of two
    bytes, or both fours depending on the loop are not; nor is a cast from a wider dtype."""
    j = SymVar("j", 0)
    rows = Buffer("rows", (4, 16), "int8")  # a byte of each lane in each row: not side by side
    packed = Buffer("packed", (16, 4), "uint8")
    wide = Buffer("wide", (16, 4), "int32")
    s8 = Buffer("s8", (4,), "int8")
    u8 = Buffer("u8", (64,), "uint8")
    s_const: list[Scalar] = [Load(s8, (k,)) for k in range(4)]

    def vnni(us: Sequence[Scalar], ss: Sequence[Scalar], *buffers: Buffer) -> bool:
        return "_mm512_dpbusd_epi32(" in emit_function(_lanes_func(us, ss, buffers, j), "tw_x")

    assert vnni([Load(packed, (j, k)) for k in range(4)], s_const, packed, s8)
    assert vnni([Load(u8, (4 * j + k,)) for k in range(4)], s_const, u8, s8)  # flat offsets
    assert vnni([Load(u8, (k,)) for k in range(4)], [Cast("int8", Load(packed, (j, k))) for k in range(4)], packed, u8)
    assert not vnni([Cast("uint8", Load(rows, (k, j))) for k in range(4)], s_const, rows, s8)
    assert not vnni([Load(u8, (2 * j + k,)) for k in range(4)], s_const, u8, s8)
    assert not vnni([Cast("uint8", Load(wide, (j, k))) for k in range(4)], s_const, wide, s8)
    assert not vnni([Load(packed, (j, k)) for k in range(4)], [Cast("int8", Load(packed, (j, k))) for k in range(4)], packed)


def test_verifier_names_the_dtypes() -> None:
    """The verifier names a ``dot_u8i8x4`` whose operands are not int32, uint8 and int8."""
    i = SymVar("i", 0)
    u, acc = Buffer("u", (16, 4), "uint8"), Buffer("acc", (16,), "int32")
    bad = Intrin(DOT_U8I8X4, (Load(acc, (i,)), *(Load(u, (i, k)) for k in range(4)), *(Load(u, (i, k)) for k in range(4))), "int32")
    with pytest.raises(WellFormedError, match="dot_u8i8x4 takes an int32 accumulator, four uint8 and four int8"):
        verify(IRModule({"f": TensorFunc((u, acc), For(i, 16, Store(acc, (i,), bad), "serial"), 1)}))


def test_text_round_trips() -> None:
    mod = IRModule({"f": _func("u", 32)})
    verify(mod)
    text = print_module(mod)
    assert "dot_u8i8x4(" in text
    assert print_module(parse(text)) == text
