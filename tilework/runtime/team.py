"""The OpenMP team held on distinct CPUs for a call that follows a pause.

A generated kernel's parallel loops run on libgomp's team of the calling thread: the caller and
its workers, which spin a while after each parallel region (``GOMP_SPINCOUNT``) and then sleep.
On a virtual machine whose idle CPUs the host takes away (a shared cloud host), the scheduler
was seen (``sched_getcpu`` in the regions) to wake a sleeping worker onto the caller's own CPU
rather than the idle one, where it waits while the caller spins at the region's end for it:
each region then lasts about the caller's spin, region after region for milliseconds, until the
scheduler's tick moves one of the two. Measured on the 2-CPU Zen 4 VM of ``docs/benchmarks.md``
(``python bench/probe_wake.py``): a 0.06 ms kernel took 1.3-1.6 ms as the first call after a
pause of 20 ms or more and 0.6-0.7 as the second (with libgomp's default spin, where torch
loaded it first, 7.8 and 4.0 ms); held as below, 0.36-0.44 and 0.07-0.11 (torch first 0.42 and
0.09). Twenty short regions in C after a 0.3 s pause took 6-12 ms, held 0.45-0.5.

So a call that starts more than ``IDLE_S`` after the last call ended holds the team: the caller
on the CPU it runs on and each worker on another CPU of the caller's mask, for the call; then
every thread gets its own mask back (``tilework.codegen.c.team``: the C side, installed here
when the first C kernel library loads). Back-to-back calls (an LLM's decode steps, a loop over
a dataset) change nothing: their workers are awake on CPUs of their own. Nothing is held with
fewer CPUs than threads, one thread, or ``TILEWORK_HOLD_TEAM=0``; nor where the user binds the
OpenMP threads themselves (``OMP_PROC_BIND`` other than ``false``, or ``OMP_PLACES`` or
``GOMP_CPU_AFFINITY`` without it: libgomp then binds by default): each thread then stays on its
place, which already keeps a woken worker off the caller's CPU (``probe_wake.py`` with
``OMP_PROC_BIND=close`` and no hold: 0.34 / 0.06 ms after 0.1 s, as held), and a hold would move
the threads off the places the user chose.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

IDLE_S = 0.002  # a pause after which a worker may be asleep (tilework's GOMP_SPINCOUNT spins well under it; holding an awake team costs a few system calls)

_hold: Callable[[], int] | None = None
_release: Callable[[], None] | None = None
_last = 0.0  # time.perf_counter() at the end of the last call
_holding = threading.Lock()  # taken by the call that holds its team, for the call


def enabled() -> bool:
    """False where the user said no (``TILEWORK_HOLD_TEAM=0``) or binds the OpenMP threads
    (``user_binds``): then nothing is built or held."""
    return os.environ.get("TILEWORK_HOLD_TEAM", "1") != "0" and not user_binds()


def user_binds() -> bool:
    """Whether the environment binds OpenMP threads to places, as libgomp reads it:
    ``OMP_PROC_BIND`` set to anything but ``false`` (``true``, ``close``, ``spread``, a list of
    them), or, where it is unset, ``OMP_PLACES`` or ``GOMP_CPU_AFFINITY`` set (libgomp's
    default binding then is ``true``)."""
    bind = os.environ.get("OMP_PROC_BIND", "").strip().lower()
    if bind:
        return bind.split(",")[0].strip() != "false"
    return any(os.environ.get(k, "").strip() for k in ("OMP_PLACES", "GOMP_CPU_AFFINITY"))


def install(hold: Callable[[], int], release: Callable[[], None]) -> None:
    """Take the C side's ``tw_team_hold`` and ``tw_team_release`` (unless the user said no)."""
    global _hold, _release
    if enabled():
        _hold, _release = hold, release


def enter() -> bool:
    """Before a call: hold the team if the last call ended more than ``IDLE_S`` ago and no held
    call is running (another thread's, or the one this call is made from: two callers held on
    one CPU would share it); True if held (then ``leave(True)`` after the call). Calls back to
    back cost a clock read."""
    if _hold is None or time.perf_counter() - _last <= IDLE_S or not _holding.acquire(False):
        return False
    if _hold():
        return True
    _holding.release()
    return False


def leave(held: bool) -> None:
    """After a call (also a failed one): give the threads their masks back if ``enter`` held
    them, and note when the call ended."""
    global _last
    if held:
        if _release is not None:
            _release()
        _holding.release()
    _last = time.perf_counter()
