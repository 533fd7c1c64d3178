"""The quant backend's float path (bf16, f16) on AVX2 (``quant_float_avx2.c``: what a
CPU with AVX2, FMA and F16C but no AVX-512 runs; with AVX-512 the same checks hold its kernels)
against a float64 NumPy reference and the portable build.

The weights are decoded exactly and multiplied in float32, so each output may differ from the
exact ``x @ w.T`` of the decoded weights only by float32 summation (bf16 with
AVX-512 BF16: of ``x`` rounded to bf16, subnormals as zero: ``expected``): by at most
``(K + 2) * (2**-24 * |x| @ |w|.T + 2**-149)`` (the classic bound of a sum of ``K`` products in
any order, with float32's underflow; + 2 for the fused products and the final stores), and from
the portable kernels' results (another order) by at most twice that. Shapes: rows 1 to 33 (the
GEMV's passes and the switch to the packed GEMM), N odd and not a multiple of 16 (ragged GEMV
groups, masked GEMM panels), K with a tail past the multiples of 8 and K split into several
packed chunks. Special values: f16 and bf16 subnormals, infinities and NaN in the weights.
(The k-quants take the integer path: ``test_quant_k_quants.py``.)"""

from __future__ import annotations

import numpy as np
import pytest

from tests.backend.helpers import bf16_round
from tilework.backend import quant as Q
from tilework.backend.quant import _cpu_flags

AVX2 = {"avx2", "fma", "f16c"} <= _cpu_flags()
pytestmark = pytest.mark.skipif(not AVX2, reason="the AVX2 float kernels need a CPU with AVX2, FMA and F16C")

