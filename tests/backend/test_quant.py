"""The quant backend: its C library against NumPy references for every format (the legalized
``quant_linear`` kernel and ``gguf.quants.dequantize`` on blocks made by ``gguf.quants.quantize``,
random k-quant blocks and SmolLM2's own blocks), at rows 0 to 128 (GEMV and GEMM paths) and odd
shapes; offloading through ``tilework.build``; refusals with clear errors.

q4_0, q4_1, q5_0, q5_1, q8_0 and the k-quants run the integer path (``x`` quantized to 8-bit
blocks): a NumPy emulation of it (``quant_int8.py``: the same quantization, exact integer block
sums, the float scales) is the reference to float32-summation tolerance; the dequantized
float32 product is within ``quant.activation_bound``; the quantization of ``x`` is bit-exact;
and the bits of a row's result are the same alone or in any batch, with or without VNNI, and in
the portable build. The k-quants' own tests are ``test_quant_k_quants.py``'s."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable
from importlib import resources

import numpy as np
import pytest

import tilework
from tests.backend.helpers import K_QUANT_HALVES, bf16_round, k_quant_blocks, module
from tests.backend.quant_int8 import INT8_ROWS, Q5, assert_int8_matches, assert_rows_in_every_build, extreme_activations, quantize_x
from tests.llm.models import SMOLLM2, needs_smollm2
from tilework import op
from tilework.backend import availability
from tilework.backend import quant as Q
from tilework.errors import RuntimeCheckError, TileworkError
from tilework.ir.sym import SymVar
from tilework.runtime.extern import lookup_extern
from tilework.op.quant import QUANT_FORMATS, interleave_rows

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize, quantize  # noqa: E402

ROWS = (1, 3, 8, 33, 128)
SIMPLE = ("q4_0", "q4_1", "q8_0", "bf16", "f16")
INT8 = ("q4_0", "q4_1", "q8_0")
GGML = {f: getattr(gguf.GGMLQuantizationType, f.upper()) for f in Q.FORMATS if f in QUANT_FORMATS}


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(11)


def blocks(rng: np.random.Generator, fmt: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``uint8 [n, row_bytes]`` blocks of ``fmt`` and their float32 weights (``dequantize``)."""
    if fmt in K_QUANT_HALVES:  # gguf cannot quantize these: random blocks with sane scales
        b = k_quant_blocks(rng, fmt, n, k)
        return b, dequantize(b, GGML[fmt]).reshape(n, k)
    raw = quantize(rng.standard_normal((n, k)).astype(np.float32), GGML[fmt])
    return raw.view(np.uint8).reshape(n, -1), dequantize(raw, GGML[fmt]).reshape(n, k).astype(np.float32)


def rounds_x(fmt: str, lib: Q.QuantLibrary | None = None) -> bool:
    """Whether the library rounds ``x`` to bf16 for this call (bf16's dot products, at every
    row count)."""
    return fmt == "bf16" and (lib or Q.library()).bf16dot


def assert_matches(y: np.ndarray, x: np.ndarray, wf: np.ndarray, fmt: str = "f16", lib: Q.QuantLibrary | None = None) -> None:
    """``y == x @ wf.T`` up to float32 rounding: the error of each output is measured against
    the sum of the magnitudes of its terms; where the library rounds ``x`` to bf16
    (``rounds_x``), ``y`` is that product of the rounded ``x`` to float32 rounding and within
    ``quant.bf16_bound`` of the exact one."""
    x64, w64 = x.astype(np.float64).reshape(-1, x.shape[-1]), wf.astype(np.float64)
    rounded = rounds_x(fmt, lib)
    xr = bf16_round(x.reshape(x64.shape)).astype(np.float64) if rounded else x64
    ref = xr @ w64.T
    scale = np.abs(xr) @ np.abs(w64).T + 1e-30
    err = np.abs(y.reshape(ref.shape) - ref) / scale
    assert err.max() < 2e-6, f"worst relative error {err.max():.3g}"
    if rounded:
        off = np.abs(y.reshape(ref.shape) - x64 @ w64.T) - Q.bf16_bound(x64, w64) * (1 + 1e-5) - 2e-6 * scale
        assert off.max() <= 0, f"off x @ w.T by {off.max():.3g} beyond the bf16 bound"



def legalized(fmt: str, n: int, k: int) -> tilework.VM:
    """``quant_linear`` compiled by tilework's own kernels (no backend)."""
    rows = SymVar("m", 1)
    mod = module([("x", (rows, k), "float32"), ("w", (n, Q.row_bytes(fmt, k)), "uint8")], lambda x, w: op.quant_linear(x, w, fmt, k))
    return tilework.VM(tilework.build(mod))


