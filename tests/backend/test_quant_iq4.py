"""iq4_nl and iq4_xs (GGUF's IQ4_NL, type 20, and IQ4_XS, type 23) in the quant library: decoded
(``tilework.llm.quant``'s NumPy decoders and the library's ``dequantize``) as
``gguf.quants.dequantize`` decodes them, interleaved by the library as ``interleave_rows`` does,
and on the integer path (``x`` quantized to 8-bit blocks, the nibbles' int8 values looked up):
the NumPy emulation of that path and ``activation_bound``, at rows 0 to 33 (GEMV passes and the
GEMM), N of 1, 13 and 48 (odd, and whole groups of 16), K from one block to six super-blocks, on
blocks at the extremes (the values -127 and 113 under iq4_xs's scales -32 and 31, against
activations of +-127: the largest block sums; a zero block), with each row's bits the same alone
and in any batch, without VNNI, in the portable build and on the 16-row layouts ``iq4_nlx16``
and ``iq4_xsx16`` (``test_quant.assert_rows_in_every_build``)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.backend.helpers import k_quant_blocks
from tests.backend.quant_int8 import assert_rows_in_every_build, extreme_activations
from tests.backend.test_quant import GGML
from tilework.backend import quant as Q
from tilework.llm.quant import dequantize_rows
from tilework.op.quant import QUANT_FORMATS, bf16_bits, interleave_rows

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

IQ4 = ("iq4_nl", "iq4_xs")


def extreme_blocks(rng: np.random.Generator, fmt: str, n: int, k: int) -> np.ndarray:
    """Random ``fmt`` rows with sane fp16 ``d``; row 0's first 64 weights index -127 (iq4_xs:
    under ``ls = 0``, a scale of -32), the last row's first 64 index 113 (``ls = 63``: 31), row
    1's first block (iq4_xs: super-block) has ``d = 0``."""
    f = QUANT_FORMATS[fmt]
    b = k_quant_blocks(rng, fmt, n, k)
    blk = b.reshape(n, k // f.block, f.nbytes)
    qs = 2 if fmt == "iq4_nl" else 8
    if fmt == "iq4_nl":
        blk[0, :2, qs:] = 0x00
        blk[n - 1, :2, qs:] = 0xFF
    else:
        blk[0, 0, 2:8], blk[0, 0, qs : qs + 32] = 0x00, 0x00  # ls = 0 everywhere; sub-blocks 0, 1 all -127
        blk[n - 1, 0, 2:8], blk[n - 1, 0, qs : qs + 32] = 0xFF, 0xFF  # ls = 63; all 113
    if n > 2:
        blk[1, 0, 0:2] = 0
    return b


@pytest.mark.parametrize("fmt", IQ4)
def test_iq4_blocks_decode_as_gguf_does(fmt: str) -> None:
    """NumPy's and the library's decoders (float32, and bfloat16 bits) give ``dequantize``'s
    values bit for bit; the library's interleaving is ``interleave_rows``'s."""
    rng = np.random.default_rng(3)
    n, k = 32, 512
    b = extreme_blocks(rng, fmt, n, k)
    want = dequantize(b, GGML[fmt]).reshape(n, k)
    assert len(set(want[0, :32])) == len(set(want[n - 1, :32])) == 1 and not want[1, :32].any()  # the extremes, a zero block
    np.testing.assert_array_equal(dequantize_rows(b, fmt), want)
    lib = Q.library()
    np.testing.assert_array_equal(lib.dequantize(b, fmt), want)
    np.testing.assert_array_equal(lib.dequantize(b, fmt, bf16=True), bf16_bits(want))
    np.testing.assert_array_equal(lib.interleave(b, fmt), interleave_rows(b, fmt))


@pytest.mark.parametrize("fmt", IQ4)
def test_iq4_on_the_integer_path(fmt: str) -> None:
    rng = np.random.default_rng(11)
    shapes = ((1, 256), (13, 512), (48, 1536)) + (((5, 32), (16, 96)) if fmt == "iq4_nl" else ())
    for n, k in shapes:
        b = extreme_blocks(rng, fmt, n, k)
        wf = dequantize(b, GGML[fmt]).reshape(n, k).astype(np.float32)
        x = extreme_activations(rng, k, 64)  # +-1 columns: +-127 once quantized
        x[2] *= 1e-3
        assert_rows_in_every_build(x, b, fmt, wf)


@pytest.mark.parametrize("fmt", IQ4)
def test_iq4_refuses_shapes_that_are_not_whole_blocks(fmt: str) -> None:
    from tilework.errors import RuntimeCheckError

    block = QUANT_FORMATS[fmt].block
    b = k_quant_blocks(np.random.default_rng(0), fmt, 16, 256)
    with pytest.raises(RuntimeCheckError, match=f"not a multiple of the {fmt} block \\({block}\\)"):
        Q.qlinear(np.ones((1, 256 + 32 * (block == 256) + 16 * (block == 32)), np.float32), b, fmt)
    with pytest.raises(RuntimeCheckError, match="groups of 16"):
        Q.qlinear(np.ones((1, 256), np.float32), b[:15], fmt + "x16")
