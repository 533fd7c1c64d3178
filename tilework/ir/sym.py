"""Symbolic integer expressions for tensor dimensions.

A dimension is a ``Dim``: a plain Python ``int`` when it is known, or a ``SymExpr`` otherwise.
Every arithmetic operation returns a canonical, interned result, so structurally equal
expressions are the same object (``is`` compares them, hashing is by identity) and an
expression that folds to a constant comes back as an ``int``.

Canonical form: a sum of monomials over *atoms* with integer coefficients plus a constant.
Atoms are ``SymVar`` and the irreducible terms ``FloorDiv``, ``FloorMod``, ``Min`` and ``Max``.
Semantics are Python's: ``//`` and ``%`` floor. Every ``SymVar`` carries its range: it is
``>= lo`` (0 unless declared) and ``<= hi`` when an upper bound is declared; the simplifier and
the provers use these ranges.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Mapping, Union

from tilework.errors import SymbolicError

Dim = Union[int, "SymExpr"]
Mono = tuple["Atom", ...]  # sorted atoms, repeated for powers; () is the constant monomial
PolyDict = dict[Mono, int]

_interned: dict[tuple, "SymExpr"] = {}
_var_serial = itertools.count()


class SymExpr:
    """Base of symbolic integer expressions. Immutable and interned: compare with ``is``."""

    __slots__ = ("_sort_key", "__weakref__")
    _sort_key: tuple

    # -- arithmetic: every operator returns a canonical Dim ------------------------------
    def __add__(self, other: Dim) -> Dim:
        return add(self, other)

    def __radd__(self, other: Dim) -> Dim:
        return add(other, self)

    def __sub__(self, other: Dim) -> Dim:
        return sub(self, other)

    def __rsub__(self, other: Dim) -> Dim:
        return sub(other, self)

    def __mul__(self, other: Dim) -> Dim:
        return mul(self, other)

    def __rmul__(self, other: Dim) -> Dim:
        return mul(other, self)

    def __floordiv__(self, other: Dim) -> Dim:
        return floordiv(self, other)

    def __rfloordiv__(self, other: Dim) -> Dim:
        return floordiv(other, self)

    def __mod__(self, other: Dim) -> Dim:
        return floormod(self, other)

    def __rmod__(self, other: Dim) -> Dim:
        return floormod(other, self)

    def __neg__(self) -> Dim:
        return mul(self, -1)

    def __pos__(self) -> Dim:
        return self

    def __repr__(self) -> str:
        return to_str(self)

    def __str__(self) -> str:
        return to_str(self)

    def __reduce__(self) -> tuple:
        return _rebuild, (_to_tree(self),)


class Atom(SymExpr):
    """An expression that is a factor of a monomial: a variable or an irreducible term."""

    __slots__ = ()


class SymVar(Atom):
    """A named integer variable (a dynamic dimension). Identity, not name, makes it unique.

    ``lo`` is a proven lower bound (dims are >= 0 by default); ``hi`` an optional upper bound.
    """

    __slots__ = ("name", "lo", "hi")

    def __init__(self, name: str, lo: int = 0, hi: int | None = None) -> None:
        if not name.isidentifier():
            raise SymbolicError(f"symbolic dim name {name!r} is not an identifier")
        if hi is not None and hi < lo:
            raise SymbolicError(f"symbolic dim {name!r}: upper bound {hi} is below lower bound {lo}")
        self.name = name
        self.lo = lo
        self.hi = hi
        self._sort_key = (0, name, next(_var_serial))

    def __reduce__(self) -> tuple:
        return SymVar, (self.name, self.lo, self.hi)


class FloorDiv(Atom):
    __slots__ = ("a", "b")

    def __init__(self, a: SymExpr | int, b: SymExpr | int) -> None:
        self.a, self.b = a, b
        self._sort_key = (1, "//", _key_of(a), _key_of(b))


class FloorMod(Atom):
    __slots__ = ("a", "b")

    def __init__(self, a: SymExpr | int, b: SymExpr | int) -> None:
        self.a, self.b = a, b
        self._sort_key = (1, "%", _key_of(a), _key_of(b))


class Min(Atom):
    __slots__ = ("a", "b")

    def __init__(self, a: SymExpr | int, b: SymExpr | int) -> None:
        self.a, self.b = a, b
        self._sort_key = (1, "min", _key_of(a), _key_of(b))


class Max(Atom):
    __slots__ = ("a", "b")

    def __init__(self, a: SymExpr | int, b: SymExpr | int) -> None:
        self.a, self.b = a, b
        self._sort_key = (1, "max", _key_of(a), _key_of(b))


class Poly(SymExpr):
    """``sum(coeff * prod(mono)) + const`` that is not a single atom or a constant."""

    __slots__ = ("terms", "const")

    def __init__(self, terms: tuple[tuple[Mono, int], ...], const: int) -> None:
        self.terms = terms
        self.const = const
        self._sort_key = (2, tuple((tuple(a._sort_key for a in m), c) for m, c in terms), const)


def _key_of(x: Dim) -> tuple:
    return (-1, x) if isinstance(x, int) else x._sort_key


# -- interning ----------------------------------------------------------------------------


def _intern(key: tuple, make: Callable[[], SymExpr]) -> SymExpr:
    node = _interned.get(key)
    if node is None:
        node = make()
        _interned[key] = node
    return node


def _mono_key(m: Mono) -> tuple:
    return tuple(a._sort_key for a in m)


def _from_poly(p: PolyDict) -> Dim:
    """The canonical Dim for a polynomial (drops zero coefficients)."""
    const = p.get((), 0)
    terms = [(m, c) for m, c in p.items() if m and c != 0]
    if not terms:
        return const
    if len(terms) == 1 and const == 0 and terms[0][1] == 1 and len(terms[0][0]) == 1:
        return terms[0][0][0]
    terms.sort(key=lambda t: (-len(t[0]), _mono_key(t[0])))
    tterms = tuple(terms)
    return _intern(("P", tterms, const), lambda: Poly(tterms, const))


def _poly(x: Dim) -> PolyDict:
    if isinstance(x, int):
        return {(): x} if x else {}
    if isinstance(x, Poly):
        d: PolyDict = dict(x.terms)
        if x.const:
            d[()] = x.const
        return d
    if isinstance(x, Atom):
        return {(x,): 1}
    raise SymbolicError(f"not a symbolic dim: {x!r}")


def _check(x: object) -> Dim:
    if isinstance(x, bool) or not isinstance(x, (int, SymExpr)):
        raise SymbolicError(f"expected an int or a symbolic dim, got {type(x).__name__}: {x!r}")
    return x  # type: ignore[return-value]


# -- arithmetic ---------------------------------------------------------------------------


def add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    p = _poly(_check(a))
    for m, c in _poly(_check(b)).items():
        p[m] = p.get(m, 0) + c
    return _from_poly(p)


def sub(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    p = _poly(_check(a))
    for m, c in _poly(_check(b)).items():
        p[m] = p.get(m, 0) - c
    return _from_poly(p)


def _mono_mul(x: Mono, y: Mono) -> Mono:
    if not x:
        return y
    if not y:
        return x
    return tuple(sorted(x + y, key=lambda a: a._sort_key))


def mul(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    pa, pb = _poly(_check(a)), _poly(_check(b))
    out: PolyDict = {}
    for ma, ca in pa.items():
        for mb, cb in pb.items():
            m = _mono_mul(ma, mb)
            out[m] = out.get(m, 0) + ca * cb
    return _from_poly(out)


def _mono_div(m: Mono, d: Mono) -> Mono | None:
    """m / d as a monomial, or None when d does not divide m."""
    rest = list(m)
    for a in d:
        for i, r in enumerate(rest):
            if r is a:
                del rest[i]
                break
        else:
            return None
    return tuple(rest)


def _split_divisible(p: PolyDict, dm: Mono, dc: int) -> tuple[PolyDict, PolyDict]:
    """Split p into (q, r) with p == q * (dc * dm) + r, q collecting the divisible terms."""
    q: PolyDict = {}
    r: PolyDict = {}
    for m, c in p.items():
        qm = _mono_div(m, dm)
        if qm is not None and c % dc == 0:
            q[qm] = c // dc
        else:
            r[m] = c
    return q, r


def _single_mono(p: PolyDict) -> tuple[Mono, int] | None:
    if len(p) == 1:
        ((m, c),) = p.items()
        return m, c
    return None


def floordiv(a: Dim, b: Dim) -> Dim:
    a, b = _check(a), _check(b)
    if isinstance(b, int) and b == 0:
        raise SymbolicError(f"division by zero in ({to_str(a)}) // 0")
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    if b == 1:
        return a
    pb = _poly(b)
    mono = _single_mono(pb)
    if mono is not None and (mono[1] > 0 and (not mono[0] or prove_ge(b, 1))):
        q, r = _split_divisible(_poly(a), *mono)
        if q:
            return add(_from_poly(q), floordiv(_from_poly(r), b))
    if isinstance(a, int) and a == 0:
        return 0
    lo, hi = bounds(a)
    blo, bhi = bounds(b)
    if blo is not None and blo >= 1 and lo is not None and lo >= 0:
        if hi is not None and hi < blo:
            return 0
    if isinstance(a, FloorDiv) and isinstance(a.b, int) and isinstance(b, int) and a.b > 0 and b > 0:
        return floordiv(a.a, a.b * b)
    return _intern(("//", a, b), lambda: FloorDiv(a, b))


def floormod(a: Dim, b: Dim) -> Dim:
    a, b = _check(a), _check(b)
    if isinstance(b, int) and b == 0:
        raise SymbolicError(f"modulo by zero in ({to_str(a)}) % 0")
    if isinstance(a, int) and isinstance(b, int):
        return a % b
    if b == 1 or b == -1:
        return 0
    pb = _poly(b)
    mono = _single_mono(pb)
    if mono is not None and (mono[1] > 0 and (not mono[0] or prove_ge(b, 1))):
        q, r = _split_divisible(_poly(a), *mono)
        if q:
            return floormod(_from_poly(r), b)
    if isinstance(a, int) and a == 0:
        return 0
    lo, hi = bounds(a)
    blo, _ = bounds(b)
    if blo is not None and blo >= 1 and lo is not None and lo >= 0 and hi is not None and hi < blo:
        return a
    if isinstance(a, FloorMod) and isinstance(a.b, int) and isinstance(b, int) and b > 0 and a.b % b == 0:
        return floormod(a.a, b)
    return _intern(("%", a, b), lambda: FloorMod(a, b))


def min_(a: Dim, b: Dim) -> Dim:
    a, b = _check(a), _check(b)
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    if a is b or prove_le(a, b):
        return a
    if prove_le(b, a):
        return b
    if _key_of(b) < _key_of(a):
        a, b = b, a
    return _intern(("min", a, b), lambda: Min(a, b))


def max_(a: Dim, b: Dim) -> Dim:
    a, b = _check(a), _check(b)
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if a is b or prove_ge(a, b):
        return a
    if prove_ge(b, a):
        return b
    if _key_of(b) < _key_of(a):
        a, b = b, a
    return _intern(("max", a, b), lambda: Max(a, b))


def ceildiv(a: Dim, b: Dim) -> Dim:
    """``ceil(a / b)`` for positive ``b``, written with floor division."""
    return floordiv(add(a, sub(b, 1)), b)


# -- bounds -------------------------------------------------------------------------------

Bound = tuple[Union[int, None], Union[int, None]]  # (lo, hi); None is unbounded on that side


def _imul(x: Bound, y: Bound) -> Bound:
    (a, b), (c, d) = x, y
    if None not in (a, b, c, d):
        prods = [a * c, a * d, b * c, b * d]  # type: ignore[operator]
        return min(prods), max(prods)
    # Dims are usually non-negative: handle [>=0] * [>=0] with open upper ends.
    if a is not None and c is not None and a >= 0 and c >= 0:
        hi = b * d if b is not None and d is not None else None
        return a * c, hi
    return None, None


def _iscale(x: Bound, k: int) -> Bound:
    lo, hi = x
    if k >= 0:
        return (None if lo is None else lo * k), (None if hi is None else hi * k)
    return (None if hi is None else hi * k), (None if lo is None else lo * k)


def _iadd(x: Bound, y: Bound) -> Bound:
    lo = None if x[0] is None or y[0] is None else x[0] + y[0]
    hi = None if x[1] is None or y[1] is None else x[1] + y[1]
    return lo, hi


def _atom_bounds(a: Atom) -> Bound:
    if isinstance(a, SymVar):
        return a.lo, a.hi
    la, ha = bounds(a.a)  # type: ignore[attr-defined]
    lb, hb = bounds(a.b)  # type: ignore[attr-defined]
    if isinstance(a, Min):
        lo = None if la is None or lb is None else min(la, lb)
        hi = hb if ha is None else (ha if hb is None else min(ha, hb))
        return lo, hi
    if isinstance(a, Max):
        lo = lb if la is None else (la if lb is None else max(la, lb))
        hi = None if ha is None or hb is None else max(ha, hb)
        return lo, hi
    if isinstance(a, FloorMod):
        if lb is not None and lb >= 1:
            hi = None if hb is None else hb - 1
            if la is not None and la >= 0 and ha is not None:
                hi = ha if hi is None else min(ha, hi)
            return 0, hi
        if hb is not None and hb <= -1:
            return (None if lb is None else lb + 1), 0
        return None, None
    if isinstance(a, FloorDiv):
        if lb is not None and lb >= 1:
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
        if lb is not None and lb == hb and lb <= -1:
            return (None if ha is None else ha // lb), (None if la is None else la // lb)
        return None, None
    return None, None


def bounds(e: Dim) -> Bound:
    """Interval bounds ``(lo, hi)`` of ``e`` over the ranges of its vars (None: unbounded)."""
    if isinstance(e, int):
        return e, e
    if isinstance(e, Atom):
        return _atom_bounds(e)
    assert isinstance(e, Poly)
    acc: Bound = (e.const, e.const)
    for m, c in e.terms:
        mb: Bound = (1, 1)
        for a in m:
            mb = _imul(mb, _atom_bounds(a))
        acc = _iadd(acc, _iscale(mb, c))
    return acc


# -- provers ------------------------------------------------------------------------------


def _expand_mods(e: Dim) -> Dim:
    """Rewrite every ``a % b`` as ``a - b * (a // b)``, which lets cancellations show."""
    if isinstance(e, int) or isinstance(e, SymVar):
        return e
    if isinstance(e, FloorMod):
        a, b = _expand_mods(e.a), _expand_mods(e.b)
        return sub(a, mul(b, floordiv(a, b)))
    return substitute_atoms(e, _expand_mods)


def prove_ge(a: Dim, b: Dim = 0) -> bool:
    """True when ``a >= b`` holds for every assignment in range (False means: not proved)."""
    d = sub(a, b)
    lo = bounds(d)[0]
    if lo is not None and lo >= 0:
        return True
    if isinstance(d, int):
        return False
    d2 = _expand_mods(d)
    if d2 is not d:
        lo = bounds(d2)[0]
        return lo is not None and lo >= 0
    return False


def prove_le(a: Dim, b: Dim = 0) -> bool:
    """True when ``a <= b`` holds for every assignment in range."""
    return prove_ge(b, a)


def prove_eq(a: Dim, b: Dim) -> bool:
    """True when ``a == b`` for every assignment in range."""
    if a is b or (isinstance(a, int) and isinstance(b, int) and a == b):
        return True
    d = sub(a, b)
    if d == 0:
        return True
    if isinstance(d, int):
        return False
    if _expand_mods(d) == 0:
        return True
    lo, hi = bounds(d)
    return lo == 0 and hi == 0


def prove_ne(a: Dim, b: Dim) -> bool:
    """True when ``a != b`` for every assignment in range (a provable mismatch)."""
    d = sub(a, b)
    if isinstance(d, int):
        return d != 0
    lo, hi = bounds(d)
    return (lo is not None and lo > 0) or (hi is not None and hi < 0)


def simplify(e: Dim) -> Dim:
    """The canonical form of ``e``. Expressions are canonical on construction; this re-runs
    the rules bottom-up, which matters after var ranges were used to build a tighter form."""
    return substitute(e, {})


# -- traversal ----------------------------------------------------------------------------


def _children(a: Atom) -> tuple[Dim, Dim]:
    return a.a, a.b  # type: ignore[attr-defined]


_REBUILD: dict[type, Callable[[Dim, Dim], Dim]] = {
    FloorDiv: floordiv,
    FloorMod: floormod,
    Min: min_,
    Max: max_,
}


def substitute_atoms(e: Dim, f: Callable[[Dim], Dim]) -> Dim:
    """Rebuild ``e`` with ``f`` applied to the children of each compound atom and each
    monomial factor."""
    if isinstance(e, int) or isinstance(e, SymVar):
        return e
    if isinstance(e, Atom):
        x, y = _children(e)
        return _REBUILD[type(e)](f(x), f(y))
    assert isinstance(e, Poly)
    acc: Dim = e.const
    for m, c in e.terms:
        t: Dim = c
        for a in m:
            t = mul(t, f(a))
        acc = add(acc, t)
    return acc


def substitute(e: Dim, mapping: Mapping[SymVar, Dim]) -> Dim:
    """Replace vars by dims and re-canonicalize."""
    if isinstance(e, int):
        return e
    if isinstance(e, SymVar):
        return mapping.get(e, e)
    memo: dict[SymExpr, Dim] = {}

    def go(x: Dim) -> Dim:
        if isinstance(x, int):
            return x
        if isinstance(x, SymVar):
            return mapping.get(x, x)
        r = memo.get(x)
        if r is None:
            r = substitute_atoms(x, go)
            memo[x] = r
        return r

    return go(e)


def free_vars(e: Dim) -> tuple[SymVar, ...]:
    """Vars of ``e`` in first-occurrence order."""
    out: dict[SymVar, None] = {}

    def go(x: Dim) -> None:
        if isinstance(x, int):
            return
        if isinstance(x, SymVar):
            out[x] = None
        elif isinstance(x, Poly):
            for m, _ in x.terms:
                for a in m:
                    go(a)
        else:
            go(x.a)  # type: ignore[attr-defined]
            go(x.b)  # type: ignore[attr-defined]

    go(e)
    return tuple(out)


def evaluate(e: Dim, env: Mapping[SymVar, int]) -> int:
    """The value of ``e`` under an assignment of all its vars."""
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
                t *= evaluate(a, env)
            total += t
        return total
    x = evaluate(e.a, env)  # type: ignore[attr-defined]
    y = evaluate(e.b, env)  # type: ignore[attr-defined]
    if isinstance(e, FloorDiv):
        if y == 0:
            raise SymbolicError(f"division by zero evaluating {to_str(e)}")
        return x // y
    if isinstance(e, FloorMod):
        if y == 0:
            raise SymbolicError(f"modulo by zero evaluating {to_str(e)}")
        return x % y
    return min(x, y) if isinstance(e, Min) else max(x, y)


def is_static(dims: Iterable[Dim]) -> bool:
    return all(isinstance(d, int) for d in dims)


def product(dims: Iterable[Dim]) -> Dim:
    acc: Dim = 1
    for d in dims:
        acc = mul(acc, d)
    return acc


# -- printing (Python syntax; the text parser reads it back) -----------------------------

_PREC_ADD, _PREC_MUL, _PREC_ATOM = 1, 2, 3


def _str_prec(e: Dim, names: Callable[[SymVar], str]) -> tuple[str, int]:
    if isinstance(e, int):
        return str(e), (_PREC_ATOM if e >= 0 else _PREC_ADD)
    if isinstance(e, SymVar):
        return names(e), _PREC_ATOM
    if isinstance(e, (Min, Max)):
        fn = "min" if isinstance(e, Min) else "max"
        return f"{fn}({_str(e.a, names)}, {_str(e.b, names)})", _PREC_ATOM
    if isinstance(e, (FloorDiv, FloorMod)):
        op = "//" if isinstance(e, FloorDiv) else "%"
        a, pa = _str_prec(e.a, names)
        b, pb = _str_prec(e.b, names)
        if pa < _PREC_MUL:
            a = f"({a})"
        if pb <= _PREC_MUL:
            b = f"({b})"
        return f"{a} {op} {b}", _PREC_MUL
    assert isinstance(e, Poly)
    parts: list[str] = []
    prec = _PREC_ADD
    for m, c in e.terms:
        printed = [_str_prec(a, names) for a in m]
        if len(m) == 1 and abs(c) == 1:
            body, prec = printed[0]
        else:
            factors = [s if p == _PREC_ATOM else f"({s})" for s, p in printed]
            if abs(c) != 1:
                factors.insert(0, str(abs(c)))
            body, prec = " * ".join(factors), _PREC_MUL
        parts.append(("- " if c < 0 else "+ ") + body)
    if e.const:
        parts.append(("- " if e.const < 0 else "+ ") + str(abs(e.const)))
    s = " ".join(parts)
    if len(parts) == 1 and s.startswith("+ "):
        return s[2:], prec
    return (s[2:] if s.startswith("+ ") else "-" + s[2:]), _PREC_ADD


def _str(e: Dim, names: Callable[[SymVar], str]) -> str:
    return _str_prec(e, names)[0]


def to_str(e: Dim, names: Callable[[SymVar], str] | None = None) -> str:
    """Python-syntax text of ``e``; ``names`` renames vars (the printer makes names unique)."""
    return _str(e, names or (lambda v: v.name))


# -- pickling: interned nodes are rebuilt through the constructors ------------------------


def _to_tree(e: Dim) -> object:
    if isinstance(e, (int, SymVar)):
        return e
    if isinstance(e, Poly):
        return ("P", tuple((tuple(_to_tree(a) for a in m), c) for m, c in e.terms), e.const)
    kind = {FloorDiv: "//", FloorMod: "%", Min: "min", Max: "max"}[type(e)]
    return (kind, _to_tree(e.a), _to_tree(e.b))  # type: ignore[attr-defined]


def _rebuild(tree: object) -> Dim:
    if isinstance(tree, (int, SymVar)):
        return tree
    assert isinstance(tree, tuple)
    if tree[0] == "P":
        acc: Dim = tree[2]
        for m, c in tree[1]:
            t: Dim = c
            for a in m:
                t = mul(t, _rebuild(a))
            acc = add(acc, t)
        return acc
    fn = {"//": floordiv, "%": floormod, "min": min_, "max": max_}[tree[0]]
    return fn(_rebuild(tree[1]), _rebuild(tree[2]))