@pytest.mark.parametrize("fmt", SIMPLE)
def test_simple_formats_match_the_legalized_kernel_and_dequantize(rng: np.random.Generator, fmt: str) -> None:
    shapes = [(37, 256), (3, 96)] + ([(5, 100)] if QUANT_FORMATS[fmt].block == 1 else [])
    for n, k in shapes:
        b, wf = blocks(rng, fmt, n, k)
        vm = legalized(fmt, n, k)
        for m in ROWS:
            x = rng.standard_normal((m, k)).astype(np.float32)
            y = Q.qlinear(x, b, fmt)
            assert y.shape == (m, n) and y.dtype == np.float32
            ref = vm["main"](x, b)
            if fmt in INT8:  # the legalized kernel is the dequantized product: within the bound
                assert_int8_matches(y, x, b, fmt, wf)
                assert (np.abs(y - ref) <= Q.activation_bound(x, wf) * 1.01 + 1e-4 * float(np.abs(ref).max())).all()
                continue
            assert_matches(y, x, wf, fmt)
            slack = Q.bf16_bound(x, wf) * 1.01 if rounds_x(fmt) else 0.0
            assert (np.abs(y - ref) <= slack + 1e-4 * np.abs(ref) + 1e-4 * float(np.abs(ref).max())).all()


# -- the integer path ------------------------------------------------------------------------------


def int8_blocks(rng: np.random.Generator, fmt: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    if k == 0:
        return np.zeros((n, 0), np.uint8), np.zeros((n, 0), np.float32)
    return blocks(rng, fmt, n, k)


@pytest.mark.parametrize("fmt", INT8)
def test_int8_formats_match_their_emulation_and_the_bound(rng: np.random.Generator, fmt: str) -> None:
    for n, k in ((37, 256), (13, 96), (5, 32), (1, 576), (3, 0)):
        b, wf = int8_blocks(rng, fmt, n, k)
        for m in INT8_ROWS:
            x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 100, (m, 1))).astype(np.float32)
            y = Q.qlinear(x, b, fmt)
            assert y.shape == (m, n) and y.dtype == np.float32
            assert_int8_matches(y, x, b, fmt, wf)


@pytest.mark.parametrize("fmt", Q5)
def test_q5_formats(rng: np.random.Generator, fmt: str) -> None:
    """q5_0 and q5_1 on the integer path (their 5-bit weights unsigned, as q4's nibbles): the
    emulation and the bound at rows 0 to 33 (GEMV passes and the GEMM), N not a multiple of 16,
    K of one block to 576, a block of 31s (every fifth bit set) against activations of +-127
    (the widest pair sums); each row's bits the same alone and in any batch, without VNNI, in
    the portable build and on the rows interleaved in groups of 16 (``q5_0x16``: each group's
    ``qh`` one vector)."""
    head = 2 if fmt == "q5_0" else 4
    for n, k in ((13, 32), (37, 64), (48, 576)):
        b, _ = blocks(rng, fmt, n, k)
        b[0, head : head + 20] = 0xFF  # row 0, block 0: qh and nibbles all ones: q = 31
        b[n - 1, head + 1] = 0x5A  # a pattern of fifth bits
        wf = dequantize(b, GGML[fmt]).reshape(n, k).astype(np.float32)
        x = extreme_activations(rng, k, 32)  # +-1 columns: +-127 once quantized
        assert_rows_in_every_build(x, b, fmt, wf)


def test_the_quantization_of_x_is_bit_exact(rng: np.random.Generator) -> None:
    """Random blocks at scales from 1e-13 to 1e13, and blocks made to hit the rules: exact
    halves (with max|x| = 127 the step is 1; rint takes them to even), zero, a maximum at and
    just above 2^-100, a subnormal one, NaN, infinity."""
    scales = np.exp(rng.uniform(-30, 30, (6 * 64, 1))).astype(np.float32)
    random = (rng.standard_normal((6 * 64, 32)) * scales).astype(np.float32)
    special = np.zeros((8, 32), np.float32)
    special[0] = np.concatenate([[127.0], np.arange(31) - 15.5])
    special[2, 9] = 2.0**-100
    special[3, :] = -(2.0**-99)
    special[4, 3] = 1e-40
    special[5, 5] = np.nan
    special[6, 7] = -np.inf
    special[7] = rng.standard_normal(32)
    x = np.concatenate([random, special]).reshape(8, -1)
    q_ref, d_ref = quantize_x(x)
    assert q_ref.reshape(-1, 32)[-8, 1:].tolist() == np.rint(np.arange(31) - 15.5).tolist()  # ties to even
    assert (q_ref.reshape(-1, 32)[-6:-4] == [[0], [-127]]).all()  # 2^-100 quantizes to zero, 2^-99 does not
    for lib in (Q.library(), Q.library(vnni=False, families=()), Q.library(portable=True, families=())):  # (the helpers: every build has them)
        q, d, s = lib.quantize_x(x)
        np.testing.assert_array_equal(q.reshape(q_ref.shape), q_ref)
        np.testing.assert_array_equal(d, d_ref)  # NaN where NaN, inf where inf
        np.testing.assert_array_equal(s, q_ref.sum(axis=2))


