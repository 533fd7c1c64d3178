"""Substitution, simplification, free vars and evaluation of symbolic dims (``tilework.ir.sym``
builds and compares them; this walks them).

``substitute`` replaces vars by dims and re-canonicalizes (images should lie in their var's
range, since canonical forms may rely on it); ``simplify`` re-runs the canonicalizing rules once
per interned expression; ``evaluate`` gives the value under an assignment of every var.
"""

from __future__ import annotations

from typing import Mapping

from tilework.errors import SymbolicError
from tilework.ir.sym import Dim, FloorDiv, FloorMod, Min, Poly, SymExpr, SymVar, _Binary, _check, substitute_atoms, to_str

_simplified: dict["SymExpr", Dim] = {}  # interned expressions are kept anyway (``_interned``)


def simplify(e: Dim) -> Dim:
    """The canonical form of ``e``. Expressions are canonical on construction; this re-runs
    the rules bottom-up (a fixed point for expressions built by this module), once per
    expression (structural hashing and equality ask again and again)."""
    if isinstance(e, int):
        return e
    got = _simplified.get(e)
    if got is None:
        got = _simplified[e] = substitute(e, {})
    return got


def substitute(e: Dim, mapping: Mapping[SymVar, Dim]) -> Dim:
    """Replace vars by dims (simultaneously) and re-canonicalize. Images should lie in their
    var's range, since canonical forms may rely on it."""
    if isinstance(e, int):
        return e
    memo: dict[SymExpr, Dim] = {}

    def go(x: Dim) -> Dim:
        if isinstance(x, int):
            return x
        if isinstance(x, SymVar):
            return _check(mapping[x]) if x in mapping else x
        r = memo.get(x)
        if r is None:
            r = substitute_atoms(x, go)
            memo[x] = r
        return r

    return go(e)


def free_vars(e: Dim) -> tuple[SymVar, ...]:
    """Vars of ``e`` in first-occurrence order."""
    out: dict[SymVar, None] = {}
    seen: set[SymExpr] = set()

    def go(x: Dim) -> None:
        if isinstance(x, int) or x in seen:
            return
        seen.add(x)
        if isinstance(x, SymVar):
            out[x] = None
        elif isinstance(x, Poly):
            for m, _ in x.terms:
                for a in m:
                    go(a)
        else:
            assert isinstance(x, _Binary)
            go(x.a)
            go(x.b)

    go(e)
    return tuple(out)


def evaluate(e: Dim, env: Mapping[SymVar, int]) -> int:
    """The value of ``e`` under an assignment of all its vars."""
    if isinstance(e, int):
        return e
    return _eval(e, env, {})


def _eval(e: Dim, env: Mapping[SymVar, int], memo: dict[SymExpr, int]) -> int:
    if isinstance(e, int):
        return e
    if isinstance(e, SymVar):
        try:
            return env[e]
        except KeyError:
            raise SymbolicError(f"no value for symbolic dim {e.name!r}") from None
    if isinstance(e, Poly):
        total = e.const
        for m, c in e.terms:
            t = c
            for a in m:
                t *= _eval(a, env, memo)
            total += t
        return total
    assert isinstance(e, _Binary)
    r = memo.get(e)
    if r is not None:
        return r
    x, y = _eval(e.a, env, memo), _eval(e.b, env, memo)
    if isinstance(e, (FloorDiv, FloorMod)):
        if y == 0:
            raise SymbolicError(f"division by zero evaluating {to_str(e)}")
        r = x // y if isinstance(e, FloorDiv) else x % y
    else:
        r = min(x, y) if isinstance(e, Min) else max(x, y)
    memo[e] = r
    return r
