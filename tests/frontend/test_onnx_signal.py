"""ONNX signal ops (DFT, STFT, windows, MelWeightMatrix), Det and a float Range with run-time
bounds: each model compiled once with symbolic sizes and run at sizes 0/1, odd and even,
against NumPy (``np.fft``, ``np.linalg.det``) or the onnx reference evaluator. Det's unrolled
factorization runs at matrix sizes 1 and 3 (no pivot step; pivoting, a zero pivot, a singular
matrix) by default, and also at 2 and 5 in the long tier (TILEWORK_LONG_TESTS=1)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tests.frontend.onnx_util import compile_onnx, model, outputs, tensor
from tests.long import LONG

F = TensorProto.FLOAT


def _out(name: str, rank: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, F, [None] * rank)


def _complex(x: np.ndarray) -> np.ndarray:
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0].astype(np.complex128)


def _pairs(z: np.ndarray) -> np.ndarray:
    return np.stack([z.real, z.imag], axis=-1).astype(np.float32)


def test_dft_symbolic_length() -> None:
    """DFT-20 along a symbolic axis (axis -2), default dft_length: forward, one-sided forward of a
    real signal, inverse, and inverse of a one-sided spectrum (real output), in one model."""
    variants = [(0, 0, "x2"), (0, 1, "x1"), (1, 0, "x2"), (1, 1, "x2")]
    nodes = [helper.make_node("DFT", [x, "", "axis"], [f"y{k}"], inverse=inv, onesided=one) for k, (inv, one, x) in enumerate(variants)]
    ins = [tensor("x2", F, [3, "n", 2]), tensor("x1", F, [3, "n", 1])]
    m = model(nodes, ins, [_out(f"y{k}", 3) for k in range(4)], [("axis", np.asarray(-2, np.int64))], opset=20)
    fn = compile_onnx(m)
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 8):
        x2, x1 = rng.standard_normal((3, n, 2)).astype(np.float32), rng.standard_normal((3, n, 1)).astype(np.float32)
        got = outputs(fn(x2, x1))
        z2, z1 = _complex(x2.astype(np.float64)), _complex(x1.astype(np.float64))
        wants = [_pairs(np.fft.fft(z2, axis=1)), _pairs(np.fft.fft(z1, axis=1)[:, : n // 2 + 1]), _pairs(np.fft.ifft(z2, axis=1)), np.fft.irfft(z2, n=2 * (n - 1), axis=1)[..., None]]
        for k, (g, w) in enumerate(zip(got, wants)):
            np.testing.assert_allclose(g, w.astype(np.float32), rtol=1e-4, atol=1e-4, err_msg=f"variant {variants[k]}, n={n}")


def test_dft_length_pads_and_truncates() -> None:
    """DFT-17 (axis attribute) with a constant dft_length against inputs shorter and longer."""
    node = helper.make_node("DFT", ["x", "len"], ["y"], axis=1)
    m = model([node], [tensor("x", F, [2, "n", 2])], [_out("y", 3)], [("len", np.asarray(6, np.int64))], opset=19)
    fn = compile_onnx(m)
    rng = np.random.default_rng(1)
    for n in (1, 4, 6, 9):
        x = rng.standard_normal((2, n, 2)).astype(np.float32)
        (got,) = outputs(fn(x))
        np.testing.assert_allclose(got, _pairs(np.fft.fft(_complex(x.astype(np.float64)), n=6, axis=1)), rtol=1e-4, atol=1e-4, err_msg=f"n={n}")


def test_stft_symbolic_signal_length() -> None:
    node = helper.make_node("STFT", ["x", "step", "window"], ["y"], onesided=1)
    window = np.hanning(7).astype(np.float32)
    m = model([node], [tensor("x", F, [2, "s", 1])], [_out("y", 4)], [("step", np.asarray(3, np.int64)), ("window", window)])
    fn = compile_onnx(m)
    rng = np.random.default_rng(2)
    for s in (7, 8, 16, 23):
        x = rng.standard_normal((2, s, 1)).astype(np.float32)
        (got,) = outputs(fn(x))
        frames = np.stack([x[:, f * 3 : f * 3 + 7, 0] * window for f in range((s - 7) // 3 + 1)], axis=1)
        np.testing.assert_allclose(got, _pairs(np.fft.rfft(frames.astype(np.float64), axis=-1)), rtol=1e-4, atol=1e-4, err_msg=f"s={s}")


def test_windows_of_run_time_size() -> None:
    """The size is a run-time input: it becomes a sym var, and one compilation serves every size."""
    kinds = [(op, periodic) for op in ("HannWindow", "HammingWindow", "BlackmanWindow") for periodic in (0, 1)]
    nodes = [helper.make_node(op, ["size"], [f"w{k}"], periodic=periodic) for k, (op, periodic) in enumerate(kinds)]
    m = model(nodes, [tensor("size", TensorProto.INT64, [])], [_out(f"w{k}", 1) for k in range(len(kinds))])
    fn = compile_onnx(m)
    ref = ReferenceEvaluator(m)
    for size in (0, 1, 2, 5, 8):
        got = outputs(fn(np.asarray(size, np.int64)))
        with np.errstate(all="ignore"):  # a symmetric window of size 1 divides by 0 (NaN, as here)
            wants = ref.run(None, {"size": np.asarray(size, np.int64)})
        for k, (g, w) in enumerate(zip(got, wants)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{kinds[k]}, size={size}")


def test_mel_weight_matrix_with_run_time_rate_and_edges() -> None:
    node = helper.make_node("MelWeightMatrix", ["mels", "len", "rate", "lo", "hi"], ["w"])
    ins = [tensor("rate", TensorProto.INT64, []), tensor("lo", F, []), tensor("hi", F, [])]
    m = model([node], ins, [_out("w", 2)], [("mels", np.asarray(5, np.int64)), ("len", np.asarray(17, np.int64))])
    fn = compile_onnx(m)
    ref = ReferenceEvaluator(m)
    for rate, lo, hi in ((8000, 0.0, 4000.0), (16000, 100.0, 3000.0), (22050, 300.0, 8000.0)):
        args = (np.asarray(rate, np.int64), np.asarray(lo, np.float32), np.asarray(hi, np.float32))
        (got,) = outputs(fn(*args))
        (want,) = ref.run(None, dict(zip(["rate", "lo", "hi"], args)))
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-6, err_msg=f"rate={rate} lo={lo} hi={hi}")


def test_det_symbolic_batch() -> None:
    sizes = (1, 2, 3, 5) if LONG else (1, 3)  # the unrolled factorization grows with the size
    nodes = [helper.make_node("Det", [f"x{n}"], [f"d{n}"]) for n in sizes]
    m = model(nodes, [tensor(f"x{n}", F, ["b", "c", n, n]) for n in sizes], [_out(f"d{n}", 2) for n in sizes], opset=22)
    fn = compile_onnx(m)
    rng = np.random.default_rng(3)
    for b, c in ((1, 1), (3, 2), (2, 5)):
        xs = [rng.standard_normal((b, c, n, n)).astype(np.float32) for n in sizes]
        for x in xs[1:]:
            x[0, 0, 0, 0] = 0.0  # a zero where a factorization without pivoting would divide by it
            x[-1, -1] = np.tile(x[-1, -1, :1], (x.shape[-1], 1))  # a singular matrix (equal rows)
        for n, x, got in zip(sizes, xs, outputs(fn(*xs))):
            want = np.linalg.det(x.astype(np.float64)).astype(np.float32)
            assert got.shape == (b, c)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"n={n} b={b} c={c}")


def test_float_range_from_run_time_limit() -> None:
    """Range(0.5, float(x), 0.75): the length is computed at run time and lifted to a sym var."""
    nodes = [helper.make_node("Cast", ["x"], ["lim"], to=F), helper.make_node("Range", ["start", "lim", "delta"], ["y"])]
    inits = [("start", np.asarray(0.5, np.float32)), ("delta", np.asarray(0.75, np.float32))]
    fn = compile_onnx(model(nodes, [tensor("x", TensorProto.INT32, [])], [_out("y", 1)], inits))
    for x in (-3, 0, 1, 7):
        (got,) = outputs(fn(np.asarray(x, np.int32)))
        np.testing.assert_allclose(got, np.arange(0.5, float(x), 0.75, dtype=np.float32), err_msg=f"x={x}")
