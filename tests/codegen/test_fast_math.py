"""The prelude's float32 math that generated kernels call for ``exp``, ``sigmoid``, ``tanh`` and
``erf`` (``tw_exp_f``, ``tw_tanh_f``, ``tw_erf_f``: inlined and vectorized by the C compiler):
exp within 1 ulp of the correctly rounded result, tanh and erf within 2, over the whole float
range, in scalar and in vector code, with the special values right (inf, -inf, NaN, signed
zeros, overflow, underflow into subnormals and to zero)."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pytest

import tilework as tw
from tilework import te
from tilework.codegen import CKernelModule, build_library
from tilework.ir.loop import Scalar
from tilework.schedule import default_schedule

n = tw.dim("n")
TINY = float(np.finfo(np.float32).tiny)  # smallest normal
SUBNORMAL_ULP = 2.0**-149
FUNCS: dict[str, tuple[Callable[[Scalar], Scalar], Callable[[np.ndarray], np.ndarray], float]] = {
    "exp": (te.exp, np.exp, 1.0),
    "tanh": (te.tanh, np.tanh, 2.0),
    "erf": (te.erf, np.vectorize(math.erf, otypes=[np.float64]), 2.0),
}


@pytest.fixture(scope="module")
def library() -> CKernelModule:
    x = te.placeholder((n,), "float32", "x")
    funcs = {}
    for name, (fn, _, _) in FUNCS.items():
        f = te.create_func([x, te.compute((n,), lambda i, fn=fn: fn(x[i]), "y")])
        funcs[name] = f  # serial: scalar code
        funcs[f"{name}_vec"] = default_schedule(f, strict=True)  # vector code
    sig = te.create_func([x, te.compute((n,), lambda i: te.sigmoid(x[i]), "y")])
    funcs["sigmoid"] = default_schedule(sig, strict=True)
    funcs["sigmoid_serial"] = sig
    return build_library(funcs)


def _ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the last place of ``want`` rounded to float32."""
    rounded = want.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        ulp = np.spacing(np.abs(rounded)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / np.maximum(ulp, SUBNORMAL_ULP)


def _run(library: CKernelModule, name: str, x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    library[name].run([x, y])
    return y


def _inputs(lo: float, hi: float, rng: np.random.Generator, size: int = 200_000) -> np.ndarray:
    """Uniform over [lo, hi], normal around 0, and every 9797th float32 bit pattern in it."""
    uniform = rng.uniform(lo, hi, size).astype(np.float32)
    small = (rng.standard_normal(size) * 2.0).astype(np.float32)
    neg = np.arange(0x80000001, np.float32(lo).view(np.uint32), 9797, dtype=np.uint32).view(np.float32)
    pos = np.arange(0, np.float32(hi).view(np.uint32), 9797, dtype=np.uint32).view(np.float32)
    return np.concatenate([uniform, small, neg, pos])


RANGES = {"exp": (-103.9, 88.72), "tanh": (-20.0, 20.0), "erf": (-6.0, 6.0)}


@pytest.mark.parametrize("vector", [False, True])
@pytest.mark.parametrize("name", list(FUNCS))
def test_accuracy_over_the_range(library: CKernelModule, name: str, vector: bool) -> None:
    _, ref, bound = FUNCS[name]
    x = _inputs(*RANGES[name], np.random.default_rng(0))
    got = _run(library, f"{name}_vec" if vector else name, x)
    err = _ulp_error(got, ref(x.astype(np.float64)))
    worst = int(np.argmax(err))
    assert err[worst] <= bound, f"{name}: {err[worst]:.3f} ulp at x = {x[worst]!r}"


@pytest.mark.parametrize("vector", [False, True])
@pytest.mark.parametrize("name", list(FUNCS))
def test_special_values(library: CKernelModule, name: str, vector: bool) -> None:
    _, ref, bound = FUNCS[name]
    big = 3.0e38
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, 88.73, 89.0, 100.0, big, -big, -87.33, -87.34,
                  -100.0, -103.97, -103.98, -104.0, -150.0, 1e-30, -1e-30, 1e-40, -1e-40, 0.625, 0.9, 3.9, 4.0, 9.1], np.float32)
    got = _run(library, f"{name}_vec" if vector else name, x)
    with np.errstate(over="ignore"):
        want = ref(x.astype(np.float64))
    assert np.array_equal(np.isnan(got), np.isnan(x))
    keep = ~np.isnan(x)
    with np.errstate(over="ignore"):
        rounded = want[keep].astype(np.float32)
    assert np.array_equal(np.isinf(got[keep]), np.isinf(rounded))
    assert np.array_equal(np.signbit(got[keep]), np.signbit(rounded))  # -0.0 stays -0.0
    finite = np.isfinite(rounded)
    assert _ulp_error(got[keep][finite], want[keep][finite]).max() <= bound


