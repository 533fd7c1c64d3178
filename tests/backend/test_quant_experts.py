"""The quant backend's ``expert_linear`` (``tilework.backend.quant_experts``, the library's
``tw_qexperts_<fmt>``): bit for bit ``qlinear`` on each expert's gathered rows (the same
kernels), and against NumPy on the dequantized experts, for an integer format, a k-quant, an
interleaved one and bf16x16, at 0, 1 and odd token counts, with one ``x`` for every slot and one
per slot, ids with repeats, all on one expert (the GEMM), negative and out of range; refusals
that name the argument; offloading through ``tilework.build`` (the reference build's results)
and the native graph code (the VM's bits)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tilework as tw
from tests.backend.helpers import K_QUANT_HALVES, k_quant_blocks, offloaded
from tests.op.test_expert_linear import module
from tilework.backend import quant as Q
from tilework.backend.quant_experts import qexperts
from tilework.errors import RuntimeCheckError
from tilework.llm.quant import dequantize_rows, quantize
from tilework.op.quant import interleave_rows
from tilework.runtime.extern import lookup_extern_check

E, SLOTS = 4, 3


def experts(fmt: str, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``E`` experts' ``[n, k]`` weights as ``fmt`` block rows ``[E * n, row_bytes]`` and the
    float32 weights they decode to ``[E, n, k]``."""
    rng = np.random.default_rng(seed)
    base = fmt.removesuffix("x16")
    if base in K_QUANT_HALVES:  # no quantizer here: random blocks with sane scales
        data = k_quant_blocks(rng, base, E * n, k)
    else:
        data = np.ascontiguousarray(quantize(rng.standard_normal((E * n, k)).astype(np.float32), base).data).view(np.uint8).reshape(E * n, -1)
    weights = dequantize_rows(data, base).reshape(E, n, k).astype(np.float32)
    return (interleave_rows(data, base) if base != fmt else data), weights


def chosen(ids: np.ndarray) -> np.ndarray:
    """The expert of each pair: negative from the end, then clamped."""
    return np.clip(np.where(ids < 0, ids + E, ids), 0, E - 1)


def gathered(x: np.ndarray, w: np.ndarray, ids: np.ndarray, fmt: str) -> np.ndarray:
    """``qlinear`` on each expert's rows of ``x`` (its pairs in token order; with one ``x`` for
    every slot one row a token), scattered back."""
    t, s, k = x.shape
    n = w.shape[0] // E
    e = chosen(ids)
    out = np.full((t, ids.shape[1], n), np.nan, np.float32)
    for expert in range(E):
        pairs = [(i, j) for i in range(t) for j in range(ids.shape[1]) if e[i, j] == expert]
        rows = sorted({i for i, _ in pairs}) if s == 1 else pairs
        if not rows:
            continue
        xg = np.stack([x[r, 0] if s == 1 else x[r[0], r[1]] for r in rows])
        yg = Q.qlinear(xg, w[expert * n : (expert + 1) * n], fmt)
        for i, j in pairs:
            out[i, j] = yg[rows.index(i if s == 1 else (i, j))]
    return out