def test_the_quantization_of_x_is_bit_exact_sixteen_blocks_at_a_time(rng: np.random.Generator) -> None:
    """The AVX-512 build quantizes 16 blocks at a time (their max and sums taken together) and
    the blocks left over, or from a non-finite one on, one by one: the special blocks of the
    test above at every position of a group of 16 and across groups, rows of 18 blocks (the
    groups straddle rows, as in twq_quantize), and one row of 16 (a group and no rest)."""
    scales = np.exp(rng.uniform(-20, 20, (9 * 18, 1))).astype(np.float32)
    x = (rng.standard_normal((9 * 18, 32)) * scales).astype(np.float32)
    x[3] = np.concatenate([[127.0], np.arange(31) - 15.5])  # ties to even
    x[5], x[17] = 0.0, 0.0
    x[17, 9] = 2.0**-100  # quantizes to zero
    x[20] = -(2.0**-99)
    x[30, 3] = 1e-40
    x[31] = np.arange(32) * 1e13
    x[41, 31] = np.nan  # a non-finite block in the third group of 16: the rest one by one
    x[44, 0] = -np.inf
    x[150, 15] = np.inf
    for xs in (x.reshape(9, 18 * 32), x[:16].reshape(1, 16 * 32), x[48:].reshape(6, 19 * 32), x[:48].reshape(3, 16 * 32)):
        q_ref, d_ref = quantize_x(xs)
        for lib in (Q.library(), Q.library(portable=True, families=())):
            q, d, s = lib.quantize_x(xs)
            np.testing.assert_array_equal(q.reshape(q_ref.shape), q_ref)
            np.testing.assert_array_equal(d, d_ref)
            np.testing.assert_array_equal(s, q_ref.sum(axis=2))


def test_a_build_without_a_feature_the_target_lacks_is_the_full_library() -> None:
    """``vnni=False`` / ``bf16dot=False`` change no code where the compiler's target has no VNNI
    / AVX-512 BF16: the full library is given, not built again; where it has them, a build
    without them is its own library."""
    full = Q.library()  # (each variant below asks for the one path it changes: a build of every path takes 17 s)
    assert (Q.library(vnni=False, families=("q4_1",)) is full) == (not full.vnni)
    assert (Q.library(bf16dot=False, families=("bf16",)) is full) == (not full.bf16dot)
    assert (Q.library(vnni=False, bf16dot=False, families=("f16",)) is full) == (not full.vnni and not full.bf16dot)
    assert not Q.library(vnni=False, families=("q4_1",)).vnni and not Q.library(bf16dot=False, families=("bf16",)).bf16dot
    if full.vnni:  # a variant holds every path it changes: the integer formats' tests share one build without VNNI
        no_vnni = Q.library(vnni=False, families=("q4_1",))
        assert no_vnni.families == Q.INTEGER_FAMILIES and Q.library(vnni=False, families=("q6_k", "q8_0")) is no_vnni
    if full.bf16dot:  # only bf16's path changes without BF16 dot products
        assert Q.library(bf16dot=False, families=("bf16",)).families == ("bf16",)


@pytest.mark.parametrize("fmt", INT8)
def test_a_row_has_the_same_bits_alone_in_any_batch_and_in_every_build(rng: np.random.Generator, fmt: str) -> None:
    """What batched decoding relies on: the GEMV (up to 32 rows, in passes of up to 8) and the
    GEMM (33 rows) do the same float operations per output, as do the builds without VNNI and
    without AVX-512."""
    n, k = 45, 192
    b, _ = blocks(rng, fmt, n, k)
    x = rng.standard_normal((33, k)).astype(np.float32)
    full = Q.qlinear(x, b, fmt)
    for m in (1, 2, 3, 5, 8, 9, 12, 17, 24, 32):
        np.testing.assert_array_equal(Q.qlinear(x[:m], b, fmt), full[:m])
    for i in range(33):
        np.testing.assert_array_equal(Q.qlinear(x[i : i + 1], b, fmt)[0], full[i])
    for m in (1, 8, 33):
        np.testing.assert_array_equal(Q.qlinear(x[:m], b, fmt, vnni=False), full[:m])
        np.testing.assert_array_equal(Q.qlinear(x[:m], b, fmt, portable=True), full[:m])


