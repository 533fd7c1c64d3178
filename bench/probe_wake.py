"""What the first call after a pause costs: a compiled kernel's call time right after the process
slept, against the same call back to back.

A parallel loop of a generated kernel runs on libgomp's team: the thread that calls it and the
workers, which spin a while after a parallel region (``GOMP_SPINCOUNT``) and then sleep. After a
pause the caller wakes them, and on some machines a woken worker is queued on the caller's own
CPU while the caller spins at the region's end waiting for it (a virtual machine whose idle
CPU the scheduler passes over): the region ends once the caller's spin runs out, or the
scheduler's tick moves one of them. This prints, for each pause, the median of the first and
the second call after it, and the back-to-back median, for the kernel run with every thread and
with one (``--no-one-thread`` leaves that out); ``--torch-first`` imports torch before tilework,
as a script that compiles a torch model does (libgomp then reads its settings when torch loads
it, not when tilework does: ``tilework.codegen.c.module``). A call after a pause holds its team
on distinct CPUs (``tilework.runtime.team``); ``TILEWORK_HOLD_TEAM=0`` shows the calls without.

    OMP_NUM_THREADS=2 [TILEWORK_HOLD_TEAM=0] python bench/probe_wake.py [--pauses 0.001,0.01,0.1,0.3] [--rounds 10] [--torch-first]

Prints one table (no docs table: this is a diagnosis, not a benchmark)."""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from typing import Callable

os.environ.setdefault("OMP_NUM_THREADS", "2")
SPIN = os.environ.get("GOMP_SPINCOUNT", "libgomp's default")  # as libgomp will read it (tilework sets its own where unset)
if "--torch-first" in sys.argv:
    import torch  # noqa: F401

import numpy as np  # noqa: E402

import tilework as tw  # noqa: E402
from tilework.runtime import team  # noqa: E402
from bench_threads import exp_add  # noqa: E402

COLS = 4096


def _ms(v: list[float]) -> str:
    return f"{1e3 * statistics.median(v):.3f}"


def _seconds(text: str) -> list[float]:
    try:
        pauses = [float(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated seconds: {text!r}") from None
    if any(not p >= 0 for p in pauses):
        raise argparse.ArgumentTypeError(f"a pause is negative: {text!r}")
    return pauses


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a positive count: {text!r}")
    return int(text)


def probe(call: Callable[[], object], pauses: list[float], rounds: int) -> list[str]:
    """Medians (ms): back to back, then the first and second call after each pause."""
    for _ in range(20):
        call()
    warm = []
    for _ in range(200):
        t = time.perf_counter()
        call()
        warm.append(time.perf_counter() - t)
    cells = [_ms(warm)]
    for pause in pauses:
        first, second = [], []
        for _ in range(rounds):
            time.sleep(pause)
            t0 = time.perf_counter()
            call()
            t1 = time.perf_counter()
            call()
            t2 = time.perf_counter()
            first.append(t1 - t0)
            second.append(t2 - t1)
        cells += [_ms(first), _ms(second)]
    return cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pauses", default="0.001,0.01,0.1,0.3", type=_seconds, help="seconds, comma-separated")
    ap.add_argument("--rounds", type=_positive, default=10, help="pauses of each length")
    ap.add_argument("--rows", type=_positive, default=64, help="rows of the (rows, 4096) kernel")
    ap.add_argument("--torch-first", action="store_true", help="import torch before tilework")
    ap.add_argument("--no-one-thread", action="store_true", help="skip the one-thread column")
    args = ap.parse_args()
    pauses = args.pauses
    ex = tw.build(exp_add(COLS))
    vm = tw.VM(ex)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, COLS)).astype(np.float32)
    y = rng.standard_normal((args.rows, COLS)).astype(np.float32)
    main_fn = vm["main"]
    spin = SPIN if args.torch_first else os.environ.get("GOMP_SPINCOUNT", SPIN)
    print(f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, GOMP_SPINCOUNT={spin} (read by libgomp when {'torch' if args.torch_first else 'tilework'} loaded it), OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, team held after a pause: {'no' if not team.enabled() else 'yes'}, load {os.getloadavg()[0]:.1f}")
    print(f"kernel exp(x) + y on ({args.rows}, {COLS}) float32; median ms of {args.rounds} pauses each (first / second call after the pause)")
    header = ["threads", "back to back"] + [f"after {p:g} s: 1st / 2nd" for p in pauses]
    rows = [[os.environ["OMP_NUM_THREADS"], *probe(lambda: main_fn(x, y), pauses, args.rounds)]]
    if not args.no_one_thread:
        gomp = ctypes.CDLL("libgomp.so.1")  # the kernels' team: the calling thread's count (omp_get_max_threads)
        threads = gomp.omp_get_max_threads()
        gomp.omp_set_num_threads(1)
        try:
            rows.append(["1", *probe(lambda: main_fn(x, y), pauses, args.rounds)])
        finally:
            gomp.omp_set_num_threads(threads)
    print(" | ".join(header))
    for r in rows:
        print(" | ".join([r[0], r[1]] + [f"{r[i]} / {r[i + 1]}" for i in range(2, len(r), 2)]))


if __name__ == "__main__":
    main()