def cases(rng: np.random.Generator, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(x, ids) at 0, 1 and odd tokens, both x layouts: random ids (repeats; at 23 tokens more
    than the GEMV's 8 rows an expert), every token on expert 2, negative and out-of-range ids."""
    out = []
    for per_slot in (False, True):
        for t in (0, 1, 5, 11, 23):
            x = rng.standard_normal((t, SLOTS if per_slot else 1, k)).astype(np.float32)
            ids = rng.integers(0, E, (t, SLOTS)).astype(np.int64)
            if t == 11:
                ids[:] = 2
            if t == 23:  # experts of more rows than the GEMV's 8 beside experts of fewer
                ids[: t // 2] = rng.integers(0, 2, (t // 2, SLOTS))
            if t == 5:
                ids[1] = (-1, E + 7, -E - 3)
                ids[3] = (1, 1, 1)
            out.append((x, ids))
            out.append((x, ids.astype(np.int32)))
    return out


@pytest.mark.parametrize("fmt", ["q4_0", "q4_k", "q4_kx16", "q8_0x16", "bf16x16", "f16"])
def test_qexperts_gives_qlinears_bits_on_the_gathered_rows(fmt: str) -> None:
    k = 256
    n = 48 if fmt.endswith("x16") else 23  # tiles of 16 rows: three, two (the last part of one)
    w, _ = experts(fmt, n, k)
    rng = np.random.default_rng(1)
    for x, ids in cases(rng, k):
        got = qexperts(x, w, ids, fmt, E)
        assert got.shape == (x.shape[0], SLOTS, n)
        np.testing.assert_array_equal(got, gathered(x, w, ids, fmt), err_msg=f"{fmt} x {x.shape} ids {ids.dtype}")


def test_the_portable_build_gives_the_same_bits() -> None:
    """The plain-C library (a CPU without AVX-512: every expert alone, twq_i8_run's portable
    loops) gives the integer path's bits, as its linears do."""
    k, n = 256, 16
    for fmt in ("q4_0", "q4_kx16"):
        w, _ = experts(fmt, n, k)
        for x, ids in cases(np.random.default_rng(4), k):
            np.testing.assert_array_equal(qexperts(x, w, ids, fmt, E, portable=True), qexperts(x, w, ids, fmt, E))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_k", "bf16x16"])
def test_qexperts_matches_numpy_on_the_dequantized_experts(fmt: str) -> None:
    k, n = 256, 16
    w, wf = experts(fmt, n, k)
    rng = np.random.default_rng(2)
    for x, ids in cases(rng, k):
        got = qexperts(x, w, ids, fmt, E).astype(np.float64)
        xs = np.broadcast_to(x, (x.shape[0], SLOTS, k)).astype(np.float64)
        we = wf[chosen(ids)].astype(np.float64)  # [t, slots, n, k]
        want = np.einsum("tsk,tsnk->tsn", xs, we)
        scale = np.einsum("tsk,tsnk->tsn", np.abs(xs), np.abs(we))
        if fmt in Q.INT8_FORMATS:  # x quantized to 8-bit blocks: the linears' bound
            bound = np.stack([Q.activation_bound(xs[:, j], wf[e]) for j in range(SLOTS) for e in range(E)], 1).reshape(x.shape[0], SLOTS, E, n)
            bound = np.take_along_axis(bound, chosen(ids)[:, :, None, None], 2)[:, :, 0]
        else:  # bf16x16 with AVX-512 BF16 rounds x to bf16
            bound = 2.0**-8 * scale if Q.library_for(fmt).bf16dot else 0 * scale
        assert (np.abs(got - want) <= bound * (1 + 1e-5) + 2e-6 * scale).all()


def test_bad_arguments_are_refused_naming_them() -> None:
    k, n = 64, 16
    w, _ = experts("q8_0", n, k)
    x = np.zeros((2, 1, k), np.float32)
    ids = np.zeros((2, SLOTS), np.int64)
    for args, message in [
        ((x.astype(np.float64), w, ids, "q8_0", E), "x must be float32"),
        ((x[0], w, ids, "q8_0", E), "x must be float32 .tokens"),
        ((x, w, ids.astype(np.float32), "q8_0", E), "ids must be int32 or int64"),
        ((x, w, ids[:1], "q8_0", E), "ids must be .* with x's 2 tokens"),
        ((np.zeros((2, 2, k), np.float32), w, ids, "q8_0", E), "x's dim 1 must be 1 or the 3 slots"),
        ((x, w[:, :-1], ids, "q8_0", E), "the weights w must have rows of q8_0 blocks"),
        ((x, w.view(np.int8), ids, "q8_0", E), "the weights w must be uint8"),
        ((x, w[:-1], ids, "q8_0", E), "the weights w's 63 rows are not 4 experts"),
        ((x, w, ids, "q8_0x16", 8), r"not 8 experts of equal size \(a multiple of 16"),
        ((x, w, ids, "q8_0", 0), "experts must be a positive int"),
        ((x, w, ids, "f32", E), "unknown format 'f32'"),
    ]:
        with pytest.raises(RuntimeCheckError, match=message):
            qexperts(*args)
    with pytest.raises(RuntimeCheckError, match="out must be a writable"):
        qexperts(x, w, ids, "q8_0", E, out=np.zeros((2, SLOTS, n + 1), np.float32))


def test_the_extern_check_names_the_argument() -> None:
    k, n = 64, 16
    w, _ = experts("q8_0", n, k)
    check = lookup_extern_check(Q.experts_symbol("q8_0"))
    assert check is not None
    x, ids, out = np.zeros((2, 1, k), np.float32), np.zeros((2, SLOTS), np.int32), np.zeros((2, SLOTS, n), np.float32)
    dims = (2, 1, SLOTS, E, n, k)
    check("quant.experts.q8_0", x, w, ids, dims, out)
    for args, message in [
        ((x, w, ids, dims[:5], out), "dims must be six"),
        ((x, w, ids, (2, 2, SLOTS, E, n, k), out), "do not fit"),
        ((x[:1], w, ids, dims, out), "x must be a C-contiguous float32 array of 128"),
        ((x, w, ids.astype(np.int16), dims, out), "ids must be a C-contiguous int32 or int64"),
        ((x, w[1:], ids, dims, out), "the weights must be"),
        ((x, w, ids, dims, out[:, :, :-1]), "out must be"),
    ]:
        with pytest.raises(RuntimeCheckError, match=message):
            check("quant.experts.q8_0", *args)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_kx16"])
def test_offloaded_through_build_and_run_natively(fmt: str, tmp_path: Path) -> None:
    """Built with the quant backend: the extern's results are ``qexperts``' (and within the
    activation bound of the reference build's, where a loop-level kernel exists); the native
    graph code and a loaded executable (the extern's check passes) give the VM's bits."""
    from tilework.export.native import NativeModel

    k, n = 256, 16
    w, wf = experts(fmt, n, k)
    rng = np.random.default_rng(3)
    for per_slot in (False, True):
        mod = module(fmt, n, per_slot, k, E, SLOTS)
        assert offloaded(mod, ["quant", "codegen"]) == {Q.experts_symbol(fmt): 1}
        exe = tw.build(mod, backends=["quant", "codegen"])
        exe.save(tmp_path / "m.tw")
        loaded = tw.VM(tw.load(tmp_path / "m.tw"))  # untrusted: the extern's check runs before each call
        vm, native = tw.VM(exe), NativeModel(exe).bind("main")
        reference = tw.VM(tw.build(mod, backends=["codegen"])) if fmt == "q4_0" else None
        for t in (0, 1, 7):
            x = rng.standard_normal((t, SLOTS if per_slot else 1, k)).astype(np.float32)
            ids = rng.integers(-E, E + 2, (t, SLOTS)).astype(np.int64)
            got = vm["main"](x, w, ids)
            np.testing.assert_array_equal(got, qexperts(x, w, ids, fmt, E))
            np.testing.assert_array_equal(native(x, w, ids), got)
            np.testing.assert_array_equal(loaded["main"](x, w, ids), got)
            if reference is not None:
                want = reference["main"](x, w, ids)
                xs = np.broadcast_to(x, (t, SLOTS, k))
                bound = np.zeros((t, SLOTS, n))
                for (i, j), e in np.ndenumerate(chosen(ids)):
                    bound[i, j] = Q.activation_bound(xs[i, j][None], wf[e])[0]
                assert (np.abs(got - want) <= bound + 1e-4).all()


def test_the_exported_c_calls_the_library_cleanly(tmp_path: Path) -> None:
    """The AOT export of the call (``tw_qexperts_<fmt>``'s prototype, the ids' item size from
    their dtype) compiles with the export's flags and -Wall -Wextra -Werror, and ships the
    library (its run: ``test_offloaded_through_build_and_run_natively``, the same C text)."""
    from tilework.export import export_c

    k, n = 64, 16
    w, _ = experts("q8_0", n, k)
    out = tmp_path
    export_c(tw.build(module("q8_0", n, False, k, E, SLOTS), backends=["quant", "codegen"]), out)
    assert "tw_qexperts_q8_0(" in (out / "model.c").read_text() and (out / "quant_kernels.c").exists()
    flags = re.search(r"^TW_CFLAGS \?= (.*)$", (out / "Makefile").read_text(), re.M)
    assert flags is not None
    proc = subprocess.run(["cc", *flags.group(1).split(), "-Wall", "-Wextra", "-Werror", "-fsyntax-only", str(out / "model.c")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