def test_non_finite_x_makes_its_row_nan(rng: np.random.Generator) -> None:
    b, _ = blocks(rng, "q4_1", 20, 128)
    x = rng.standard_normal((40, 128)).astype(np.float32)
    x[1, 70], x[4, 3] = np.nan, np.inf
    for m in (5, 12, 40):  # GEMV, GEMV in two passes, GEMM
        y = Q.qlinear(x[:m], b, "q4_1")
        assert np.isnan(y[[1, 4]]).all() and np.isfinite(np.delete(y, [1, 4], axis=0)).all()


@pytest.mark.parametrize("fmt", ["q4_1", "bf16", "f16", "q3_k"])
def test_every_row_count_and_narrow_outputs(rng: np.random.Generator, fmt: str) -> None:
    """Rows 1..17, 24, 32 and 33 cover each GEMV pass size, the GEMV in passes and the switch
    to the GEMM; N of 1, 3 and 13 the one-row groups and the overlapping last group of a ragged
    N."""
    k = 256 if fmt == "q3_k" else 160
    for n in (1, 3, 13):
        b, wf = blocks(rng, fmt, n, k)
        for m in (*range(1, 18), 24, 32, 33):
            x = rng.standard_normal((m, k)).astype(np.float32)
            if fmt in Q.INT8_FORMATS:
                assert_int8_matches(Q.qlinear(x, b, fmt), x, b, fmt, wf)
            else:
                assert_matches(Q.qlinear(x, b, fmt), x, wf, fmt)


def test_leading_dims_and_out_buffer(rng: np.random.Generator) -> None:
    b, wf = blocks(rng, "q8_0", 19, 64)
    x = rng.standard_normal((2, 5, 64)).astype(np.float32)
    out = np.full((2, 5, 19), np.nan, np.float32)
    assert Q.qlinear(x, b, "q8_0", out=out) is out
    assert_int8_matches(out, x, b, "q8_0", wf)
    assert Q.qlinear(np.zeros((0, 64), np.float32), b, "q8_0").shape == (0, 19)


def test_portable_kernels_agree(rng: np.random.Generator) -> None:
    """The plain-C path (what a machine without AVX-512 runs), compiled here on purpose: the
    integer path gives the same bits, the float path the same values up to rounding."""
    assert Q.library(portable=True).simd is False
    for fmt, n, k in (("q4_1", 13, 96), ("q4_0", 4, 64), ("q8_0", 9, 64), ("bf16", 6, 70), ("f16", 3, 33), ("q4_k", 5, 256), ("q6_k", 7, 512), ("q5_k", 6, 256), ("q3_k", 5, 512), ("q2_k", 3, 256)):
        b, wf = blocks(rng, fmt, n, k)
        for m in (1, 3, 17, 40):
            x = rng.standard_normal((m, k)).astype(np.float32)
            y = Q.qlinear(x, b, fmt, portable=True)
            if fmt in Q.INT8_FORMATS:
                assert_int8_matches(y, x, b, fmt, wf)
                np.testing.assert_array_equal(y, Q.qlinear(x, b, fmt))
                continue
            assert_matches(y, x, wf, fmt, Q.library(portable=True))
            if rounds_x(fmt):
                assert (np.abs(y - Q.qlinear(x, b, fmt)) <= Q.bf16_bound(x, wf) * 1.01 + 1e-5 * float(np.abs(y).max())).all()
            else:
                np.testing.assert_allclose(y, Q.qlinear(x, b, fmt), rtol=1e-5, atol=1e-5 * float(np.abs(y).max()))


