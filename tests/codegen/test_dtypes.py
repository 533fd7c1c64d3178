"""float16 and bfloat16 conversions, bit for bit against NumPy / ml_dtypes (every half): with the
prelude's choice for this machine (``_Float16``; on x86 without AVX512-FP16 halves kept as bits,
widened by the branchless ``tw_h2f`` and narrowed by ``_Float16``) and with the software fallback
(``-DTW_SOFT_F16``), and in the interpreter."""

from __future__ import annotations

from typing import Iterator

import ml_dtypes
import numpy as np
import pytest

import tilework as tw
from tilework import te
from tilework.codegen import CKernelModule, build_library, interp
from tilework.codegen.c import toolchain
from tilework.ir.loop import TensorFunc

BF16 = ml_dtypes.bfloat16


def _conversions() -> TensorFunc:
    n = tw.dim("n")
    x = te.placeholder((n,), "float32", "x")
    h = te.placeholder((n,), "float16", "h")
    b = te.placeholder((n,), "bfloat16", "b")
    return te.create_func(
        [x, h, b],
        [
            te.compute((n,), lambda i: x[i].astype("float16"), "x_h"),
            te.compute((n,), lambda i: x[i].astype("bfloat16"), "x_b"),
            te.compute((n,), lambda i: h[i].astype("float32"), "h_x"),
            te.compute((n,), lambda i: b[i].astype("float32"), "b_x"),
            te.compute((n,), lambda i: h[i], "h_h"),
        ],
    )


FUNC = _conversions()


@pytest.fixture(scope="module", params=["native", "soft"])
def lib(request: pytest.FixtureRequest) -> Iterator[CKernelModule]:
    flags = toolchain.DEFAULT_CFLAGS + (" -DTW_SOFT_F16" if request.param == "soft" else "")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEWORK_CFLAGS", flags)
        yield build_library({"conv": FUNC})


def _f32_specials() -> np.ndarray:
    bits = [
        0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x477FE000, 0x477FEFFF, 0x477FF000,
        0x47800000, 0x49742400, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
        0x33800000, 0x33000000, 0x33000001, 0x387FC000, 0x38800000, 0x387FFFFF, 0x3F801000,
        0x3F803000, 0x3F802000, 0x3F808000, 0x3F818000, 0x3F817FFF, 0x00000001, 0x007FFFFF,
        0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x37800000, 0x37FFFFFF, 0x38000000,
    ]  # fmt: skip
    return np.array(bits, dtype=np.uint32).view(np.float32)


def _inputs(n_random: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    rand_bits = rng.integers(0, 2**32, size=n_random, dtype=np.uint64).astype(np.uint32).view(np.float32)
    small = rng.uniform(-1e-4, 1e-4, size=n_random // 4).astype(np.float32)
    x = np.concatenate([_f32_specials(), rand_bits, small])
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    size = max(len(x), 65536)
    x = np.resize(x, size)
    h = np.resize(every, size).view(np.float16)
    b = np.resize(every, size).view(BF16)
    return [x, h, b]


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    width = np.uint16 if got.itemsize == 2 else np.uint32
    g, w = got.view(width)[~nan], want.view(width)[~nan]
    bad = np.nonzero(g != w)[0]
    assert bad.size == 0, f"{bad.size} mismatches, first at {bad[:5]}: got {g[bad[:5]]}, want {w[bad[:5]]}"


def _expected(x: np.ndarray, h: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    with np.errstate(over="ignore", invalid="ignore"):
        return [x.astype(np.float16), x.astype(BF16), h.astype(np.float32), b.astype(np.float32), h]


def _outputs(n: int) -> list[np.ndarray]:
    return [np.zeros(n, np.float16), np.zeros(n, BF16), np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.float16)]


def test_c_conversions_are_exact(lib: CKernelModule) -> None:
    ins = _inputs(1 << 18)
    outs = _outputs(len(ins[0]))
    lib["conv"].run([*ins, *outs])
    for got, want in zip(outs, _expected(*ins)):
        _same_bits(got, want)


def test_interp_conversions_are_exact() -> None:
    ins = [a[:70000] for a in _inputs(4096)]
    outs = _outputs(len(ins[0]))
    interp.run(FUNC, [*ins, *outs])
    for got, want in zip(outs, _expected(*ins)):
        _same_bits(got, want)
