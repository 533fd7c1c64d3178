"""The blas backend: every capability numerically at symbolic shapes (n in 1, 3, 8), float32
and float64, and what it refuses. BLAS is NumPy's own, so nothing here is ever skipped; which
entry point runs (ctypes GEMM or the numpy.matmul fallback) is what ``available()`` reports,
and both are checked."""

from __future__ import annotations

import numpy as np
import pytest

from tests.backend.helpers import close, module, offloaded, rand, run
from tilework import op
from tilework.backend import availability
from tilework.backend import blas as B
from tilework.ir.sym import SymVar

NS = (1, 3, 8)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_linear_with_and_without_bias(rng: np.random.Generator, dtype: str) -> None:
    n = SymVar("n", 1)
    plain = module([("x", (2, n, 32), dtype), ("w", (16, 32), dtype)], lambda x, w: op.linear(x, w))
    biased = module([("x", (n, 32), dtype), ("w", (16, 32), dtype), ("b", (16,), dtype)], lambda x, w, b: op.linear(x, w, b))
    short = "f32" if dtype == "float32" else "f64"
    assert offloaded(plain, ["blas"]) == {f"blas.{short}.linear": 1}
    assert offloaded(biased, ["blas"]) == {f"blas.{short}.linear_bias": 1}
    w, b = rand(rng, (16, 32), dtype), rand(rng, (16,), dtype)
    for rows in NS:
        x3, x2 = rand(rng, (2, rows, 32), dtype), rand(rng, (rows, 32), dtype)
        close(run(plain, ["blas"], [x3, w]), x3 @ w.T)
        close(run(biased, ["blas", "codegen"], [x2, w, b]), x2 @ w.T + b)


def test_matmul_folds_leading_dims_and_batched_matmul_loops(rng: np.random.Generator) -> None:
    n = SymVar("n", 1)
    folded = module([("a", (n, 3, 8), "float32"), ("b", (8, 5), "float32")], op.matmul)
    batched = module([("a", (n, 4, 8), "float32"), ("b", (n, 8, 5), "float32")], op.matmul)
    assert offloaded(folded, ["blas"]) == {"blas.f32.matmul": 1}
    assert offloaded(batched, ["blas"]) == {"blas.f32.batch_matmul": 1}
    bm = rand(rng, (8, 5))
    for rows in NS:
        a = rand(rng, (rows, 3, 8))
        close(run(folded, ["blas"], [a, bm]), a @ bm)
        a4, b4 = rand(rng, (rows, 4, 8)), rand(rng, (rows, 8, 5))
        close(run(batched, ["blas"], [a4, b4]), a4 @ b4)


def test_matmul_bias_composite_in_either_order(rng: np.random.Generator) -> None:
    n = SymVar("n", 1)
    params = [("x", (n, 8), "float64"), ("w", (8, 6), "float64"), ("b", (6,), "float64")]
    left = module(params, lambda x, w, b: op.add(op.matmul(x, w), b))
    right = module(params, lambda x, w, b: op.add(b, op.matmul(x, w)))
    for mod in (left, right):
        assert offloaded(mod, ["blas"]) == {"blas.f64.matmul_bias": 1}
    w, b = rand(rng, (8, 6), "float64"), rand(rng, (6,), "float64")
    for rows in NS:
        x = rand(rng, (rows, 8), "float64")
        close(run(left, ["blas"], [x, w, b]), x @ w + b, 1e-10)
        close(run(right, ["blas"], [x, w, b]), x @ w + b, 1e-10)


def test_the_composite_needs_the_matmul_to_itself(rng: np.random.Generator) -> None:
    n = SymVar("n", 1)
    mod = module(
        [("x", (n, 8), "float32"), ("w", (8, 6), "float32"), ("b", (6,), "float32")],
        lambda x, w, b: op.multiply(op.add(op.matmul(x, w), b), op.matmul(x, w)),
    )
    # the first matmul feeds only the add: fused; the second feeds the multiply: alone
    assert offloaded(mod, ["blas", "codegen"]) == {"blas.f32.matmul_bias": 1, "blas.f32.matmul": 1}
    x, w, b = rand(rng, (3, 8)), rand(rng, (8, 6)), rand(rng, (6,))
    close(run(mod, ["blas", "codegen"], [x, w, b]), (x @ w + b) * (x @ w))