def test_bf16_dot_product_gemv_and_gemm(rng: np.random.Generator) -> None:
    """With AVX-512 BF16, bf16 rounds x to bf16 and takes vdpbf16ps at every row count (the GEMV
    up to 8 rows, the GEMM beyond): the product of the rounded x to float32 rounding, within
    ``bf16_bound`` of the float32 path (compiled without it); odd K (a pair padded with zero,
    the GEMV's last piece loaded masked), K past one panel (2048), ragged N; a row's bits are
    the same in any batch of up to 8 rows, and in any batch of more; NaN and inf in x reach
    only their row."""
    lib = Q.library()
    if not lib.bf16dot:
        pytest.skip("no AVX-512 BF16 here: the bf16 GEMM is the float32 one")
    assert not Q.library(bf16dot=False, families=("bf16",)).bf16dot
    for n, k in ((37, 70), (3, 33), (64, 2080), (33, 4097)):
        b, wf = blocks(rng, "bf16", n, k)
        x = rng.standard_normal((29, k)).astype(np.float32)
        full, few = Q.qlinear(x, b, "bf16"), Q.qlinear(x[:8], b, "bf16")
        for m in (1, 2, 5, 8, 9, 12, 13, 29):
            y = Q.qlinear(x[:m], b, "bf16")
            assert_matches(y, x[:m], wf, "bf16")
            np.testing.assert_array_equal(y, (few if m <= 8 else full)[:m])
            exact = Q.qlinear(x[:m], b, "bf16", bf16dot=False)
            assert (np.abs(y - exact) <= Q.bf16_bound(x[:m], wf) * 1.01 + 1e-5 * float(np.abs(exact).max())).all()
    b, _ = blocks(rng, "bf16", 20, 96)
    for m in (6, 12):
        x = rng.standard_normal((m, 96)).astype(np.float32)
        x[1, 70], x[4, 3] = np.nan, np.inf
        y = Q.qlinear(x, b, "bf16")
        assert np.isnan(y[1]).all() and not np.isfinite(y[4]).any() and np.isfinite(np.delete(y, [1, 4], axis=0)).all()


def test_bf16x16_rows(rng: np.random.Generator) -> None:
    """``bf16x16`` (bf16 rows interleaved by pairs in groups of 16), in every build (AVX-512
    BF16's kernels, the float32 one without them, the portable one): that build's bf16 product
    to float32 rounding (x rounded to bf16 where it rounds it), each row's bits the same in any
    batch the GEMV takes and, with AVX-512 BF16, the GEMM's bits and the plain rows' GEMM's (one
    chain over the pairs per output); N with half a panel left (80), K of one pair, odd pairs,
    past a panel (2050); odd K and ragged groups refused."""
    for variant in ({}, {"bf16dot": False}, {"portable": True}):
        lib = Q.library(**variant, families=("bf16",))
        for n, k in ((16, 2), (48, 34), (80, 576), (32, 2050)):
            b, wf = blocks(rng, "bf16", n, k)
            bx = interleave_rows(b, "bf16")
            x = rng.standard_normal((29, k)).astype(np.float32)
            full, few = Q.qlinear(x, bx, "bf16x16", **variant), Q.qlinear(x[:8], bx, "bf16x16", **variant)
            for m in (0, 1, 3, 8, 9, 13, 29):
                y = Q.qlinear(x[:m], bx, "bf16x16", **variant)
                assert y.shape == (m, n)
                if m:
                    assert_matches(y, x[:m], wf, "bf16", lib)
                np.testing.assert_array_equal(y, (few if m <= 8 else full)[:m])
                if lib.bf16dot and m > 8:
                    np.testing.assert_array_equal(y, Q.qlinear(x[:m], b, "bf16"))
            if lib.bf16dot and k <= 2048:
                np.testing.assert_array_equal(few, full[:8])
    b, _ = blocks(rng, "bf16", 16, 33)
    with pytest.raises(ValueError, match="whole blocks"):
        interleave_rows(b, "bf16")
    with pytest.raises(RuntimeCheckError, match="multiple of the bf16x16 block"):
        Q.qlinear(np.zeros((1, 33), np.float32), np.zeros((16, 66), np.uint8), "bf16x16")
    with pytest.raises(RuntimeCheckError, match="groups of 16, got 24 rows"):
        Q.qlinear(np.zeros((1, 32), np.float32), np.zeros((24, 64), np.uint8), "bf16x16")


@needs_smollm2
def test_smollm2_blocks(rng: np.random.Generator) -> None:
    reader = gguf.GGUFReader(SMOLLM2)
    tensors = {t.name: t for t in reader.tensors}
    for name, fmt, rows in (("blk.0.attn_k.weight", "q4_1", None), ("blk.29.ffn_down.weight", "q4_1", None), ("token_embd.weight", "q8_0", 3000)):
        t = tensors[name]
        assert t.tensor_type == GGML[fmt]
        b = np.asarray(t.data)[:rows]  # rows of .data are the blocks of one output feature
        wf = dequantize(b, GGML[fmt])
        k = wf.shape[1]
        for m in ROWS:
            x = rng.standard_normal((m, k)).astype(np.float32)
            assert_int8_matches(Q.qlinear(x, b, fmt), x, b, fmt, wf)


