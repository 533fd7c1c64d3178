"""How a generated kernel's parallel loop shares its iterations between threads: in chunks
taken as threads come free (``schedule(dynamic, tw_chunk(n, work))``), so that a thread that
cannot run (descheduled, or its core held by another thread pool's spinning worker) leaves its
share to the others instead of holding every thread at the loop's end. ``tw_chunk`` (the
prelude) makes at most ``TW_CHUNKS_PER_THREAD`` chunks a thread, each of at least
``TW_CHUNK_MIN_WORK`` work where the work is known."""

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
/* the loop as the emitter writes it; thread 1 sleeps in its first iteration: which thread ran
   each iteration goes to who[] */
void probe_run(int64_t n, int64_t work, int32_t *who) {
    #pragma omp parallel for schedule(dynamic, tw_chunk(n, work)) num_threads(2)
    for (int64_t i = 0; i < n; ++i) {
        static __thread int slept;
        if (omp_get_thread_num() == 1 && !slept) {
            struct timespec ts = {0, 300000000};
            nanosleep(&ts, 0);
            slept = 1;
        }
        who[i] = omp_get_thread_num();
    }
}
"""


@pytest.fixture(scope="module")
def probe() -> ctypes.CDLL:
    built = toolchain.compile_source(PRELUDE + PROBE)
    lib = load_shared_object(built.path, built.data)
    i64 = ctypes.c_int64
    lib.probe_chunk.argtypes, lib.probe_chunk.restype = [i64, i64], i64
    lib.probe_run.argtypes, lib.probe_run.restype = [i64, i64, ctypes.c_void_p], None
    return lib


def test_the_emitter_shares_a_parallel_loop_in_chunks() -> None:
    text = emit_function(FUNCS["fused"], "tw_x")
    pragma = [line.strip() for line in text.splitlines() if "omp parallel for" in line]
    assert pragma and all("schedule(dynamic, tw_chunk(" in p for p in pragma), pragma


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


def test_a_thread_that_cannot_run_leaves_its_share_to_the_others(probe: ctypes.CDLL) -> None:
    """Thread 1 sleeps at its first iteration: thread 0 takes every chunk but the one thread
    1 holds (a static schedule would have left half the loop to thread 1)."""
    n = 64
    who = np.full(n, -1, np.int32)
    probe.probe_run(n, 10**9, who.ctypes.data)  # work enough for chunks of one iteration: n / 8 per chunk here
    assert (who >= 0).all()
    chunk = probe.probe_chunk(n, 10**9)
    assert (who == 1).sum() <= chunk < n // 2
