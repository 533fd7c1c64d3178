"""The quant backend's integer path built for AVX2 without AVX-512 (what a CPU with AVX2, FMA and
F16C runs: the portable loop with AVX2 block dot products, and the 8-row tiles of q8_0, q4_0,
q4_1, q5_0, q5_1): the same bits as the library this machine runs (the file header's float32
sequence on every build), for every integer-path format, plain and 16 rows interleaved, at the
GEMV's and the GEMM's row counts, on blocks with extreme values against activations of +-127
(q6_k: the 6-bit values 63 and 0, scales 127 and -128; q3_k: values 3 and -4, scales 31 and
-32; q2_k: values 3, scales and mins 15; iq4: the values -127 and 113 under iq4_xs's scales
-32 and 31).

The library is compiled here from ``quant.source`` (the integer path alone) with
``-mavx2 -mfma -mf16c`` and no ``-march=native``, and called through ctypes; skipped where the CPU
lacks AVX2, FMA or F16C or there is no C compiler."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.backend.helpers import K_QUANT_HALVES, k_quant_blocks
from tests.backend.test_quant_iq4 import extreme_blocks
from tilework.backend import quant as Q
from tilework.backend.quant import _cpu_flags
from tilework.codegen.c import toolchain
from tilework.errors import BuildError
from tilework.op.quant import QUANT_FORMATS, interleave_rows, interleaved

pytestmark = pytest.mark.skipif(not {"avx2", "fma", "f16c"} <= _cpu_flags(), reason="an AVX2 build runs on a CPU with AVX2, FMA and F16C")

PLAIN = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_nl", "iq4_xs")
HALVES = {"q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q8_0": (0,)}  # the blocks' fp16 fields


@pytest.fixture(scope="module")
def avx2_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    try:
        cc = toolchain.compiler_command()
    except BuildError as e:
        pytest.skip(str(e))
    d = tmp_path_factory.mktemp("avx2")
    src, so = Path(d, "quant_avx2.c"), Path(d, "quant_avx2.so")
    src.write_text(Q.source(families=tuple(f for f in Q.FAMILIES if f not in ("bf16", "f16"))))
    subprocess.run([*cc, "-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    lib = ctypes.CDLL(str(so))
    assert lib.tw_quant_simd() == 0  # not the AVX-512 kernels
    return lib


def weight_blocks(rng: np.random.Generator, fmt: str, n: int, k: int) -> np.ndarray:
    """Random ``fmt`` rows with sane fp16 scales; q6_k's, q3_k's, q2_k's and iq4's first and last
    rows at the extremes."""
    if fmt in ("iq4_nl", "iq4_xs"):
        return extreme_blocks(rng, fmt, n, k)
    if fmt in K_QUANT_HALVES:
        b = k_quant_blocks(rng, fmt, n, k)
        if fmt == "q6_k":
            b[0, :192], b[0, 192:208] = 0xFF, 0x7F
            b[n - 1, :192], b[n - 1, 192:208] = 0, 0x80
        elif fmt == "q3_k":  # values 3, scales 31; values -4, scales -32
            b[0, :108], b[n - 1, :108] = 0xFF, 0
        elif fmt == "q2_k":  # values 3, scales and mins 15; scales 0, mins 15
            b[0, :80] = 0xFF
            b[n - 1, :16] = 0xF0
        return b
    f = QUANT_FORMATS[fmt]
    b = rng.integers(0, 256, (n, f.row_bytes(k)), dtype=np.uint8)
    blocks = b.reshape(n, k // f.block, f.nbytes)
    for at in HALVES[fmt]:
        blocks[:, :, at : at + 2] = (rng.standard_normal((n, k // f.block, 1)) * 0.01).astype(np.float16).view(np.uint8)
    return b


@pytest.mark.parametrize("fmt", PLAIN)
def test_the_avx2_build_gives_the_same_bits(avx2_lib: ctypes.CDLL, fmt: str) -> None:
    rng = np.random.default_rng(5)
    k = 512
    for n in (13, 32):
        b = weight_blocks(rng, fmt, n, k)
        cases = [(fmt, b)] + ([(interleaved(fmt), interleave_rows(b, fmt))] if n % 16 == 0 else [])
        for m in (1, 3, 8, 9, 17):
            x = rng.standard_normal((m, k)).astype(np.float32)
            x[:, :64] = np.where(rng.random((m, 64)) < 0.5, -1.0, 1.0)  # quantizes to +-127
            for name, w in cases:
                y = np.full((m, n), np.nan, np.float32)
                rc = getattr(avx2_lib, f"tw_qlinear_{name}")(
                    ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(w.ctypes.data), ctypes.c_void_p(y.ctypes.data), ctypes.c_int64(m), ctypes.c_int64(n), ctypes.c_int64(k)
                )
                assert rc == 0, name
                np.testing.assert_array_equal(y, Q.qlinear(x, w, name), err_msg=f"{name} m={m} n={n}")
