"""Interval arithmetic on integer bounds ``(lo, hi)`` (None: unbounded on that side).

The rules ``tilework.ir.sym.bounds`` combines: products and sums of intervals, and the images of
``//``, ``%``, ``min`` and ``max``. Pure functions of the bounds; nothing here knows a SymExpr.
"""

from __future__ import annotations

from typing import Callable

from typing import Union

Bound = tuple[Union[int, None], Union[int, None]]  # (lo, hi); None is unbounded on that side

_INF = float("inf")


def _xmul(p: float, q: float) -> float:
    if p == 0 or q == 0:
        return 0
    if isinstance(p, float) or isinstance(q, float):  # an infinite end: only its sign matters
        return _INF if (p > 0) == (q > 0) else -_INF
    return p * q


def imul(x: Bound, y: Bound) -> Bound:
    xs = (-_INF if x[0] is None else x[0], _INF if x[1] is None else x[1])
    ys = (-_INF if y[0] is None else y[0], _INF if y[1] is None else y[1])
    prods = [_xmul(p, q) for p in xs for q in ys]
    lo, hi = min(prods), max(prods)
    return (None if lo == -_INF else int(lo)), (None if hi == _INF else int(hi))


def iadd(x: Bound, y: Bound) -> Bound:
    lo = None if x[0] is None or y[0] is None else x[0] + y[0]
    hi = None if x[1] is None or y[1] is None else x[1] + y[1]
    return lo, hi


def ineg(x: Bound) -> Bound:
    return (None if x[1] is None else -x[1]), (None if x[0] is None else -x[0])


def meet(x: Bound, y: Bound) -> Bound:
    lo = x[0] if y[0] is None else (y[0] if x[0] is None else max(x[0], y[0]))
    hi = x[1] if y[1] is None else (y[1] if x[1] is None else min(x[1], y[1]))
    return lo, hi


def div_bounds(x: Bound, y: Bound) -> Bound:
    (la, ha), (lb, hb) = x, y
    if hb is not None and hb <= -1:
        return div_bounds(ineg(x), ineg(y))  # a // b == (-a) // (-b)
    if lb is None or lb < 1:
        return None, None
    # a // b rises with a; it falls with b for a >= 0 and rises with b for a < 0.
    if la is None:
        lo = None
    elif la >= 0:
        lo = 0 if hb is None else la // hb
    else:
        lo = la // lb
    if ha is None:
        hi = None
    elif ha >= 0:
        hi = ha // lb
    else:
        hi = -1 if hb is None else ha // hb
    return lo, hi


def mod_bounds(x: Bound, y: Bound) -> Bound:
    (la, ha), (lb, hb) = x, y
    if hb is not None and hb <= -1:
        return ineg(mod_bounds(ineg(x), ineg(y)))  # a % b == -((-a) % (-b))
    if lb is None or lb < 1:
        return None, None
    hi = None if hb is None else hb - 1
    if la is not None and la >= 0 and ha is not None:
        hi = ha if hi is None else min(ha, hi)
    return 0, hi


def minmax_bounds(x: Bound, y: Bound, is_min: bool) -> Bound:
    if not is_min:
        return ineg(minmax_bounds(ineg(x), ineg(y), True))
    lo = None if x[0] is None or y[0] is None else min(x[0], y[0])
    hi = y[1] if x[1] is None else (x[1] if y[1] is None else min(x[1], y[1]))
    return lo, hi


ATOM_BOUNDS: dict[str, Callable[[Bound, Bound], Bound]] = {
    "//": div_bounds,
    "%": mod_bounds,
    "min": lambda x, y: minmax_bounds(x, y, True),
    "max": lambda x, y: minmax_bounds(x, y, False),
}
