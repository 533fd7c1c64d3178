"""Block formats: ``dequantize`` against ``gguf.quants`` on synthetic blocks of every format, and
``quantize`` against llama.cpp's reference rounding (as ``gguf.quants`` reproduces it)."""

from __future__ import annotations

import numpy as np
import pytest

from tilework.errors import ShapeError, UnsupportedError
from tilework.llm.quant import QUANT_FORMATS, QUANTIZABLE, QuantTensor, block_format, dequantize_rows, quantize
from tilework.op.quant import bf16_bits

gguf = pytest.importorskip("gguf")
from gguf import quants as gq  # noqa: E402

# byte offsets of the fp16 scale fields in a block: random bytes there could be inf or nan
SCALE_FIELDS = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q4_k": (0, 2), "q6_k": (208,), "q5_k": (0, 2), "q3_k": (108,), "q2_k": (80, 82), "iq4_nl": (0,), "iq4_xs": (0,)}


def ggml(fmt: str) -> "gguf.GGMLQuantizationType":
    return gguf.GGMLQuantizationType(QUANT_FORMATS[fmt].ggml_type)


def random_blocks(fmt: str, rows: int, blocks_per_row: int, seed: int = 0) -> np.ndarray:
    """Rows of random block bytes: every nibble, 6-bit scale and int8 pattern occurs; the fp16
    scales are finite."""
    rng = np.random.default_rng(seed)
    f = QUANT_FORMATS[fmt]
    if f.block == 1:
        dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.float32}[fmt]
        x = (rng.standard_normal((rows, blocks_per_row)) * 3).astype(dtype)
        return gq.quantize(x, ggml(fmt)) if fmt == "bf16" else x.view(np.uint8)
    data = rng.integers(0, 256, size=(rows, blocks_per_row * f.nbytes), dtype=np.uint8)
    blocks = data.reshape(-1, f.nbytes)
    for at in SCALE_FIELDS[fmt]:
        blocks[:, at : at + 2] = rng.standard_normal((blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
    return data


def test_formats_match_gguf_sizes() -> None:
    for f in QUANT_FORMATS.values():
        assert gguf.GGML_QUANT_SIZES[ggml(f.name)] == (f.block, f.nbytes), f.name


def test_formats_agree_with_quant_linear_op() -> None:
    """The op ``quant_linear`` names the same formats with the same block geometry."""
    from tilework.op.quant import QUANT_FORMATS

    for name, f in QUANT_FORMATS.items():
        assert (QUANT_FORMATS[name].block, QUANT_FORMATS[name].nbytes, QUANT_FORMATS[name].ggml_type) == (f.block, f.nbytes, f.ggml_type)


@pytest.mark.parametrize("fmt", list(QUANT_FORMATS))
def test_dequantize_random_blocks_matches_gguf(fmt: str) -> None:
    data = random_blocks(fmt, rows=24, blocks_per_row=5)
    mine = dequantize_rows(data, fmt)
    ref = gq.dequantize(data, ggml(fmt))
    assert mine.dtype == np.float32 and mine.shape == ref.shape
    np.testing.assert_array_equal(mine, ref)


@pytest.mark.parametrize("fmt", [f for f in QUANTIZABLE if f != "f32"])
def test_dequantize_gguf_quantized_matches_gguf(fmt: str) -> None:
    """Blocks written by gguf's own quantizer (the formats it can write) decode alike."""
    x = np.random.default_rng(1).standard_normal((16, 128)).astype(np.float32)
    data = x.astype(np.float16).view(np.uint8) if fmt == "f16" else gq.quantize(x, ggml(fmt))
    np.testing.assert_array_equal(dequantize_rows(data, fmt), gq.dequantize(data, ggml(fmt)))


@pytest.mark.parametrize("fmt", ["f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_quantize_is_llama_cpp_reference_rounding(fmt: str) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((40, 96)).astype(np.float32) * rng.uniform(0.01, 100, (40, 1)).astype(np.float32)
    x[0] = 0  # all-zero blocks: scale 0
    x[1] = 1.5  # constant blocks
    x[2, :32] = -x[2, :32]  # ties of magnitude between signs
    x[3, :32] = np.linspace(-8, 7, 32)  # exact steps and halves
    x[4, :32] = np.linspace(-16, 15, 32)  # q5_0's exact steps
    ref = x.astype(np.float16).view(np.uint8) if fmt == "f16" else gq.quantize(x, ggml(fmt))
    q = quantize(x, fmt, "w")
    assert q.shape == (40, 96) and q.fmt == fmt and not q.data.flags.writeable
    np.testing.assert_array_equal(q.data, ref)


def test_quantize_round_trip_error_is_bounded() -> None:
    """Per block: Q8_0 within half a step (amax/127) plus the fp16 rounding of the scale; Q4_0
    within one step (amax/8: the value opposite the peak is clipped to +7), Q5_0 (amax/16: to
    +15) likewise; Q4_1 within half a step ((max - min)/15) plus the fp16 rounding of scale and
    minimum, Q5_1 ((max - min)/31) likewise."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 256)) * rng.uniform(0.1, 10, (64, 1))).astype(np.float32)
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(1, keepdims=True)
    lo, hi = blocks.min(1, keepdims=True), blocks.max(1, keepdims=True)
    fp16 = 2.0**-11  # relative rounding of an fp16
    err = {f: np.abs(quantize(x, f).dequantize() - x).reshape(-1, 32) for f in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")}
    assert (err["q8_0"] <= amax / 127 * (0.5 + 127 * fp16) * 1.001).all()
    assert (err["q4_0"] <= amax / 8 * (1 + 8 * fp16) * 1.001).all()
    assert (err["q5_0"] <= amax / 16 * (1 + 16 * fp16) * 1.001).all()
    step = (hi - lo) / 15
    assert (err["q4_1"] <= step * (0.5 + 15 * fp16) * 1.001 + np.abs(lo) * fp16).all()
    step = (hi - lo) / 31
    assert (err["q5_1"] <= step * (0.5 + 31 * fp16) * 1.001 + np.abs(lo) * fp16).all()
    # and the errors are not all at the bound: the mean is about a quarter step
    assert err["q8_0"].mean() < 0.3 * (amax / 127).mean()


def test_quantize_keeps_leading_dims_and_zeros() -> None:
    x = np.zeros((2, 3, 64), np.float32)
    for fmt in QUANTIZABLE:
        q = quantize(x, fmt)
        assert q.data.shape == (2, 3, QUANT_FORMATS[fmt].row_bytes(64))
        assert q.dequantize().shape == (2, 3, 64) and not q.dequantize().any()


PLAIN = [f for f in QUANT_FORMATS if f != "f32"]  # the quant library's plain layouts


def test_bf16_bits_round_to_nearest_even_and_keep_nan() -> None:
    """``bf16_bits``: ties to even, carries into the exponent, inf stays inf, the largest finite
    float32 values round to inf, and a NaN of either sign stays a quiet NaN (NaNs whose payload
    has its top bits set wrapped to zero before)."""
    from tilework.op.quant import bf16_bits

    u = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0x00008000], np.uint32)
    want = np.array([0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7F80, 0xFF80, 0x7FC0, 0xFFFF, 0x7FC0, 0x0000], np.uint16)
    np.testing.assert_array_equal(bf16_bits(u.view(np.float32)), want)
    assert bf16_bits(np.zeros((2, 3), np.float32)).shape == (2, 3)


@pytest.mark.parametrize("fmt", PLAIN)
@pytest.mark.parametrize("rows, blocks", [(0, 3), (1, 1), (3, 2), (37, 5)])
def test_the_library_decodes_the_numpy_bits(fmt: str, rows: int, blocks: int) -> None:
    """``QuantLibrary.dequantize`` (C, every thread) gives ``dequantize_rows``' float32 bits
    (gguf's too), also for random scale bytes (inf, nan, subnormal halves), and their
    bfloat16 rounding to nearest even."""
    from tilework.backend import quant as backend

    lib = backend.library()
    for data in (random_blocks(fmt, rows, blocks, seed=rows), np.random.default_rng(rows).integers(0, 256, (rows, blocks * QUANT_FORMATS[fmt].nbytes), dtype=np.uint8)):
        with np.errstate(all="ignore"):
            ref = dequantize_rows(data, fmt)
        got = lib.dequantize(data, fmt)
        assert got.dtype == np.float32 and got.shape == ref.shape
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
        np.testing.assert_array_equal(lib.dequantize(data, fmt, bf16=True), bf16_bits(ref))
    if rows:
        np.testing.assert_array_equal(lib.dequantize(random_blocks(fmt, rows, blocks), fmt), gq.dequantize(random_blocks(fmt, rows, blocks), ggml(fmt)))


@pytest.mark.parametrize("library", [True, False])
def test_dequantize_into_out(library: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``QuantTensor.dequantize(out=)`` writes the values (or bf16 bits) into ``out`` and returns
    it in the tensor's shape, in the library and in NumPy alike."""
    from tilework.backend import quant as backend
    from tilework.llm import quant as lq

    if library:
        backend.library()  # built: the loaders take it (library_if_built)
    else:
        monkeypatch.setattr(lq, "_library", lambda: None)
    shape = (lq.LIBRARY_WEIGHTS // 32 + 3, 32)
    t = quantize(np.random.default_rng(6).standard_normal(shape).astype(np.float32), "q8_0", "w")
    ref = dequantize_rows(t.data, "q8_0")
    flat = np.full(ref.size + 5, np.nan, np.float32)
    got = t.dequantize(out=flat[: ref.size])
    assert got.shape == shape and np.shares_memory(got, flat) and np.isnan(flat[ref.size :]).all()
    np.testing.assert_array_equal(got, ref)
    bits = np.zeros(ref.size, np.uint16)
    np.testing.assert_array_equal(t.dequantize(bf16=True, out=bits), bf16_bits(ref))
    np.testing.assert_array_equal(bits.reshape(shape), bf16_bits(ref))


@pytest.mark.parametrize("size", ["small", "large"])
def test_quant_tensor_dequantize_and_bf16_bits(size: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors of ``LIBRARY_WEIGHTS`` or more decode in the library, the others in NumPy; where
    the library cannot be built, NumPy decodes them all: the same values either way."""
    from tilework.backend import quant as backend
    from tilework.llm import quant as lq

    shape = (3, 64, 32) if size == "small" else (lq.LIBRARY_WEIGHTS // 64 + 5, 64)
    t = quantize(np.random.default_rng(5).standard_normal(shape).astype(np.float32), "q4_1", "w")
    ref = dequantize_rows(t.data, "q4_1").reshape(shape)
    calls: list[str] = []
    real = lq._library
    backend.library()  # built: the loaders take it (library_if_built)

    def spy() -> object:
        lib = real()
        calls.append("library" if lib is not None else "none")
        return lib

    monkeypatch.setattr(lq, "_library", spy)
    np.testing.assert_array_equal(t.dequantize(), ref)
    np.testing.assert_array_equal(t.dequantize(bf16=True), bf16_bits(ref).reshape(shape))
    assert calls == ([] if size == "small" else ["library", "library"])
    monkeypatch.setattr(lq, "_library", lambda: None)  # no C compiler
    np.testing.assert_array_equal(t.dequantize(), ref)
    np.testing.assert_array_equal(t.dequantize(bf16=True), bf16_bits(ref).reshape(shape))


def test_quant_tensor_rows() -> None:
    x = np.random.default_rng(4).standard_normal((10, 64)).astype(np.float32)
    q = quantize(x, "q8_0", "emb")
    full = q.dequantize()
    np.testing.assert_array_equal(q.take_rows([3, 0, 3]), full[[3, 0, 3]])
    order = np.arange(10)[::-1]
    g = q.gather_rows(order)
    np.testing.assert_array_equal(g.dequantize(), full[order])
    assert not g.data.flags.writeable
    v = quantize(np.arange(6, dtype=np.float32), "f32", "bias").gather_rows(np.array([5, 4, 3, 2, 1, 0]))
    np.testing.assert_array_equal(v.dequantize(), np.arange(6)[::-1])


def test_bad_formats_and_shapes() -> None:
    assert block_format("Q4_1") is QUANT_FORMATS["q4_1"]
    assert block_format("Q5_0") is QUANT_FORMATS["q5_0"]
    assert block_format("IQ4_XS") is QUANT_FORMATS["iq4_xs"]
    with pytest.raises(UnsupportedError, match="iq2_xxs"):
        block_format("iq2_xxs")
    with pytest.raises(UnsupportedError, match="q4_k"):
        quantize(np.zeros((1, 256), np.float32), "q4_k")
    with pytest.raises(ShapeError, match="multiple of 32"):
        quantize(np.zeros((2, 48), np.float32), "q8_0")
    with pytest.raises(ShapeError, match="uint8"):
        QuantTensor("w", (4, 32), "q8_0", np.zeros((4, 33), np.uint8))
