"""How a generated kernel's parallel loop shares its iterations between threads: its chunks
(``tw_chunk``: at most ``TW_CHUNKS_PER_THREAD`` a thread, each of at least
``TW_CHUNK_MIN_WORK`` work where the work is known) in shares, one a thread
(``tw_shares_take``): a thread runs its own share front to back, then takes chunks from the
back of the others'. So each thread runs one contiguous run of iterations where all keep pace
(what a loop hinting its next iteration's data assumes), and a thread that cannot run
(descheduled, or its core held by another thread pool's spinning worker) leaves its share to
the others instead of holding every thread at the loop's end."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from tilework.codegen.c import emit_function, toolchain
from tilework.codegen.c.prelude import PRELUDE
from tilework.codegen.cache import load_shared_object

from .test_handbuilt import FUNCS

PROBE = r"""
#include <omp.h>
#include <time.h>
int64_t probe_chunk(int64_t n, int64_t work) { return tw_chunk(n, work); }
int probe_threads(void) { return omp_get_max_threads(); }
/* the loop as the emitter writes it, on a team of `threads`; thread `sleeper` sleeps in its
   first iteration: which thread ran each iteration goes to who[], in which order to order[] */
void probe_run(int64_t n, int64_t work, int32_t *who, int64_t *order, int threads, int sleeper) {
    int64_t seq = 0;
    tw_shares tw_sh; tw_shares_init(&tw_sh, n, tw_chunk(n, work));
    #pragma omp parallel num_threads(threads)
    {
        int64_t tw_lo, tw_hi;
        int slept = 0;
        while (tw_shares_take(&tw_sh, TW_THREAD_NUM(), &tw_lo, &tw_hi)) {
            for (int64_t i = tw_lo; i < tw_hi; ++i) {
                if (omp_get_thread_num() == sleeper && !slept) {
                    struct timespec ts = {0, 300000000};
                    nanosleep(&ts, 0);
                    slept = 1;
                }
                who[i] = omp_get_thread_num();
                order[i] = __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED);
            }
        }
    }
}
"""


@pytest.fixture(scope="module")
def probe() -> ctypes.CDLL:
    built = toolchain.compile_source(PRELUDE + PROBE)
    lib = load_shared_object(built.path, built.data)
    i64 = ctypes.c_int64
    lib.probe_chunk.argtypes, lib.probe_chunk.restype = [i64, i64], i64
    lib.probe_run.argtypes, lib.probe_run.restype = [i64, i64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int], None
    return lib


def test_the_emitter_shares_a_parallel_loop_in_chunks() -> None:
    text = emit_function(FUNCS["fused"], "tw_x")
    lines = [line.strip() for line in text.splitlines()]
    assert any(ln.startswith("tw_shares tw_sh; tw_shares_init(&tw_sh, ") and ", tw_chunk(" in ln for ln in lines), lines
    region = [ln for ln in lines if ln.startswith("#pragma omp parallel")]
    assert region and all(ln.startswith("#pragma omp parallel if(") for ln in region), region
    assert "while (tw_shares_take(&tw_sh, TW_THREAD_NUM(), &tw_lo, &tw_hi)) {" in lines
    assert "for (int64_t f = tw_lo; f < tw_hi; ++f) {" in lines


@pytest.mark.parametrize("n,work", [(0, 0), (1, 0), (7, 0), (1000, 0), (1000, 1000), (1000, 10**9), (3, 3 * 10**6), (10**6, 10**6)])
def test_chunks_hold_enough_work_and_are_few_enough(probe: ctypes.CDLL, n: int, work: int) -> None:
    threads = probe.probe_threads()
    got = probe.probe_chunk(n, work)
    most = 4 * threads  # TW_CHUNKS_PER_THREAD
    want = max(1, -(-n // most), -(-32768 * n // work) if work else 1)  # TW_CHUNK_MIN_WORK
    assert got == want
    assert got >= 1 and math.ceil(n / got) <= max(1, most)  # never more chunks than that
    if work and n:
        assert got * work >= 32768 * n or got >= n  # each chunk holds the minimum work, or is the whole loop


def _run(probe: ctypes.CDLL, n: int, work: int, threads: int, sleeper: int) -> tuple[np.ndarray, np.ndarray]:
    who = np.full(n, -1, np.int32)
    order = np.full(n, -1, np.int64)
    probe.probe_run(n, work, who.ctypes.data, order.ctypes.data, threads, sleeper)
    assert sorted(order.tolist()) == list(range(n))  # every iteration once
    return who, order


def test_a_thread_that_cannot_run_leaves_its_share_to_the_others(probe: ctypes.CDLL) -> None:
    """Thread 1 sleeps at its first iteration: thread 0 runs its own share front to back, then
    every chunk of thread 1's but the one thread 1 holds (a static schedule would have left
    half the loop to thread 1)."""
    n = 64
    chunk = probe.probe_chunk(n, 10**9)  # work enough for chunks of one iteration: n / 8 per chunk with 2 threads
    who, order = _run(probe, n, 10**9, 2, 1)
    assert (who == 1).sum() <= chunk < n // 2
    if probe.probe_threads() == 2:
        own = order[: n // 2]  # thread 0's share: its iterations first, in the loop's order
        assert (who[: n // 2] == 0).all() and (np.diff(own) > 0).all() and own.max() == n // 2 - 1


def test_a_team_of_one_runs_the_loop_in_its_order(probe: ctypes.CDLL) -> None:
    """A loop whose work is under the fork threshold runs on one thread: every share front to
    back, the iterations in the loop's order."""
    who, order = _run(probe, 50, 10**9, 1, -1)
    assert (who == 0).all() and order.tolist() == list(range(50))
