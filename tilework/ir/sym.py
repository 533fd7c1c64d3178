"""Symbolic integer expressions for tensor dimensions.

A dimension is a ``Dim``: a plain Python ``int`` when it is known, or a ``SymExpr`` otherwise.
Every arithmetic operation returns a canonical, interned result, so structurally equal
expressions are the same object (``is`` compares them, hashing is by identity) and an
expression that folds to a constant comes back as an ``int``.

Canonical form: a sum of monomials over *atoms* with integer coefficients plus a constant.
Atoms are ``SymVar`` and the irreducible terms ``FloorDiv``, ``FloorMod``, ``Min`` and ``Max``.
Semantics are Python's: ``//`` and ``%`` floor. Every ``SymVar`` carries its range: it is
``>= lo`` (0 unless declared) and ``<= hi`` when an upper bound is declared; the simplifier and
the provers use these ranges, so a rewrite may hold only for values in range (substituting an
out-of-range value into a canonical expression does not recover the unsimplified one).
Divisors of ``FloorDiv``/``FloorMod`` atoms have a positive sign (a constant one is >= 2).

Substitution, simplification, free vars and evaluation walk these expressions in
``tilework.ir.sym_walk``; their text (``to_str``, the ``repr``) is written by
``tilework.ir.sym_print``.
"""

from __future__ import annotations

import contextlib
import itertools
import keyword
import math
import operator
import threading
import weakref
from typing import Callable, Iterable, Iterator, Sequence, SupportsIndex, Union

from tilework.errors import SymbolicError
from tilework.ir.interval import ATOM_BOUNDS, Bound, div_bounds, iadd, imul, meet
from tilework.ir.sym_print import to_str  # re-exported: ``sym.to_str``

Dim = Union[int, "SymExpr"]
Mono = tuple["Atom", ...]  # sorted atoms, repeated for powers; () is the constant monomial
PolyDict = dict[Mono, int]

# Every live expression once: structure -> the expression. Weak, so a compile's expressions go
# when the compile is done (a process compiling again and again does not grow); within one
# (``held``) every expression made is kept, with what is memoized on it (bounds, simplified
# forms), since passes ask about the same expressions again and again.
_interned: weakref.WeakValueDictionary[tuple, "SymExpr"] = weakref.WeakValueDictionary()
_intern_lock = threading.Lock()
_held: list["SymExpr"] | None = None  # the expressions made while some ``held`` is open
_holders = 0
ITSELF = object()  # a memo slot's answer that is the node itself (see ``SymExpr``)
_var_serial = itertools.count()


class ScalarOperand:
    """Marker base of loop-level scalar expressions (``tilework.ir.loop.PExpr``). A dim's
    operators return ``NotImplemented`` for them, so ``i + A[i]`` builds a loop expression."""

    __slots__ = ()


