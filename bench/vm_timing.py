"""Per-instruction timing of a loaded VM function, for the profiling scripts
(``profile_minilm.py``, ``profile_decode.py``): each call step wrapped to keep its minimum
time. Minima per instruction hold up on a loaded machine where whole-call medians do not."""

from __future__ import annotations

from typing import Any, Callable

from tilework.runtime import vm as V


def instrument(loaded: Any, clock: Callable[[], float]) -> dict[int, float]:
    """Wrap every call step of ``loaded`` so that it keeps its minimum time; returns the minima
    by step index (restore ``loaded.steps`` from a copy to undo)."""
    mins: dict[int, float] = {}

    def wrap(i: int, step: Any) -> Any:
        kind, a, b = step
        if kind != V.CALL:
            return step
        mins[i] = float("inf")

        def timed(r: list[Any]) -> None:
            t = clock()
            a(r)
            d = clock() - t
            if d < mins[i]:
                mins[i] = d

        return (kind, timed, b)

    loaded.steps[:] = [wrap(i, s) for i, s in enumerate(loaded.steps)]
    return mins
