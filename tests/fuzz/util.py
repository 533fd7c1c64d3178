"""What the fuzz tests share: the hypothesis settings (a few seconds each in CI, long runs behind
``TILEWORK_LONG_TESTS=1``), the property every input must meet, and a memory cap.

The property: a hostile input gives a result or a ``TileworkError``; anything else (a Python
exception from deep inside, a ``RecursionError``, a ``MemoryError`` under the cap) fails the
test. A crash of the process fails it too, and a hang runs into the per-example deadline, set
far above what an example takes so that it catches hangs, not a slow machine.
"""

from __future__ import annotations

import contextlib
import os
import resource
from typing import Any, Callable, Iterator

from hypothesis import HealthCheck, settings

from tilework.errors import TileworkError
from tests.long import LONG

MEMORY_CAP = 2 << 30  # bytes an example may add to the process's address space


def fuzz_settings(examples: int, long_examples: int = 5000) -> settings:
    """``examples`` fixed examples in CI (derandomized: the same inputs every run), or
    ``long_examples`` fresh random ones in the long run."""
    return settings(
        max_examples=long_examples if LONG else examples,
        derandomize=not LONG,
        deadline=30_000,  # ms: a hang, never an ordinary slow example
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
    )


@contextlib.contextmanager
def memory_cap(extra: int = MEMORY_CAP) -> Iterator[None]:
    """Limit the address space to what the process has now plus ``extra``: an input that makes
    tilework allocate without bound fails with MemoryError instead of taking the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if not os.path.exists("/proc/self/statm"):  # not Linux: no cap
        yield
        return
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * resource.getpagesize()
    cap = used + extra
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def result_or_tilework_error(fn: Callable[[], Any]) -> Any:
    """``fn()``'s result, or None when it raised a TileworkError; any other exception fails."""
    try:
        with memory_cap():
            return fn()
    except TileworkError:
        return None
