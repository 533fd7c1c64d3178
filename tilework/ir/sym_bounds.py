"""Interval bounds of symbolic dims (part of ``tilework.ir.sym``; import it from there).

``bounds(e)`` is sound, not always tight, and cached on each node: vars contribute their declared
range, polynomials are bounded term by term (and again with every term shifted by its lower
bound, which keeps ``n*m - n >= 0``), and ``//``, ``%``, ``min``, ``max`` have their own rules.
"""

from __future__ import annotations

import math
from typing import Callable

from tilework.ir.sym import Atom, Bound, Dim, Poly, PolyDict, _Binary

_INF = float("inf")


def _xmul(p: float, q: float) -> float:
    if p == 0 or q == 0:
        return 0
    if isinstance(p, float) or isinstance(q, float):  # an infinite end: only its sign matters
        return _INF if (p > 0) == (q > 0) else -_INF
    return p * q


def _imul(x: Bound, y: Bound) -> Bound:
    xs = (-_INF if x[0] is None else x[0], _INF if x[1] is None else x[1])
    ys = (-_INF if y[0] is None else y[0], _INF if y[1] is None else y[1])
    prods = [_xmul(p, q) for p in xs for q in ys]
    lo, hi = min(prods), max(prods)
    return (None if lo == -_INF else int(lo)), (None if hi == _INF else int(hi))


def _iadd(x: Bound, y: Bound) -> Bound:
    lo = None if x[0] is None or y[0] is None else x[0] + y[0]
    hi = None if x[1] is None or y[1] is None else x[1] + y[1]
    return lo, hi


def _ineg(x: Bound) -> Bound:
    return (None if x[1] is None else -x[1]), (None if x[0] is None else -x[0])


def _meet(x: Bound, y: Bound) -> Bound:
    lo = x[0] if y[0] is None else (y[0] if x[0] is None else max(x[0], y[0]))
    hi = x[1] if y[1] is None else (y[1] if x[1] is None else min(x[1], y[1]))
    return lo, hi


def _div_bounds(x: Bound, y: Bound) -> Bound:
    (la, ha), (lb, hb) = x, y
    if hb is not None and hb <= -1:
        return _div_bounds(_ineg(x), _ineg(y))  # a // b == (-a) // (-b)
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


def _mod_bounds(x: Bound, y: Bound) -> Bound:
    (la, ha), (lb, hb) = x, y
    if hb is not None and hb <= -1:
        return _ineg(_mod_bounds(_ineg(x), _ineg(y)))  # a % b == -((-a) % (-b))
    if lb is None or lb < 1:
        return None, None
    hi = None if hb is None else hb - 1
    if la is not None and la >= 0 and ha is not None:
        hi = ha if hi is None else min(ha, hi)
    return 0, hi


def _minmax_bounds(x: Bound, y: Bound, is_min: bool) -> Bound:
    if not is_min:
        return _ineg(_minmax_bounds(_ineg(x), _ineg(y), True))
    lo = None if x[0] is None or y[0] is None else min(x[0], y[0])
    hi = y[1] if x[1] is None else (x[1] if y[1] is None else min(x[1], y[1]))
    return lo, hi


_ATOM_BOUNDS: dict[str, Callable[[Bound, Bound], Bound]] = {
    "//": _div_bounds,
    "%": _mod_bounds,
    "min": lambda x, y: _minmax_bounds(x, y, True),
    "max": lambda x, y: _minmax_bounds(x, y, False),
}


def _shifted_bounds(e: Poly) -> Bound:
    """Bounds of ``e`` after writing each atom as ``lo + t`` with ``t`` in ``[0, hi - lo]`` and
    expanding: terms then cancel (``n*m - n`` becomes ``n0*t_m + t_n*t_m``) where plain interval
    arithmetic treats them as independent."""
    if sum(1 << len(m) for m, _ in e.terms) > 256:
        return None, None
    shifted: PolyDict = {}
    width: dict[Atom, int | None] = {}
    for m, c in e.terms:
        part: PolyDict = {(): c}
        for atom in m:
            lo, hi = bounds(atom)
            if lo is None:
                return None, None
            width[atom] = None if hi is None else hi - lo
            nxt: PolyDict = {}
            for k, v in part.items():
                if lo:
                    nxt[k] = nxt.get(k, 0) + v * lo
                nxt[k + (atom,)] = nxt.get(k + (atom,), 0) + v
            part = nxt
        for k, v in part.items():
            shifted[k] = shifted.get(k, 0) + v
    const = e.const + shifted.pop((), 0)
    acc: Bound = (const, const)
    for k, v in shifted.items():
        widths = [width[a] for a in k]
        top = 0 if 0 in widths else (None if None in widths else math.prod(widths))  # type: ignore[arg-type]
        acc = _iadd(acc, _imul((0, top), (v, v)))
    return acc


def _poly_bounds(e: Poly) -> Bound:
    acc: Bound = (e.const, e.const)
    exact = True  # all coefficients > 0 and all atoms >= 0: the shifted form adds nothing
    for m, c in e.terms:
        mb: Bound = (1, 1)
        for atom in m:
            ab = bounds(atom)
            exact = exact and ab[0] is not None and ab[0] >= 0
            mb = _imul(mb, ab)
        exact = exact and c > 0
        acc = _iadd(acc, _imul(mb, (c, c)))
    return acc if exact else _meet(acc, _shifted_bounds(e))


def bounds(e: Dim) -> Bound:
    """Interval bounds ``(lo, hi)`` of ``e`` over the ranges of its vars (None: unbounded).
    Sound, not always tight; cached on the node."""
    if isinstance(e, int):
        return int(e), int(e)
    bnd = e._bnd
    if bnd is not None:
        return bnd
    if isinstance(e, Poly):
        bnd = _poly_bounds(e)
    else:
        assert isinstance(e, _Binary)
        bnd = _ATOM_BOUNDS[e.OP](bounds(e.a), bounds(e.b))
    e._bnd = bnd
    return bnd
