"""Substitution, simplification, free vars and evaluation of symbolic dims (``tilework.ir.sym``
builds and compares them; this walks them).

``substitute`` replaces vars by dims and re-canonicalizes (images should lie in their var's
range, since canonical forms may rely on it); ``simplify`` re-runs the canonicalizing rules once
per interned expression; ``evaluate`` gives the value under an assignment of every var.
"""

from __future__ import annotations

from typing import Callable, Mapping

from tilework.errors import SymbolicError
from tilework.ir.sym import ITSELF, Dim, FloorDiv, FloorMod, Min, Poly, SymExpr, SymVar, _Binary, _check, substitute_atoms, to_str


def simplify(e: Dim) -> Dim:
    """The canonical form of ``e``. Expressions are canonical on construction; this re-runs
    the rules bottom-up (a fixed point for expressions built by this module), once per
    expression (structural hashing and equality ask again and again)."""
    if isinstance(e, int):
        return e
    got = e._canon
    if got is None:
        got = substitute(e, {})
        e._canon = ITSELF if got is e else got
        return got
    return e if got is ITSELF else got  # type: ignore[return-value]


def substitute(e: Dim, mapping: Mapping[SymVar, Dim]) -> Dim:
    """Replace vars by dims (simultaneously) and re-canonicalize. Images should lie in their
    var's range, since canonical forms may rely on it."""
    return e if isinstance(e, int) else _Substitution(mapping)(e)


def substituter(mapping: Mapping[SymVar, Dim]) -> Callable[[Dim], Dim]:
    """``substitute(., mapping)`` as one function with one memo, for many dims that share
    their parts (the indices of a loop nest). The mapping must not change while it is used."""
    return _Substitution(mapping)


class _Substitution:
    """``substitute``'s walk, memoized per call. An object rather than a recursive closure,
    which would be a reference cycle keeping the memo (and its nodes) alive until a collection."""

    __slots__ = ("mapping", "memo")

    def __init__(self, mapping: Mapping[SymVar, Dim]) -> None:
        self.mapping = mapping
        self.memo: dict[SymExpr, Dim] = {}

    def __call__(self, x: Dim) -> Dim:
        if isinstance(x, int):
            return x
        if isinstance(x, SymVar):
            return _check(self.mapping[x]) if x in self.mapping else x
        r = self.memo.get(x)
        if r is None:
            r = self.memo[x] = substitute_atoms(x, self)
        return r


def free_vars(e: Dim) -> tuple[SymVar, ...]:
    """Vars of ``e`` in first-occurrence order."""
    out: dict[SymVar, None] = {}
    seen: set[SymExpr] = set()
    todo = [e]  # a stack, children pushed in reverse so they come off in order
    while todo:
        x = todo.pop()
        if isinstance(x, int) or x in seen:
            continue
        seen.add(x)
        if isinstance(x, SymVar):
            out[x] = None
        elif isinstance(x, Poly):
            todo.extend(reversed([a for m, _ in x.terms for a in m]))
        else:
            assert isinstance(x, _Binary)
            todo += (x.b, x.a)
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