class SymExpr:
    """Base of symbolic integer expressions. Immutable and interned: compare with ``is``."""

    __slots__ = ("_sort_key", "_bnd", "_canon", "_expd", "_nn", "__weakref__")
    _sort_key: tuple
    _bnd: Bound | None  # cached bounds (a pure function of the structure and the var ranges)
    # Memos on the node rather than in global dicts, so they go with it. None: not asked yet;
    # ITSELF: the answer is the node (a reference to itself would be a cycle outliving it).
    _canon: object  # ``sym_walk.simplify``
    _expd: object  # ``_expand_mods``
    _nn: bool | None  # ``_nonneg``: the proof of ``self >= 0`` (and ``prove_le``/``ge``, ``min_``/``max_``)

    # -- arithmetic: every operator returns a canonical Dim ------------------------------
    def __add__(self, other: Dim) -> Dim:
        return NotImplemented if isinstance(other, ScalarOperand) else add(self, other)

    __radd__ = __add__  # add and mul are commutative and canonical

    def __sub__(self, other: Dim) -> Dim:
        return NotImplemented if isinstance(other, ScalarOperand) else sub(self, other)

    def __rsub__(self, other: Dim) -> Dim:
        return NotImplemented if isinstance(other, ScalarOperand) else sub(other, self)

    def __mul__(self, other: Dim) -> Dim:
        return NotImplemented if isinstance(other, ScalarOperand) else mul(self, other)

    __rmul__ = __mul__

    def __floordiv__(self, other: Dim) -> Dim:
        return NotImplemented if isinstance(other, ScalarOperand) else floordiv(self, other)

    def __rfloordiv__(self, other: Dim) -> Dim:
        return NotImplemented if isinstance(other, ScalarOperand) else floordiv(other, self)

    def __mod__(self, other: Dim) -> Dim:
        return NotImplemented if isinstance(other, ScalarOperand) else floormod(self, other)

    def __rmod__(self, other: Dim) -> Dim:
        return NotImplemented if isinstance(other, ScalarOperand) else floormod(other, self)

    def __neg__(self) -> Dim:
        return mul(self, -1)

    def __pos__(self) -> Dim:
        return self

    def __repr__(self) -> str:
        return to_str(self)

    __str__ = __repr__

    # Immutable and interned: a copy is the object itself (as for ints), so identity survives.
    def __copy__(self) -> SymExpr:
        return self

    def __deepcopy__(self, memo: dict) -> SymExpr:
        return self


class Atom(SymExpr):
    """An expression that is a factor of a monomial: a variable or an irreducible term."""

    __slots__ = ()


def _as_int(x: object, what: str) -> int:
    if type(x) is int:  # the common case; the protocol check below takes microseconds
        return x
    if isinstance(x, bool) or not isinstance(x, SupportsIndex):
        raise SymbolicError(f"{what}: expected an int, got {type(x).__name__}: {x!r}")
    return operator.index(x)


class SymVar(Atom):
    """A named integer variable (a dynamic dimension). Identity, not name, makes it unique.

    ``lo`` is a proven lower bound (dims are >= 0 by default); ``hi`` an optional upper bound.
    Pickling creates a new var (shared by everything in the same pickle); copying keeps it.
    """

    __slots__ = ("name", "lo", "hi")

    def __init__(self, name: str, lo: int = 0, hi: int | None = None) -> None:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise SymbolicError(f"symbolic dim name {name!r} is not a Python identifier")
        lo = _as_int(lo, f"lower bound of {name!r}")
        hi = None if hi is None else _as_int(hi, f"upper bound of {name!r}")
        if hi is not None and hi < lo:
            raise SymbolicError(f"symbolic dim {name!r}: upper bound {hi} is below lower bound {lo}")
        self.name = name
        self.lo = lo
        self.hi = hi
        self._bnd = (lo, hi)
        self._canon = self._expd = self._nn = None
        self._sort_key = (0, name, next(_var_serial))

    def __reduce__(self) -> tuple:
        return SymVar, (self.name, self.lo, self.hi)


class _Binary(Atom):
    """An irreducible binary term ``OP(a, b)``; built only through its canonicalizing function."""

    __slots__ = ("a", "b")
    OP = ""

    def __init__(self, a: Dim, b: Dim) -> None:
        self.a, self.b = a, b
        self._bnd = None
        self._canon = self._expd = self._nn = None
        self._sort_key = (1, self.OP, _key_of(a), _key_of(b))

    def __reduce__(self) -> tuple:
        return _OPS[self.OP], (self.a, self.b)


class FloorDiv(_Binary):
    __slots__ = ()
    OP = "//"


class FloorMod(_Binary):
    __slots__ = ()
    OP = "%"


class Min(_Binary):
    __slots__ = ()
    OP = "min"


class Max(_Binary):
    __slots__ = ()
    OP = "max"