# -- rows interleaved in groups of 16 ------------------------------------------------------------


@pytest.mark.parametrize("fmt", INT8)
def test_interleaved_rows_give_the_same_bits(rng: np.random.Generator, fmt: str) -> None:
    """``q4_1x16`` & co. hold the blocks of ``q4_1`` & co. 16 rows side by side: the GEMV, the
    GEMM, every build and the legalized kernel give the same bits as on the plain rows."""
    xfmt = f"{fmt}x16"
    for n, k in ((48, 96), (16, 32), (80, 576)):
        b, _ = blocks(rng, fmt, n, k)
        bx = interleave_rows(b, fmt)
        assert bx.shape == b.shape and not np.array_equal(bx, b)
        for m in (1, 3, 8, 9, 33):
            x = rng.standard_normal((m, k)).astype(np.float32)
            y = Q.qlinear(x, b, fmt)
            np.testing.assert_array_equal(Q.qlinear(x, bx, xfmt), y)
            np.testing.assert_array_equal(Q.qlinear(x, bx, xfmt, vnni=False), y)
            np.testing.assert_array_equal(Q.qlinear(x, bx, xfmt, portable=True), y)
    n, k = 32, 64
    b, _ = blocks(rng, fmt, n, k)
    x = rng.standard_normal((5, k)).astype(np.float32)
    np.testing.assert_array_equal(legalized(xfmt, n, k)["main"](x, interleave_rows(b, fmt)), legalized(fmt, n, k)["main"](x, b))
    ids = SymVar("i", 1)
    for f, table in ((fmt, b), (xfmt, interleave_rows(b, fmt))):
        take = module([("t", (n, Q.row_bytes(f, k)), "uint8"), ("ids", (ids,), "int64")], lambda t, i, f=f: op.quant_take(t, i, f, k))
        rows = tilework.VM(tilework.build(take))["main"](table, np.array([0, 17, 31, 5], np.int64))
        if f == fmt:
            plain = rows
    np.testing.assert_array_equal(rows, plain)


@pytest.mark.parametrize("n", [1, 13, 48])
def test_q8_0_tiles_of_eight_rows_give_the_loops_bits(rng: np.random.Generator, n: int) -> None:
    """q8_0 without AVX-512 runs tiles of 8 W rows over every row of x (in passes of 16): at
    1, 3, 5, 8, 16 rows and past a pass, on plain and interleaved rows, a ragged last tile, and
    weights of -128 against activations of +-127 (vpmaddubsw's widest pair sums), the bits of
    the portable loop."""
    k = 576 if n == 48 else 96
    b, _ = blocks(rng, "q8_0", n, k)
    b[0, 2:34] = 0x80  # a block of -128s
    wf = dequantize(b, GGML["q8_0"]).reshape(n, k).astype(np.float32)
    for m in (1, 3, 5, 8, 16, 17, 40):
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[:, :32] = np.where(rng.random((m, 32)) < 0.5, -1.0, 1.0)  # quantizes to +-127
        y = Q.qlinear(x, b, "q8_0")
        assert_int8_matches(y, x, b, "q8_0", wf)
        np.testing.assert_array_equal(y, Q.qlinear(x, b, "q8_0", portable=True))
        for i in (0, m - 1):
            np.testing.assert_array_equal(Q.qlinear(x[i : i + 1], b, "q8_0")[0], y[i])
        if n % 16 == 0:
            np.testing.assert_array_equal(Q.qlinear(x, interleave_rows(b, "q8_0"), "q8_0x16"), y)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1"])
