"""``Kernel.vm_call``: the generated function the VM calls a C kernel through,
``f(*arrays, sym_values)``, gives the results of the checked ``Kernel.run`` at sizes 1, 7 and
33, takes the slow path for arrays that are not plain ndarrays, refuses wrong counts with a
TypeError, and turns a kernel's return code into its error."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tilework import te
from tilework.codegen import CKernelModule, build_library
from tilework.errors import IntegerDivisionByZero

n, m = tw.dim("n"), tw.dim("m")


@pytest.fixture(scope="module")
def library() -> CKernelModule:
    A = te.placeholder((n, m), "float32", "A")
    B = te.placeholder((m,), "float32", "B")
    C = te.compute((n, m), lambda i, j: A[i, j] * B[j] + 1.0, "C")
    X = te.placeholder((n,), "int64", "X")
    Y = te.placeholder((n,), "int64", "Y")
    Q = te.compute((n,), lambda i: te.truncdiv(X[i], te.check_nonzero(Y[i])), "Q")
    return build_library({"scale": te.create_func([A, B, C]), "div": te.create_func([X, Y, Q])})


class _Sub(np.ndarray):
    pass


@pytest.mark.parametrize("rows", [1, 7, 33])
def test_vm_call_gives_the_checked_runs_results(library: CKernelModule, rows: int) -> None:
    kernel = library["scale"]
    rng = np.random.default_rng(rows)
    a = rng.standard_normal((rows, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    want = np.empty((rows, 5), np.float32)
    kernel.run([a, b, want])
    np.testing.assert_allclose(want, a * b + 1, rtol=1e-5, atol=1e-6)
    call = kernel.vm_call()
    syms = [int(rows), 5] if kernel.info.syms == ("n", "m") else [5, int(rows)]
    got = np.zeros_like(want)
    call(a, b, got, syms)
    np.testing.assert_array_equal(got, want)
    sub = np.zeros_like(want).view(_Sub)  # not a plain ndarray: through the data pointers
    call(a, b, sub, tuple(np.int64(s) for s in syms))
    np.testing.assert_array_equal(np.asarray(sub), want)


def test_vm_call_refuses_wrong_counts(library: CKernelModule) -> None:
    call = library["scale"].vm_call()
    a, b, c = np.zeros((2, 3), np.float32), np.zeros(3, np.float32), np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError):
        call(a, b, [2, 3])
    with pytest.raises(TypeError, match="expects 2 sym values, got 1"):
        call(a, b, c, [2])


def test_vm_call_raises_the_kernels_error(library: CKernelModule) -> None:
    kernel = library["div"]
    call = kernel.vm_call()
    x, y, q = np.array([7, -7, 3]), np.array([2, 2, 1]), np.zeros(3, np.int64)
    call(x, y, q, [3])
    assert q.tolist() == [3, -3, 3]
    with pytest.raises(IntegerDivisionByZero):
        call(x, np.array([1, 0, 1]), q, [3])
