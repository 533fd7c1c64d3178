"""Per-instruction timing of a loaded VM function, for the profiling scripts
(``profile_minilm.py``, ``profile_decode.py``): each call step wrapped to keep its minimum
time. Minima per instruction hold up on a loaded machine where whole-call medians do not."""

from __future__ import annotations

from typing import Any, Callable

from tilework.runtime import vm as V


def instrument(loaded: Any, clock: Callable[[], float], shapes: dict[int, list[tuple[int, ...]]] | None = None) -> dict[int, float]:
    """Wrap every call step of ``loaded`` so that it keeps its minimum time; returns the minima
    by step index (restore ``loaded.steps`` from a copy to undo). With ``shapes``, each step's
    register arguments' shapes are put there on its first call (``profile_vision.py``)."""
    mins: dict[int, float] = {}

    def wrap(i: int, step: Any) -> Any:
        kind, a, b = step
        if kind != V.CALL:
            return step
        mins[i] = float("inf")
        regs = [v for tag, v in loaded.fn.code[i][3] if tag == "r"] if shapes is not None else []

        def timed(r: list[Any]) -> None:
            if shapes is not None and i not in shapes:
                shapes[i] = [tuple(getattr(r[v], "shape", ())) for v in regs]
            t = clock()
            a(r)
            d = clock() - t
            if d < mins[i]:
                mins[i] = d

        return (kind, timed, b)

    loaded.steps[:] = [wrap(i, s) for i, s in enumerate(loaded.steps)]
    return mins