@pytest.mark.parametrize("n", [1, 13, 48])
def test_q4_tiles_of_eight_rows_give_the_loops_bits(rng: np.random.Generator, fmt: str, n: int) -> None:
    """q4_0 and q4_1 without AVX-512 run tiles of 8 W rows over every row of x (in passes of
    16), the nibbles unpacked once a block: at 1, 3, 5, 8, 16, 17 rows, on plain and
    interleaved rows, a ragged last tile, and nibbles of 15 against activations of +-127 (the
    widest pair sums; rows of all +127 and all -127 against them reach the most a lane's 8 pair
    sums add up to in int16, +-30480), the bits of the portable loop."""
    k = 576 if n == 48 else 96
    b, _ = blocks(rng, fmt, n, k)
    at = 2 if fmt == "q4_0" else 4
    b[0, at : at + 16] = 0xFF  # a block of 15s
    b[n - 1, at : at + 16] = 0xFF
    wf = dequantize(b, GGML[fmt]).reshape(n, k).astype(np.float32)
    for m in (1, 3, 5, 8, 16, 17):
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[:, :32] = np.where(rng.random((m, 32)) < 0.5, -1.0, 1.0)  # quantizes to +-127
        x[0, :32], x[m - 1, :32] = 1.0, -1.0
        y = Q.qlinear(x, b, fmt)
        assert_int8_matches(y, x, b, fmt, wf)
        np.testing.assert_array_equal(y, Q.qlinear(x, b, fmt, portable=True))
        for i in (0, m - 1):
            np.testing.assert_array_equal(Q.qlinear(x[i : i + 1], b, fmt)[0], y[i])
        if n % 16 == 0:
            np.testing.assert_array_equal(Q.qlinear(x, interleave_rows(b, fmt), fmt + "x16"), y)


def test_interleaved_rows_need_whole_groups(rng: np.random.Generator) -> None:
    b, _ = blocks(rng, "q4_1", 24, 64)
    with pytest.raises(ValueError, match="multiple of 16 rows"):
        interleave_rows(b, "q4_1")
    with pytest.raises(RuntimeCheckError, match="groups of 16, got 24 rows"):
        Q.qlinear(np.zeros((1, 64), np.float32), b, "q4_1x16")
    with pytest.raises(TileworkError, match="24 rows are not whole groups"):
        module([("x", (1, 64), "float32"), ("w", (24, Q.row_bytes("q4_1", 64)), "uint8")], lambda x, w: op.quant_linear(x, w, "q4_1x16", 64))


@pytest.mark.parametrize("name, nbytes", [("q4_0", 18), ("q4_1", 20), ("q5_0", 22), ("q5_1", 24), ("q8_0", 34), ("bf16", 4), ("q4_k", 144), ("q5_k", 176), ("q6_k", 210), ("q3_k", 110), ("q2_k", 84)])
def test_the_library_interleaves_the_same_bytes(rng: np.random.Generator, name: str, nbytes: int) -> None:
    """``QuantLibrary.interleave`` (C, every thread) gives ``interleave_rows``' bytes: one group,
    several, odd block counts, a large matrix (threads), none; into ``out`` too."""
    lib = Q.library()
    for rows, blocks_ in ((16, 1), (32, 3), (48, 7), (4096, 18), (0, 2)):
        data = rng.integers(0, 256, (rows, blocks_ * nbytes), dtype=np.uint8)
        np.testing.assert_array_equal(lib.interleave(data, name), interleave_rows(data, name))
    data = rng.integers(0, 256, (32, 5 * nbytes), dtype=np.uint8)
    out = np.zeros_like(data)
    assert lib.interleave(data, name, out=out) is out
    np.testing.assert_array_equal(out, interleave_rows(data, name))


LOADER_REFUSALS = [
    (lambda lib: lib.interleave(np.zeros((24, 20), np.uint8), "q4_1"), "multiple of 16 rows"),
    (lambda lib: lib.interleave(np.zeros((16, 64), np.uint8), "f16"), "'f16' has no interleaved layout"),
    (lambda lib: lib.interleave(np.zeros((16, 20), np.uint8), "q4_1", out=np.zeros((16, 21), np.uint8)), "out must be"),
    (lambda lib: lib.dequantize(np.zeros((16, 20), np.uint8), "q4_1x16"), "q4_1x16"),
    (lambda lib: lib.dequantize(np.zeros((2, 35), np.uint8), "q8_0"), "multiple of 34 bytes"),
    (lambda lib: lib.dequantize(np.zeros((2, 34), np.uint8), "q8_0", out=np.empty(63, np.float32)), "out must be a writable C-contiguous float32 array of 64 elements"),
    (lambda lib: lib.dequantize(np.zeros((2, 34), np.uint8), "q8_0", bf16=True, out=np.empty(64, np.float32)), "uint16"),
]


@pytest.mark.parametrize("call, message", LOADER_REFUSALS)
def test_the_library_refuses_bad_loader_calls(call: Callable[[Q.QuantLibrary], object], message: str) -> None:
    """The loaders' entry points (``dequantize``, ``interleave``) name what is wrong."""
    with pytest.raises(RuntimeCheckError, match=message):
        call(Q.library())