def test_exp_subnormal_results_round_once(library: CKernelModule) -> None:
    x = np.linspace(-103.9, -87.4, 50_001, dtype=np.float32)
    got = _run(library, "exp_vec", x)
    assert np.all(got < TINY) and np.all(got > 0)
    assert _ulp_error(got, np.exp(x.astype(np.float64))).max() <= 1.0


@pytest.mark.parametrize("vector", [False, True])
def test_sigmoid_uses_exp_and_saturates(library: CKernelModule, vector: bool) -> None:
    x = np.concatenate([np.linspace(-120, 120, 10_001, dtype=np.float32), np.array([np.inf, -np.inf, np.nan], np.float32)])
    got = _run(library, "sigmoid" if vector else "sigmoid_serial", x)
    with np.errstate(over="ignore"):
        want = (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)
    # 1 / (1 + exp(-x)) overflows to 0 where the exact value is below the normal range
    np.testing.assert_allclose(got[:-1], want[:-1], rtol=3e-7, atol=TINY)
    assert np.isnan(got[-1])
    assert got[-3] == 1.0 and got[-2] == 0.0 and got[5_000] == 0.5


@pytest.mark.parametrize("vector", [False, True])
def test_sigmoid_accuracy_over_the_range(library: CKernelModule, vector: bool) -> None:
    """``tw_sigmoid_f`` (one scale factor where ``tw_exp_f`` has two) within 3 ulp wherever
    the result is a normal float, and within float's smallest normal below that."""
    x = np.concatenate([_inputs(-88.0, 88.72, np.random.default_rng(1)), np.linspace(-89.5, -86.5, 30_001, dtype=np.float32)])
    got = _run(library, "sigmoid" if vector else "sigmoid_serial", x)
    want = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    normal = want >= TINY
    assert _ulp_error(got[normal], want[normal]).max() <= 3.0
    assert np.all(np.abs(got[~normal] - want[~normal]) <= TINY) and np.all(got >= 0) and np.all(got <= 1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("size", [1, 7, 64])
def test_a_float_to_int_to_float_round_trip_gives_plus_zero(dtype: str, size: int) -> None:
    """``float(int64(x))`` for ``x`` in (-1, 0) is ``+0.0`` (C, NumPy, torch's ``x.long().float()``);
    under ``-fno-trapping-math`` GCC made it ``trunc(x)``, ``-0.0`` (``1 / y`` was ``-inf``)."""
    x = te.placeholder((n,), dtype, "x")
    y = te.compute((n,), lambda i: te.cast(te.cast(x[i], "int64"), dtype), "y")
    f = te.create_func([x, y])
    lib = build_library({"serial": f, "vec": default_schedule(f, strict=True)})
    xs = np.linspace(-3.5, 3.5, size).astype(dtype) if size > 1 else np.array([-0.2], dtype)
    xs[0] = -0.2
    want = xs.astype(np.int64).astype(dtype)
    for name in ("serial", "vec"):
        out = np.empty_like(xs)
        lib[name].run([xs, out])
        np.testing.assert_array_equal(out, want)
        assert not np.signbit(out[0]), name