ROWS = (1, 3, 5, 6, 7, 8, 9, 12, 13, 33)
COLS = (1, 5, 31, 50)
DEPTHS = (1, 7, 64, 67, 576, 1536)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def weights(rng: np.random.Generator, fmt: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``uint16 [n, k]`` rows of ``fmt`` and their exact float32 values; some subnormal."""
    wf = rng.standard_normal((n, k)).astype(np.float32)
    tiny = rng.random((n, k)) < 0.05
    wf[tiny] *= np.float32(2.0**-130 if fmt == "bf16" else 2.0**-18)  # subnormal in the format
    if fmt == "bf16":
        bits = (wf.view(np.uint32) >> 16).astype(np.uint16)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32)
    bits = wf.astype(np.float16).view(np.uint16)
    return bits, bits.view(np.float16).astype(np.float32)


def gamma_bound(x: np.ndarray, wf: np.ndarray) -> np.ndarray:
    k = x.shape[-1]
    return (k + 2) * (2.0**-24 * (np.abs(x.astype(np.float64)) @ np.abs(wf.astype(np.float64)).T) + 2.0**-149)


def expected(x: np.ndarray, wf: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """The exact product the library computes and its float32 bound. bf16 on a CPU with
    AVX-512 BF16 (``QuantLibrary.bf16dot``) multiplies ``x`` rounded to bf16 with the
    weights, subnormals counting as zero (``vdpbf16ps``), and may flush a subnormal partial
    sum (``2**-126`` a step); otherwise ``x @ wf.T``."""
    if not (fmt == "bf16" and Q.library().bf16dot):
        return x.astype(np.float64) @ wf.astype(np.float64).T, gamma_bound(x, wf)
    xr = bf16_round(x)
    xr = np.where(np.abs(xr) < 2.0**-126, 0, xr).astype(np.float32)
    w0 = np.where(np.abs(wf) < 2.0**-126, 0, wf).astype(np.float32)
    return xr.astype(np.float64) @ w0.astype(np.float64).T, gamma_bound(xr, w0) + (x.shape[-1] + 2) * 2.0**-126


def rounding_gap(x: np.ndarray, wf: np.ndarray, fmt: str) -> np.ndarray | float:
    """How far ``expected`` may be from ``x @ wf.T``: bf16's rounding of ``x`` and the
    subnormal weights dropped, where the library rounds ``x`` (else 0)."""
    if not (fmt == "bf16" and Q.library().bf16dot):
        return 0.0
    tiny = np.where(np.abs(wf) < 2.0**-126, np.abs(wf), 0).astype(np.float64)
    return Q.bf16_bound(x, wf) * (1 + 1e-6) + np.abs(x.astype(np.float64)) @ tiny.T


@pytest.mark.parametrize("fmt", ["bf16", "f16"])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_float64_and_the_portable_build(rng: np.random.Generator, fmt: str, threads: int) -> None:
    lib = Q.library()
    lib.set_threads(threads)
    try:
        for k in DEPTHS:
            for n in COLS:
                bits, wf = weights(rng, fmt, n, k)
                ref64 = None
                for m in ROWS:
                    x = rng.standard_normal((m, k)).astype(np.float32)
                    y = Q.qlinear(x, bits, fmt)
                    ref64, bound = expected(x, wf, fmt)
                    assert np.all(np.abs(y - ref64) <= bound), (fmt, m, n, k, float(np.max(np.abs(y - ref64) - bound)))
                    yp = Q.qlinear(x, bits, fmt, portable=True)
                    assert np.all(np.abs(y - yp) <= bound + gamma_bound(x, wf) + rounding_gap(x, wf, fmt)), (fmt, m, n, k)
                assert ref64 is not None
    finally:
        lib.set_threads(lib.max_threads())


@pytest.mark.parametrize("fmt", ["bf16", "f16"])
def test_big_matrices_over_the_threads(rng: np.random.Generator, fmt: str) -> None:
    """Enough weight bytes for the parallel GEMV (over TWQ_PAR_MIN_BYTES) and many GEMM panels,
    a ragged last GEMV group and a ragged last panel, x rows split over the threads."""
    n, k = 999, 576
    bits, wf = weights(rng, fmt, n, k)
    for m in (1, 2, 5, 8, 40, 128):
        x = rng.standard_normal((m, k)).astype(np.float32)
        y = Q.qlinear(x, bits, fmt)
        ref, bound = expected(x, wf, fmt)
        assert np.all(np.abs(y - ref) <= bound), (fmt, m)


@pytest.mark.parametrize("fmt", ["bf16", "f16"])
def test_non_finite_weights_make_their_outputs_non_finite(rng: np.random.Generator, fmt: str) -> None:
    n, k = 21, 67
    bits, wf = weights(rng, fmt, n, k)
    inf, nan = (0x7F80, 0x7FC0) if fmt == "bf16" else (0x7C00, 0x7E00)
    bits[3, 10], bits[8, 66], bits[17, 5] = inf, nan, inf | 0x8000  # in a vector, in the K tail
    wf = (bits.astype(np.uint32) << 16).view(np.float32) if fmt == "bf16" else bits.view(np.float16).astype(np.float32)
    for m in (1, 4, 6, 12):
        x = rng.standard_normal((m, k)).astype(np.float32) + 0.5  # no zero products with inf
        y = Q.qlinear(x, bits, fmt)
        with np.errstate(invalid="ignore"):
            ref = x.astype(np.float64) @ wf.astype(np.float64).T
        np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(y), np.isinf(ref))
        finite = np.isfinite(ref)
        want, bound = expected(x, np.nan_to_num(wf, posinf=0, neginf=0), fmt)
        assert np.all(np.abs(y[finite] - want[finite]) <= bound[finite])


@pytest.mark.parametrize("fmt", ["bf16", "f16"])
def test_residual_add_is_the_product_plus_r(rng: np.random.Generator, fmt: str) -> None:
    n, k = 37, 600
    bits, _ = weights(rng, fmt, n, k)
    lib = Q.library()
    for m in (2, 7, 20):
        x = rng.standard_normal((m, k)).astype(np.float32)
        r = rng.standard_normal((m, n)).astype(np.float32)
        out = np.empty((m, n), np.float32)
        assert lib.add_entries[fmt](x.ctypes.data, bits.ctypes.data, r.ctypes.data, out.ctypes.data, m, n, k) == 0
        np.testing.assert_array_equal(out, Q.qlinear(x, bits, fmt) + r)


def test_the_avx2_part_is_spliced_into_one_source() -> None:
    text = Q.source()
    assert "#include \"quant_" not in text and "twq_a2_run" in text
    assert text.index("twq_a2_run(int fmt") < text.index("static int twq_run(")
