"""The k-quants (q4_k, q5_k, q6_k, q3_k, q2_k: 256-weight super-blocks of 8 sub-blocks of 32) on
the quant library's integer path, and their 16-row layouts (``q4_kx16`` & co.): random blocks
with the extremes of each format's values, scales and mins against activations of +-127, checked
against the NumPy emulation of ``quant_int8.py`` and within ``quant.activation_bound`` of the
dequantized product (``gguf.quants.dequantize``), the same bits in every build and layout;
``quant_take`` reading the x16 layouts; the loop level refusing them."""

from __future__ import annotations

import numpy as np
import pytest

import tilework
from tests.backend.helpers import k_quant_blocks, module
from tests.backend.quant_int8 import assert_rows_in_every_build, extreme_activations
from tilework import op
from tilework.backend import quant as Q
from tilework.errors import TileworkError
from tilework.ir.sym import SymVar
from tilework.op.quant import K_QUANTS, interleave_rows

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

GGML = {f: getattr(gguf.GGMLQuantizationType, f.upper()) for f in K_QUANTS}
X16 = [f"{f}x16" for f in ("q4_k", "q5_k", "q6_k", "q3_k", "q2_k")]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(11)


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k"])
def test_k_quants_on_the_integer_path(rng: np.random.Generator, fmt: str) -> None:
    """q4_k and q5_k on the integer path (each 32-weight sub-block a q4_1 / q5_1 block with ``d *
    scale`` and ``-(dmin * min)``): the emulation and the bound at rows 0 to 33 (GEMV passes and
    the GEMM), N of 1, 13 and 48, K of one to six super-blocks, sub-blocks of 15s (q5_k: 31s)
    with the largest 6-bit scales and mins (their top bits set) against activations of +-127;
    each row's bits the same alone and in any batch, without VNNI, in the portable build and on
    the rows interleaved in groups of 16 (``q4_kx16``, ``q5_kx16``)."""
    qs = 16 if fmt == "q4_k" else 48
    for n, k in ((1, 256), (13, 512), (48, 1536)):
        b = k_quant_blocks(rng, fmt, n, k)
        b[0, 4:16] = 0xFF  # row 0, super-block 0: every scale and min 63
        b[0, qs : qs + 32] = 0xFF  # its sub-blocks 0 and 1 all 15s
        if fmt == "q5_k":
            b[0, 16:48] = 0xFF  # and every fifth bit set: 31s
        b[n - 1, 4:16] = rng.integers(0, 256, 12, dtype=np.uint8) | 0xC0  # top bits of the 6-bit fields set
        wf = dequantize(b, GGML[fmt]).reshape(n, k).astype(np.float32)
        x = extreme_activations(rng, k, 64)  # +-1 columns: +-127 once quantized
        assert_rows_in_every_build(x, b, fmt, wf)


def test_q6_k_on_the_integer_path(rng: np.random.Generator) -> None:
    """q6_k on the integer path (each 32-weight sub-block's halves summed exactly, times their
    int8 scales in int32, then ``fma(isum, d * d_x, acc)``): the emulation and the bound at rows 0
    to 33 (GEMV passes and the GEMM), N of 1, 13 and 48, K of one to six super-blocks; the
    extremes (6-bit values 63 and 0 against activations of +-127, scales 127 and -128: sums near
    2^24); each row's bits the same alone and in any batch, without VNNI, in the portable build
    and on the rows interleaved in groups of 16 (``q6_kx16``)."""
    for n, k in ((1, 256), (13, 512), (48, 1536)):
        b = k_quant_blocks(rng, "q6_k", n, k)
        b[0, :192], b[0, 192:208] = 0xFF, 0x7F  # row 0, super-block 0: every value 63, every scale 127
        b[n - 1, :192], b[n - 1, 192:208] = 0, 0x80  # the last row's: every value 0 (q = -32), every scale -128
        if n > 2:
            b[1, 192:208] = rng.choice(np.array([0x7F, 0x80, 0x00, 0x01, 0xFF], np.uint8), 16)
        wf = dequantize(b, GGML["q6_k"]).reshape(n, k).astype(np.float32)
        x = extreme_activations(rng, k, 64)  # +-1 columns: +-127 once quantized
        assert_rows_in_every_build(x, b, "q6_k", wf)


