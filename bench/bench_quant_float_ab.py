"""The quant backend's float path (bf16, f16, q4_k, q6_k) against its portable build, in one run.

    python bench/bench_quant_float_ab.py [--formats bf16,f16] [--threads 1,2]

Same-process A/B: the library as this CPU compiles it (AVX-512, or the AVX2 kernels of
``quant_float_avx2.c``) against ``quant.library(portable=True)`` (plain C), on SmolLM2-135M's
shapes 1536x576 and 576x1536 and the tied head 49152x576 (k-quants: K = 512), at M = 1 and 8
(GEMV: weights cold, cycling through copies that fill 96 MiB) and 32 and 128 (GEMM, warm). GB/s
is weight bytes over time, beside the read bandwidth the library's ``read_sum`` measures in the
same run. At 1 thread the clock is the calling thread's CPU time, which holds up on a shared,
loaded machine (wall time there mostly measures waiting for a core); at more threads it is wall
time. Not a docs table.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np

from tilework.backend import quant as Q

COLD_BYTES = 96 << 20


def weights(rng: np.random.Generator, fmt: str, n: int, k: int) -> np.ndarray:
    if fmt in ("bf16", "f16"):  # finite, normal values: exponent bits 0x3000 set, 0x4000 clear
        return rng.integers(0, 1 << 16, (n, k), dtype=np.uint16) & 0xBFFF | 0x3000
    return rng.integers(0, 256, (n, Q.row_bytes(fmt, k)), dtype=np.uint8)  # k-quants: random blocks


def best(lib: Q.QuantLibrary, fmt: str, x: np.ndarray, ws: list[np.ndarray], out: np.ndarray, reps: int, clock: Callable[[], float]) -> float:
    fn, (m, k), n = lib.entries[fmt], x.shape, ws[0].shape[0]
    t_best = float("inf")
    for _ in range(reps):
        t = clock()
        for w in ws:
            fn(x.ctypes.data, w.ctypes.data, out.ctypes.data, m, n, k)
        t_best = min(t_best, (clock() - t) / len(ws))
    return t_best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="bf16,f16")
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    lib, portable = Q.library(), Q.library(portable=True)
    rng = np.random.default_rng(0)
    for th in (int(t) for t in args.threads.split(",")):
        lib.set_threads(th)
        clock = time.thread_time if th == 1 else time.perf_counter
        big = np.ones(1 << 27, np.float32)
        t_read = float("inf")
        for _ in range(3):
            t0 = clock()
            lib.read_sum(big)
            t_read = min(t_read, clock() - t0)
        print(f"threads {th} ({'thread CPU time' if th == 1 else 'wall time'}): read_sum {big.nbytes / t_read / 1e9:.1f} GB/s")
        del big
        for fmt in args.formats.split(","):
            kd = 512 if fmt in ("q4_k", "q6_k") else 576
            for n, k in ((1536, kd), (576, 1536), (49152, kd)):
                ws = [weights(rng, fmt, n, k) for _ in range(max(1, COLD_BYTES // (n * Q.row_bytes(fmt, k))))]
                for m in (1, 8, 32, 128):
                    x = rng.standard_normal((m, k)).astype(np.float32)
                    out = np.empty((m, n), np.float32)
                    use = ws if m <= 8 else ws[:1]
                    tp = best(portable, fmt, x, use[:4], out, 1 if m >= 32 else 2, clock)
                    tn = best(lib, fmt, x, use, out, 5, clock)
                    flop, nbytes = 2 * m * n * k, ws[0].nbytes
                    print(
                        f"  {fmt} N={n:5d} K={k:4d} M={m:3d}: portable {tp * 1e3:8.3f} ms {flop / tp / 1e9:6.1f} GF/s {nbytes / tp / 1e9:5.1f} GB/s"
                        f" | this build {tn * 1e3:8.3f} ms {flop / tn / 1e9:6.1f} GF/s {nbytes / tn / 1e9:5.1f} GB/s | x{tp / tn:6.1f}",
                        flush=True,
                    )
    lib.set_threads(lib.max_threads())


if __name__ == "__main__":
    main()
