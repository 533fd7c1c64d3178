"""``pow`` with a constant exponent through torch.export and ONNX, at sizes 0, 1 and odd ones,
against torch eager and onnxruntime: integer exponents -3..5 (multiplications since the
legalization of ``power``; bitwise equal to torch for float32 -2..3), fractional ones (libm
``pow``, or torch's own ``sqrt`` for 0.5), ``x ** 2.0`` and ``torch.square``; float32, float64
and integer tensors; NaN, inf and signed zeros."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework
from tests.frontend.onnx_util import model, ort_run, outputs, compile_onnx, tensor

INT_EXPS = tuple(range(-3, 6))
FLOAT_EXPS = tuple(float(e) for e in INT_EXPS) + (0.5, 1.5, -0.5, -2.5, 9.0)
SIZES = (0, 1, 7, 33)
SPECIAL = [np.nan, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 1e-40, -3e-20, 3e38, -1e15]


def _floats(k: int, dtype: str, rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([np.array(SPECIAL), rng.standard_normal(k) * 3])[:k].astype(dtype)


def _assert_close(got: np.ndarray, want: np.ndarray, ulps: float, where: str) -> None:
    """Equal NaN, inf and zero signs; finite values within ``ulps`` of ``want``."""
    assert got.dtype == want.dtype and got.shape == want.shape, where
    assert np.array_equal(np.isnan(got), np.isnan(want)), where
    sure = ~np.isnan(want)
    assert np.array_equal(np.signbit(got[sure]), np.signbit(want[sure])), where
    assert np.array_equal(np.isinf(got), np.isinf(want)), where
    ok = np.isfinite(want)
    err = np.abs(got[ok].astype(np.float64) - want[ok]) / np.spacing(np.abs(want[ok]).astype(got.dtype))
    assert err.size == 0 or float(err.max()) <= ulps, f"{where}: {float(err.max())} ulp"


def _torch_powers() -> Any:
    import torch

    class Powers(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return tuple(torch.pow(x, e) for e in FLOAT_EXPS) + (x**2.0, torch.square(x), x.pow(3))

    class IntPowers(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return tuple(torch.pow(x, e) for e in range(0, 6)) + (torch.pow(x, 3.0), torch.square(x))

    return torch, Powers, IntPowers


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_float_pow_matches_eager(dtype: str) -> None:
    pytest.importorskip("torch", reason="the torch frontend needs torch (an optional extra)")
    torch, Powers, _ = _torch_powers()
    n = torch.export.Dim("n", min=0, max=64)
    rng = np.random.default_rng(0)
    cm = tilework.compile(Powers(), (torch.from_numpy(_floats(5, dtype, rng)),), ({0: n},))
    for k in SIZES:
        x = _floats(k, dtype, rng)
        want = [w.numpy() for w in Powers()(torch.from_numpy(x))]
        got = [np.asarray(g) for g in cm(x)]
        exps = FLOAT_EXPS + (2.0, 2.0, 3.0)
        for e, g, w in zip(exps, got, want):
            where = f"{dtype} n={k} pow(x, {e})"
            if dtype == "float32" and e in (-2.0, -1.0, 0.0, 1.0, 2.0, 3.0):
                assert np.array_equal(g, w, equal_nan=True) and np.array_equal(np.signbit(g), np.signbit(w)), where
            else:
                _assert_close(g, w, 1.0 if dtype == "float32" else 4.0, where)


def test_torch_int_pow_is_exact() -> None:
    pytest.importorskip("torch", reason="the torch frontend needs torch (an optional extra)")
    torch, _, IntPowers = _torch_powers()
    n = torch.export.Dim("n", min=0, max=64)
    rng = np.random.default_rng(1)
    cm = tilework.compile(IntPowers(), (torch.arange(5),), ({0: n},))
    for k in SIZES:
        x = rng.integers(-40, 41, size=k).astype(np.int64)
        want = [w.numpy() for w in IntPowers()(torch.from_numpy(x))]
        for i, (g, w) in enumerate(zip(cm(x), want)):
            g = np.asarray(g)
            assert g.dtype == w.dtype, (i, g.dtype, w.dtype)  # pow(int, 3.0) is float32
            np.testing.assert_array_equal(g, w, err_msg=f"n={k} output {i}")


def _onnx_pow(exps: tuple[float, ...], elem: int, exp_dtype: str) -> Any:
    from onnx import helper

    nodes = [helper.make_node("Pow", ["x", f"e{i}"], [f"y{i}"]) for i in range(len(exps))]
    inits = [(f"e{i}", np.array(e, exp_dtype)) for i, e in enumerate(exps)]
    return model(nodes, [tensor("x", elem, ["n"])], [tensor(f"y{i}", elem, ["n"]) for i in range(len(exps))], inits)


@pytest.mark.parametrize(("dtype", "exp_dtype"), [("float32", "float32"), ("float32", "int64"), ("float64", "float64")])
def test_onnx_pow_matches_onnxruntime(dtype: str, exp_dtype: str) -> None:
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto

    exps = tuple(float(e) for e in INT_EXPS) if exp_dtype == "int64" else FLOAT_EXPS
    elem = TensorProto.FLOAT if dtype == "float32" else TensorProto.DOUBLE
    m = _onnx_pow(exps, elem, exp_dtype)
    f = compile_onnx(m, dim_bounds={"n": (0, None)})
    rng = np.random.default_rng(2)
    for k in SIZES:
        x = _floats(k, dtype, rng)
        for e, g, w in zip(exps, outputs(f(x)), ort_run(m, x)):
            _assert_close(g, w, 1.0 if dtype == "float32" else 4.0, f"{dtype} ** {exp_dtype} n={k} Pow(x, {e})")


def test_onnx_int_pow_is_exact() -> None:
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto

    exps = tuple(range(0, 6))
    m = _onnx_pow(exps, TensorProto.INT64, "int64")
    f = compile_onnx(m, dim_bounds={"n": (0, None)})
    rng = np.random.default_rng(3)
    for k in SIZES:
        x = rng.integers(-40, 41, size=k).astype(np.int64)
        for e, g, w in zip(exps, outputs(f(x)), ort_run(m, x)):
            np.testing.assert_array_equal(g, w, err_msg=f"n={k} Pow(x, {e})")
            np.testing.assert_array_equal(g, np.power(x, e))


def test_onnx_pow_three_emits_no_powf() -> None:
    from onnx import TensorProto

    from tilework.codegen.c.emit import emit_module
    from tilework.frontend.onnx import from_onnx

    text = emit_module(tilework.build(from_onnx(_onnx_pow((3.0,), TensorProto.FLOAT, "float32"))).kernel_funcs).text
    assert "powf(" not in text
