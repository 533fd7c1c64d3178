"""GFLOP/s of the default-scheduled matmul kernel (C + OpenMP) against NumPy's BLAS.

    python bench/bench_schedule_matmul.py [--repeat 20] [--symbolic]

Each shape ``(M, N, K)`` is float32 ``a[M, K] @ b[K, N]`` built with ``te`` and scheduled by
``tilework.schedule.default_schedule`` (the matmul rule, or the GEMV rule for M = 1). With
``--symbolic`` M is a sym var (one kernel for every M). Timings are the best of ``--repeat``
runs, NumPy and ours interleaved so that both see the same machine load.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tilework import te
from tilework.codegen import build_library
from tilework.ir.sym import SymVar
from tilework.schedule import default_schedule

SHAPES = [(1, 4096, 4096), (32, 1024, 4096), (256, 1024, 4096), (512, 512, 512)]


def matmul_func(m: object, n: int, k: int) -> object:
    a = te.placeholder((m, k), "float32", "a")
    b = te.placeholder((k, n), "float32", "b")
    r = te.reduce_axis(k, "r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), "c")
    return te.create_func([a, b, c])


def best_time(fn: object, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--symbolic", action="store_true", help="M is a sym var")
    args = ap.parse_args()
    funcs = {}
    for m, n, k in SHAPES:
        mm = SymVar("M", 1) if args.symbolic else m
        funcs[f"mm_{m}_{n}_{k}"] = default_schedule(matmul_func(mm, n, k))  # type: ignore[arg-type]
    lib = build_library(funcs)
    rng = np.random.default_rng(0)
    print(f"{'shape (M, N, K)':>22} {'rule':>8} {'ours GFLOP/s':>13} {'numpy GFLOP/s':>14} {'ratio':>6}")
    for m, n, k in SHAPES:
        name = f"mm_{m}_{n}_{k}"
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        c = np.empty((m, n), np.float32)
        kern = lib[name]
        kern.run([a, b, c])
        np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3)
        ours = numpy_t = float("inf")
        for _ in range(3):  # interleave so both see the same load
            ours = min(ours, best_time(lambda: kern.run([a, b, c]), args.repeat))
            numpy_t = min(numpy_t, best_time(lambda: a @ b, args.repeat))
        flops = 2.0 * m * n * k
        rule = funcs[name].attrs["schedule_rule"]
        print(
            f"{str((m, n, k)):>22} {rule:>8} {flops / ours / 1e9:13.1f} "
            f"{flops / numpy_t / 1e9:14.1f} {numpy_t / ours:6.2f}"
        )


if __name__ == "__main__":
    main()