# -- the backend ---------------------------------------------------------------------------------


def test_available_and_offloaded_through_build(rng: np.random.Generator) -> None:
    ok, why = availability("quant")
    assert ok, why
    n, k = 45, 96
    b, wf = blocks(rng, "q4_1", n, k)
    rows = SymVar("n", 1)
    mod = module([("x", (2, rows, k), "float32"), ("w", (n, b.shape[1]), "uint8")], lambda x, w: op.relu(op.quant_linear(x, w, "q4_1", k)))
    exe = tilework.build(mod, backends=["quant", "codegen"])
    calls = [ins[2] for f in exe.functions.values() for ins in f.code if ins[0] == "call"]
    assert ("extern", "quant.linear.q4_1") in calls
    kernels = [name for kind, name in calls if kind == "kernel"]
    assert kernels and not any("quant" in name for name in kernels)  # the relu only
    vm, ref = tilework.VM(exe), tilework.VM(tilework.build(mod))
    for m in (1, 3, 8):
        x = rng.standard_normal((2, m, k)).astype(np.float32)
        y = vm["main"](x, b)
        assert y.shape == (2, m, n)
        np.testing.assert_array_equal(y, np.maximum(Q.qlinear(x, b, "q4_1"), 0))
        bound = Q.activation_bound(x.reshape(-1, k), wf).reshape(y.shape) * 1.01 + 1e-5
        assert (np.abs(y - ref["main"](x, b)) <= bound).all()  # the legalized, dequantized product


def test_a_residual_add_runs_in_the_extern(rng: np.random.Generator) -> None:
    """``r + quant_linear(x, w)`` (either order) is one library call with the same bits as the
    product and a separate add; an add that broadcasts stays a kernel of its own."""
    n, k = 48, 96
    b, _ = blocks(rng, "q4_1", n, k)
    rows = SymVar("n", 1)
    mod = module(
        [("x", (rows, k), "float32"), ("w", (n, b.shape[1]), "uint8"), ("r", (rows, n), "float32"), ("bias", (n,), "float32")],
        lambda x, w, r, bias: op.add(op.add(r, op.quant_linear(x, w, "q4_1", k)), op.add(op.quant_linear(op.relu(x), w, "q4_1", k), bias)),
    )
    exe = tilework.build(mod, backends=["quant", "codegen"])
    calls = [ins[2][1] for f in exe.functions.values() for ins in f.code if ins[0] == "call"]
    assert calls.count("quant.linear_add.q4_1") == 1 and calls.count("quant.linear.q4_1") == 1
    vm = tilework.VM(exe)
    for m in (1, 3, 9):
        x, r, bias = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (m, n), (n,)))
        want = (r + Q.qlinear(x, b, "q4_1")) + (Q.qlinear(np.maximum(x, 0), b, "q4_1") + bias)
        np.testing.assert_array_equal(vm["main"](x, b, r, bias), want)
    y = np.empty((2, n), np.float32)
    with pytest.raises(RuntimeCheckError, match="residual to add is the output buffer"):
        lookup_extern(Q.extern_symbol("q4_1", add=True))(np.ones((2, k), np.float32), b, y, (2, n, k), y)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q5_0", "q8_0", "q4_1x16", "q5_1x16", "q8_0x16"])
def test_residual_added_by_the_parallel_gemv_gives_the_same_bits(rng: np.random.Generator, fmt: str) -> None:
    """The GEMV (M <= 32) adds the residual inside its parallel region, tile by tile; the GEMM
    after it: either way the bits of the product plus a separate add, on weights large enough to
    be shared by the threads."""
    base = fmt.removesuffix("x16")
    n, k = 256, 576
    b, _ = blocks(rng, base, n, k)
    w = interleave_rows(b, base) if fmt != base else b
    add = lookup_extern(Q.extern_symbol(fmt, add=True))
    for m in (0, 1, 3, 8, 9, 20, 33):
        x, r = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)
        y = np.empty((m, n), np.float32)
        add(x, w, r, (m, n, k), y)
        np.testing.assert_array_equal(y, Q.qlinear(x, b, base) + r)


def test_import_compiles_nothing() -> None:
    code = "import tilework, tilework.backend.quant as q; assert not q._LIBS; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_the_source_ships_as_package_data() -> None:
    assert resources.files("tilework.backend").joinpath(Q.SOURCE).is_file()
    pyproject = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "pyproject.toml")
    with open(pyproject) as f:
        text = f.read()
    assert '[tool.setuptools.package-data]' in text and '"**/*.c"' in text