def test_what_blas_refuses() -> None:
    n = SymVar("n", 1)
    half = module([("x", (n, 8), "float16"), ("w", (4, 8), "float16")], op.linear)
    broadcast_batch = module([("a", (n, 4, 8), "float32"), ("b", (1, 8, 5), "float32")], op.matmul)
    vector = module([("a", (8,), "float32"), ("b", (8, 5), "float32")], op.matmul)
    mixed = module([("a", (n, 8), "float32"), ("b", (8, 5), "float32")], lambda a, b: op.matmul(a, b, out_dtype="float64"))
    for mod in (half, broadcast_batch, vector, mixed):
        assert offloaded(mod, ["blas", "codegen"]) == {}


@pytest.mark.parametrize("m", [1, 5])  # one row goes to GEMV
@pytest.mark.parametrize("kind", ["matmul", "matmul_bias", "linear", "linear_bias", "batch_matmul"])
def test_ctypes_and_numpy_entry_points_agree(rng: np.random.Generator, kind: str, m: int) -> None:
    g = B.gemm_for("float32")
    impls = [B._numpy_externs()[kind]] + ([B._ctypes_externs(g)[kind]] if g is not None else [])
    n, k, nb = 7, 3, 2
    dims: tuple[int, ...]
    if kind == "batch_matmul":
        a, b = rand(rng, (nb, m, k)), rand(rng, (nb, k, n))
        want, args, dims = a @ b, [a, b], (nb, m, n, k)
    elif kind.startswith("linear"):
        a, b = rand(rng, (m, k)), rand(rng, (n, k))
        want, args, dims = a @ b.T, [a, b], (m, n, k)
    else:
        a, b = rand(rng, (m, k)), rand(rng, (k, n))
        want, args, dims = a @ b, [a, b], (m, n, k)
    if kind.endswith("bias"):
        bias = rand(rng, (n,))
        want, args = want + bias, [*args, bias]
    for impl in impls:
        out = np.full(want.shape, np.nan, np.float32)
        impl(*args, dims, out)
        close(out, want)


def test_available_names_the_entry_point() -> None:
    ok, reason = availability("blas")
    assert ok
    g = B.gemm_for("float32")
    assert (g.symbol in reason) if g is not None else ("numpy.matmul" in reason)


def test_each_call_runs_on_the_set_threads_and_restores_the_callers() -> None:
    """A call runs with ``THREADS`` OpenBLAS threads for the calling thread (OpenBLAS's pool
    spins after shared calls, against tilework's OpenMP kernels), then the thread's own
    setting is back: none, or the one it had."""
    g = B.gemm_for("float32")
    if g is None or g.local_threads is None:
        pytest.skip("NumPy's BLAS has no openblas_set_num_threads_local")
    seen: list[int] = []
    fake = B._Blas(lambda *a: seen.append(g.threads_now()), g.gemv, g.symbol, g.path, g.int64, g.local_threads, g.threads_now)
    linear = B._ctypes_externs(fake)["linear"]
    x, w, out = np.ones((3, 4), np.float32), np.ones((5, 4), np.float32), np.zeros((3, 5), np.float32)
    library = g.threads_now()
    linear(x, w, (3, 5, 4), out)
    assert seen == [B.THREADS] and g.threads_now() == library
    if library > 1:  # a count of the thread's own (below the library's: a larger one grows its pool)
        own = library - 1
        g.local_threads(own)
        try:
            linear(x, w, (3, 5, 4), out)
            assert seen == [B.THREADS, B.THREADS] and g.threads_now() == own
        finally:
            g.local_threads(0)
        assert g.threads_now() == library
    ok, reason = availability("blas")
    assert f"{B.THREADS} thread(s) a call" in reason