class Poly(SymExpr):
    """``sum(coeff * prod(mono)) + const`` that is not a single atom or a constant."""

    __slots__ = ("terms", "const")

    def __init__(self, terms: tuple[tuple[Mono, int], ...], const: int) -> None:
        self.terms = terms
        self.const = const
        self._bnd = None
        self._canon = self._expd = self._nn = None
        self._sort_key = (2, tuple((tuple(a._sort_key for a in m), c) for m, c in terms), const)

    def __reduce__(self) -> tuple:
        return _rebuild_poly, (self.terms, self.const)


def _key_of(x: Dim) -> tuple:
    return (-1, x) if isinstance(x, int) else x._sort_key


# -- canonical polynomials ----------------------------------------------------------------


def _intern(key: tuple, make: Callable[..., SymExpr], *args: object) -> SymExpr:
    node = _interned.get(key)
    if node is None:
        new = make(*args)
        with _intern_lock:  # one winner across threads
            node = _interned.setdefault(key, new)
            if node is new and _held is not None:
                _held.append(new)
    return node


def _made(op: str, a: Dim, b: Dim) -> SymExpr | None:
    """The irreducible ``op(a, b)`` when it was made before: its rules (a function of the
    operands) would find it irreducible again."""
    return _interned.get((op, a, b))


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Keep every expression made until the outermost ``held`` ends (``tilework.build`` holds
    its compile: the passes' questions about an expression are answered once, not again each
    time it is rebuilt). Nests, and may be open in several threads at once."""
    global _held, _holders
    with _intern_lock:
        _holders += 1
        if _held is None:
            _held = []
    try:
        yield
    finally:
        with _intern_lock:
            _holders -= 1
            if _holders == 0:
                _held = None


def _mono_key(m: Mono) -> tuple:
    return tuple(a._sort_key for a in m)


def _term_order(t: tuple[Mono, int]) -> tuple:
    return (-len(t[0]), _mono_key(t[0]))


def _make(terms: tuple[tuple[Mono, int], ...], const: int) -> Dim:
    """The canonical Dim for sorted, nonzero ``terms`` plus ``const``."""
    if not terms:
        return const
    if len(terms) == 1 and const == 0 and terms[0][1] == 1 and len(terms[0][0]) == 1:
        return terms[0][0][0]
    return _intern(("P", terms, const), Poly, terms, const)


def _from_poly(p: PolyDict) -> Dim:
    """The canonical Dim for a polynomial (drops zero coefficients; ``k * (x // k) + x % k``
    becomes ``x``)."""
    terms = [(m, c) for m, c in p.items() if m and c != 0]
    if len(terms) > 1 and any(len(m) == 1 and isinstance(m[0], FloorMod) for m, _ in terms):
        joined = _join_divmod(p)
        if joined is not None:
            return _from_poly(joined)
    if len(terms) > 1:
        terms.sort(key=_term_order)
    return _make(tuple(terms), p.get((), 0))


def _join_divmod(p: PolyDict) -> PolyDict | None:
    """``p`` with one pair ``c * k * (x // k) + c * (x % k)`` (``k`` a literal) replaced by
    ``c * x`` (floor division: ``x == k * (x // k) + x % k`` for every ``x``); None if none."""
    for m, c in p.items():
        if len(m) != 1 or not isinstance(m[0], FloorMod) or not isinstance(m[0].b, int) or c == 0:
            continue
        x, k = m[0].a, m[0].b
        div = _made("//", x, k)
        if not isinstance(div, FloorDiv) or p.get((div,), 0) != c * k:
            continue
        out = dict(p)
        del out[m], out[(div,)]
        for mx, cx in _poly(x).items():
            out[mx] = out.get(mx, 0) + c * cx
        return out
    return None


def _terms(x: SymExpr) -> tuple[tuple[tuple[Mono, int], ...], int]:
    if isinstance(x, Poly):
        return x.terms, x.const
    assert isinstance(x, Atom)  # a SymExpr is a Poly or an Atom
    return (((x,), 1),), 0


def _poly(x: Dim) -> PolyDict:
    """``x`` (already checked) as a fresh polynomial dict."""
    if isinstance(x, int):
        return {(): x} if x else {}
    if isinstance(x, Poly):
        d: PolyDict = dict(x.terms)
        if x.const:
            d[()] = x.const
        return d
    assert isinstance(x, Atom)
    return {(x,): 1}


def _check(x: object) -> Dim:
    """``x`` as a Dim: a SymExpr, or a plain int (int-like values are converted; bools,
    floats and everything else are rejected)."""
    if type(x) is int or isinstance(x, SymExpr):
        return x
    return _as_int(x, "symbolic dim arithmetic")


def _rebuild_poly(terms: tuple[tuple[Mono, int], ...], const: int) -> Dim:
    return _from_poly({**dict(terms), (): const})


# -- arithmetic ---------------------------------------------------------------------------


def add(a: Dim, b: Dim) -> Dim:
    """``a + b``, canonical."""
    if type(a) is int:
        if type(b) is int:
            return a + b
        a, b = b, a
    if type(b) is int and isinstance(a, SymExpr):  # the common ``x + k``: terms stay sorted
        terms, const = _terms(a)
        return _make(terms, const + b)
    p = _poly(_check(a))
    for m, c in _poly(_check(b)).items():
        p[m] = p.get(m, 0) + c
    return _from_poly(p)


def sub(a: Dim, b: Dim) -> Dim:
    """``a - b``, canonical."""
    if type(b) is int:
        return add(a, -b)
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


def _scale(x: SymExpr, k: int) -> Dim:
    if k == 0:
        return 0
    if k == 1:
        return x
    terms, const = _terms(x)
    return _make(tuple((m, c * k) for m, c in terms), const * k)  # order is unchanged


def mul(a: Dim, b: Dim) -> Dim:
    """``a * b``, canonical (products of sums are expanded)."""
    a, b = _check(a), _check(b)
    if isinstance(a, int):
        return a * b if isinstance(b, int) else _scale(b, a)
    if isinstance(b, int):
        return _scale(a, b)
    out: PolyDict = {}
    for ma, ca in _poly(a).items():
        for mb, cb in _poly(b).items():
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


def _split(a: Dim, b: Dim) -> tuple[Dim, Dim] | None:
    """``(q, r)`` with ``a == q * b + r`` for a provably nonzero divisor ``b``, so that
    ``a // b == q + r // b`` and ``a % b == r % b``. For a monomial ``b``, q collects the
    terms of a that it divides; for a sum, only an exact quotient (r == 0) is looked for.
    None when b may be 0 or nothing divides."""
    pb = _poly(b)
    if len(pb) > 1:
        exact = _exact_quotient(_poly(a), pb) if isinstance(a, SymExpr) and prove_ne(b, 0) else None
        return None if exact is None else (_from_poly(exact), 0)
    ((dm, dc),) = pb.items()
    if dm and not prove_ne(b, 0):
        return None
    q: PolyDict = {}
    r: PolyDict = {}
    for m, c in _poly(a).items():
        qm = _mono_div(m, dm)
        if qm is not None and c % dc == 0:
            q[qm] = c // dc
        else:
            r[m] = c
    if not q:
        return None
    return _from_poly(q), _from_poly(r)


def _lead(p: PolyDict) -> tuple[Mono, int]:
    """The leading term of ``p`` in a degree-then-key order (which products respect)."""
    m = max(p, key=lambda m: (len(m), _mono_key(m)))
    return m, p[m]


def _exact_quotient(a: PolyDict, b: PolyDict) -> PolyDict | None:
    """``q`` with ``a == q * b`` found by dividing leading terms, or None (then none exists,
    or it was not found within a few steps)."""
    bm, bc = _lead(b)
    q: PolyDict = {}
    for _ in range(4 * len(a) + 4):
        if not a:
            return q
        am, ac = _lead(a)
        qm = _mono_div(am, bm)
        if qm is None or ac % bc:
            return None
        qc = ac // bc
        q[qm] = q.get(qm, 0) + qc
        a = dict(a)
        for m, c in b.items():  # a -= qc * qm * b
            m = _mono_mul(qm, m)
            a[m] = a.get(m, 0) - qc * c
            if a[m] == 0:
                del a[m]
    return None


def _div_exact(a: SymExpr, g: int) -> Dim:
    return _from_poly({m: c // g for m, c in _poly(a).items()})


def _small_residue(a: Dim, b: Dim) -> bool:
    """``0 <= a < b`` for every assignment in range (so ``a // b == 0`` and ``a % b == a``)."""
    return prove_ge(a, 0) and prove_ge(sub(b, 1), a)


def _negative_lead(b: Dim) -> bool:
    """The divisor's sign is normalized: a negative constant, or a leading coefficient < 0."""
    return b < 0 if isinstance(b, int) else isinstance(b, Poly) and b.terms[0][1] < 0


def floordiv(a: Dim, b: Dim) -> Dim:
    """``a // b`` (floor division), canonical. A literal 0 divisor raises SymbolicError."""
    a, b = _check(a), _check(b)
    known = _made("//", a, b)
    if known is not None:
        return known
    if isinstance(b, int):
        if b == 0:
            raise SymbolicError(f"division by zero in ({to_str(a)}) // 0")
        if isinstance(a, int):
            return a // b
        if b == 1:
            return a
    elif a == 0:
        return 0
    if _negative_lead(b):
        return floordiv(mul(a, -1), mul(b, -1))  # a // b == (-a) // (-b)
    qr = _split(a, b)
    if qr is not None:
        return add(qr[0], floordiv(qr[1], b))
    if isinstance(b, int):
        assert isinstance(a, SymExpr)
        g = math.gcd(b, *_poly(a).values())  # content of a and b
        if g > 1:
            return floordiv(_div_exact(a, g), b // g)  # (g*x) // (g*k) == x // k
    lo, hi = div_bounds(bounds(a), bounds(b))
    if lo is not None and lo == hi:
        return lo
    if isinstance(b, SymExpr) and _small_residue(a, b):
        return 0
    if isinstance(b, SymExpr) and _small_residue(add(a, b), b):
        return -1
    if isinstance(a, FloorDiv) and isinstance(a.b, int) and isinstance(b, int):
        return floordiv(a.a, a.b * b)  # (x // c1) // c2 == x // (c1 * c2) for c1, c2 > 0
    return _intern(("//", a, b), FloorDiv, a, b)


def floormod(a: Dim, b: Dim) -> Dim:
    """``a % b`` (sign of the divisor, as in Python), canonical. A literal 0 divisor raises."""
    a, b = _check(a), _check(b)
    known = _made("%", a, b)
    if known is not None:
        return known
    if isinstance(b, int):
        if b == 0:
            raise SymbolicError(f"modulo by zero in ({to_str(a)}) % 0")
        if isinstance(a, int):
            return a % b
        if b == 1 or b == -1:
            return 0
    elif a == 0:
        return 0
    if _negative_lead(b):
        return mul(floormod(mul(a, -1), mul(b, -1)), -1)  # a % b == -((-a) % (-b))
    qr = _split(a, b)
    if qr is not None:
        return floormod(qr[1], b)
    if isinstance(b, int):
        assert isinstance(a, SymExpr)
        g = math.gcd(b, *_poly(a).values())  # content of a and b
        if g > 1:
            return mul(floormod(_div_exact(a, g), b // g), g)  # (g*x) % (g*k) == g * (x % k)
        lo, hi = bounds(a)
        if lo is not None and hi is not None and lo // b == hi // b:
            return sub(a, lo // b * b)
        if isinstance(a, FloorMod) and isinstance(a.b, int) and a.b % b == 0:
            return floormod(a.a, b)  # (x % (k*c)) % c == x % c
    elif _small_residue(a, b):
        return a
    elif _small_residue(add(a, b), b):
        return add(a, b)
    return _intern(("%", a, b), FloorMod, a, b)


def _minmax(a: Dim, b: Dim, is_min: bool) -> Dim:
    a, b = _check(a), _check(b)
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b) if is_min else max(a, b)
    if _key_of(b) < _key_of(a):  # order first, so the result does not depend on argument order
        a, b = b, a
    known = _made("min" if is_min else "max", a, b)
    if known is not None:
        return known
    if a is b or (prove_le(a, b) if is_min else prove_ge(a, b)):
        return a
    if prove_le(b, a) if is_min else prove_ge(b, a):
        return b
    return _intern(("min" if is_min else "max", a, b), Min if is_min else Max, a, b)


def min_(a: Dim, b: Dim) -> Dim:
    """``min(a, b)``: the smaller one when that is provable, else a canonical Min term."""
    return _minmax(a, b, True)


def max_(a: Dim, b: Dim) -> Dim:
    """``max(a, b)``: the larger one when that is provable, else a canonical Max term."""
    return _minmax(a, b, False)


def ceildiv(a: Dim, b: Dim) -> Dim:
    """``ceil(a / b)`` for positive ``b``, written with floor division."""
    return floordiv(add(a, sub(b, 1)), b)


_OPS: dict[str, Callable[[Dim, Dim], Dim]] = {"//": floordiv, "%": floormod, "min": min_, "max": max_}

# -- provers ------------------------------------------------------------------------------


def _expand_mods(e: Dim) -> Dim:
    """Rewrite every ``a % b`` as ``a - b * (a // b)``, which lets cancellations show."""
    if isinstance(e, int) or isinstance(e, SymVar):
        return e
    r = e._expd
    if r is None:
        if isinstance(e, FloorMod):
            a, b = _expand_mods(e.a), _expand_mods(e.b)
            r = sub(a, mul(b, floordiv(a, b)))
        else:
            r = substitute_atoms(e, _expand_mods)
        e._expd = ITSELF if r is e else r
        return r
    return e if r is ITSELF else r  # type: ignore[return-value]


def _div_lower(d: Dim) -> int | None:
    """A lower bound of ``d`` found by relaxing lone terms ``k * (x // c)`` (constant ``c > 0``)
    with ``x - c + 1 <= c * (x // c) <= x``, on the side that bounds them below. Relaxing one
    term at a time keeps cancellations that relaxing all of them would lose, so both are tried."""
    if not isinstance(d, Poly):
        return None
    divs: dict[FloorDiv, int] = {}  # each lone term's ``x // c`` and its constant ``c``
    for m, _ in d.terms:
        t = m[0] if len(m) == 1 else None
        if isinstance(t, FloorDiv) and isinstance(t.b, int):
            divs[t] = t.b
    best: int | None = None
    for chosen in [{q} for q in divs] + ([set(divs)] if len(divs) > 1 else []):
        s = math.lcm(*(divs[q] for q in chosen))
        acc: Dim = s * d.const
        for m, k in d.terms:
            q = m[0]
            if len(m) == 1 and isinstance(q, FloorDiv) and q in chosen:
                c = divs[q]
                acc = add(acc, mul(q.a if k < 0 else sub(q.a, c - 1), s // c * k))
            else:
                acc = add(acc, mul(_from_poly({m: k}), s))
        lo = bounds(acc)[0]
        if lo is not None and (best is None or -(-lo // s) > best):
            best = -(-lo // s)
    return best


def _nonneg(d: Dim) -> bool:
    """True when ``d >= 0`` is proved for every assignment in range (memoized on the node:
    ``min_`` and ``max_`` ask it of the same differences again and again)."""
    if isinstance(d, int):
        return d >= 0
    known = d._nn
    if known is None:
        known = d._nn = _prove_nonneg(d)
    return known


def _prove_nonneg(d: SymExpr) -> bool:
    expanded = _expand_mods(d)
    for x in (d, expanded) if expanded is not d else (d,):
        if isinstance(x, int):
            return x >= 0
        lo = bounds(x)[0]
        if lo is not None and lo >= 0:
            return True
        lo = _div_lower(x)
        if lo is not None and lo >= 0:
            return True
    return False


def prove_ge(a: Dim, b: Dim = 0) -> bool:
    """True when ``a >= b`` holds for every assignment in range (False means: not proved)."""
    return _nonneg(sub(a, b))


def prove_le(a: Dim, b: Dim = 0) -> bool:
    """True when ``a <= b`` holds for every assignment in range."""
    return _nonneg(sub(b, a))


def prove_eq(a: Dim, b: Dim) -> bool:
    """True when ``a == b`` for every assignment in range."""
    if a is b:
        return True
    d = sub(a, b)
    if isinstance(d, int):
        return d == 0
    return _nonneg(d) and _nonneg(mul(d, -1))


def prove_dims_eq(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    """True when ``a`` and ``b`` (shapes, or shape values) have one length and are equal dim by
    dim for every assignment in range."""
    return len(a) == len(b) and all(prove_eq(x, y) for x, y in zip(a, b))


def prove_ne(a: Dim, b: Dim) -> bool:
    """True when ``a != b`` for every assignment in range (a provable mismatch)."""
    d = sub(a, b)
    if isinstance(d, int):
        return d != 0
    lo, hi = bounds(d)
    if (lo is not None and lo > 0) or (hi is not None and hi < 0):
        return True
    if isinstance(d, Poly):  # every term is a multiple of g, the constant is not: d is never 0
        return d.const % math.gcd(*(c for _, c in d.terms)) != 0
    return False


# -- traversal ----------------------------------------------------------------------------


def substitute_atoms(e: Dim, f: Callable[[Dim], Dim]) -> Dim:
    """Rebuild ``e`` with ``f`` applied to the children of each compound atom and each
    monomial factor."""
    if isinstance(e, int) or isinstance(e, SymVar):
        return e
    if isinstance(e, _Binary):
        return _OPS[e.OP](f(e.a), f(e.b))
    assert isinstance(e, Poly)
    acc: Dim = e.const
    for m, c in e.terms:
        t: Dim = c
        for a in m:
            t = mul(t, f(a))
        acc = add(acc, t)
    return acc


def is_static(dims: Iterable[Dim]) -> bool:
    """True when every dim is a known int."""
    return all(isinstance(d, int) for d in dims)


def product(dims: Iterable[Dim]) -> Dim:
    """The canonical product of ``dims`` (1 for none)."""
    acc: Dim = 1
    for d in dims:
        acc = mul(acc, d)
    return acc


# -- interval bounds -------------------------------------------------------------------------
# ``bounds(e)`` is sound, not always tight, and cached on each node: vars contribute their
# declared range, polynomials are bounded term by term (and again with every term shifted by
# its lower bound, which keeps ``n*m - n >= 0``), and ``//``, ``%``, ``min``, ``max`` follow the
# rules of ``tilework.ir.interval``.


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
        widths = [w for w in (width[a] for a in k) if w is not None]  # None: unbounded
        top = 0 if 0 in widths else (None if len(widths) < len(k) else math.prod(widths))
        acc = iadd(acc, imul((0, top), (v, v)))
    return acc


def _poly_bounds(e: Poly) -> Bound:
    acc: Bound = (e.const, e.const)
    exact = True  # all coefficients > 0 and all atoms >= 0: the shifted form adds nothing
    for m, c in e.terms:
        mb: Bound = (1, 1)
        for atom in m:
            ab = bounds(atom)
            exact = exact and ab[0] is not None and ab[0] >= 0
            mb = imul(mb, ab)
        exact = exact and c > 0
        acc = iadd(acc, imul(mb, (c, c)))
    return acc if exact else meet(acc, _shifted_bounds(e))


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
        bnd = ATOM_BOUNDS[e.OP](bounds(e.a), bounds(e.b))
    e._bnd = bnd
    return bnd