@pytest.mark.parametrize("fmt", ["q3_k", "q2_k"])
def test_q3_k_and_q2_k_on_the_integer_path(rng: np.random.Generator, fmt: str) -> None:
    """q3_k and q2_k on the integer path (each 32-weight sub-block's halves summed exactly, times
    their scales in int32, then ``fma(isum, d * d_x, acc)``; q2_k's mins as ``sum(mn * q_x)``, then
    ``fma(msum, -(dmin * d_x), acc)``): the emulation and the bound at rows 0 to 33 (GEMV passes
    and the GEMM), N of 1, 13 and 48, K of one to six super-blocks; the extremes against
    activations of +-127 (q3_k: values 3 and -4 with scales 31 and -32, the largest sums; q2_k:
    values 3 with scales and mins 15, scales 15 with mins 0, scales 0 with mins 15); each row's
    bits the same alone and in any batch, without VNNI, in the portable build and on the rows
    interleaved in groups of 16 (``q3_kx16``, ``q2_kx16``)."""
    for n, k in ((1, 256), (13, 512), (48, 1536)):
        b = k_quant_blocks(rng, fmt, n, k)
        if fmt == "q3_k":  # hmask 0-31, 2-bit fields 32-95, scales 96-107
            b[0, :108] = 0xFF  # row 0, super-block 0: every value 3 (field 3, hmask bit set), every scale 63 - 32 = 31
            b[n - 1, :108] = 0  # the last row's: every value -4, every scale -32
            if n > 2:
                b[1, 96:108] = rng.integers(0, 256, 12, dtype=np.uint8) | 0xC0  # the scales' top bits set
        else:  # scale bytes 0-15 (sc | mn << 4), 2-bit fields 16-79
            b[0, :80] = 0xFF  # every value 3, every scale and min 15
            b[n - 1, :16], b[n - 1, 16:80] = 0x0F, 0xFF  # scales 15, mins 0
            if n > 2:
                b[1, :16], b[1, 16:80] = 0xF0, 0  # scales 0, mins 15: the min term alone
        wf = dequantize(b, GGML[fmt]).reshape(n, k).astype(np.float32)
        x = extreme_activations(rng, k, 64)  # +-1 columns: +-127 once quantized
        assert_rows_in_every_build(x, b, fmt, wf)


@pytest.mark.parametrize("fmt", X16)
def test_quant_take_reads_the_k_quant_x16_layouts(rng: np.random.Generator, fmt: str) -> None:
    """An LLM's tied token table is its head's layout: ``quant_take``'s loop kernel decodes rows
    of ``q4_kx16`` & co. to ``dequantize``'s values of the plain rows (ids in 3 groups, the last
    row, a negative id)."""
    base = fmt.removesuffix("x16")
    b = k_quant_blocks(rng, base, 48, 512)
    wf = dequantize(b, GGML[base]).reshape(48, 512).astype(np.float32)
    ids = SymVar("i", 1)
    take = module([("t", b.shape, "uint8"), ("ids", (ids,), "int64")], lambda t, i: op.quant_take(t, i, fmt, 512))
    picks = np.array([0, 17, 31, 5, 47, -1], np.int64)
    rows = tilework.VM(tilework.build(take))["main"](interleave_rows(b, base), picks)
    np.testing.assert_array_equal(rows, wf[picks])


@pytest.mark.parametrize("fmt", X16)
def test_k_quant_x16_runs_only_on_the_backend(rng: np.random.Generator, fmt: str) -> None:
    """The k-quants' x16 layouts, as the k-quants, have no loop-level kernel: a clear refusal, not a wrong product."""
    b = interleave_rows(k_quant_blocks(rng, fmt[:4], 16, 256), fmt[:4])
    mod = module([("x", (1, 256), "float32"), ("w", b.shape, "uint8")], lambda x, w: op.quant_linear(x, w, fmt, 256))
    with pytest.raises(TileworkError, match=f"{fmt} blocks have no loop-level kernel"):
        tilework.build(mod)
    y = tilework.VM(tilework.build(mod, backends=["quant", "codegen"]))["main"](np.ones((1, 256), np.float32), b)
    np.testing.assert_array_equal(y, Q.qlinear(np.ones((1, 256), np.float32), b, fmt))


def test_k_quants_run_only_on_the_backend(rng: np.random.Generator) -> None:
    """A k-quant ``quant_linear`` is the quant library's: a build without it refuses it, one with
    it gives the library's bits."""
    b = k_quant_blocks(rng, "q3_k", 8, 256)
    mod = module([("x", (SymVar("n", 1), 256), "float32"), ("w", b.shape, "uint8")], lambda x, w: op.quant_linear(x, w, "q3_k", 256))
    with pytest.raises(TileworkError, match="q3_k blocks have no loop-level kernel"):
        tilework.build(mod)
    vm = tilework.VM(tilework.build(mod, backends=["quant", "codegen"]))
    x = rng.standard_normal((4, 256)).astype(np.float32)
    np.testing.assert_array_equal(vm["main"](x, b), Q.qlinear(x, b, "q3_k"))
