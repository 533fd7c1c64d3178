"""torch.export's symbolic sizes as tilework dims.

torch.export describes every dynamic size as a sympy expression over its own symbols (``s0``,
``s77``) and bounds those symbols in ``ExportedProgram.range_constraints``. ``SymbolTable``
gives each symbol one ``SymVar`` (named by ``dim_names`` or after the symbol) carrying those
bounds, possibly narrowed by ``dim_bounds``, and rewrites expressions over them (``s0 * 2``,
``s0 + 1``, ``(s0 // 2)``, ``Max(1, s0)``) into canonical ``Dim``s.
"""

from __future__ import annotations

import re
from fractions import Fraction

from typing import Any, Callable, Mapping

from tilework.errors import UnsupportedError
from tilework.ir import sym
from tilework.ir.sym import Dim, SymVar

Bounds = tuple[int | None, int | None]  # (lo, hi); None keeps the exported bound


def _finite_int(v: Any) -> int | None:
    """``v`` as an int, or None for an infinite (or non-integer) bound."""
    try:
        if not bool(getattr(v, "is_finite", True)):
            return None
        return int(v)
    except (TypeError, ValueError, OverflowError, AttributeError):  # torch's int_oo: no number
        return None


def _fold(op: Callable[[Dim, Dim], Dim], args: list[Dim]) -> Dim:
    out = args[0]
    for a in args[1:]:
        out = op(out, a)
    return out


def _pow(base: Dim, exp: Dim) -> Dim:
    if not isinstance(exp, int) or exp < 0:
        raise UnsupportedError(f"symbolic size with a non-constant or negative power: {sym.to_str(base)} ** {exp}")
    out: Dim = 1
    for _ in range(exp):
        out = sym.mul(out, base)
    return out


def _modular_indexing(args: list[Dim]) -> Dim:
    base, divisor, modulus = args
    return sym.floormod(sym.floordiv(base, divisor), modulus)


_FUNCTIONS: dict[str, Callable[[list[Dim]], Dim]] = {
    "Add": lambda a: _fold(sym.add, a),
    "Mul": lambda a: _fold(sym.mul, a),
    "Pow": lambda a: _pow(a[0], a[1]),
    "FloorDiv": lambda a: sym.floordiv(a[0], a[1]),
    "CleanDiv": lambda a: sym.floordiv(a[0], a[1]),
    "IntTrueDiv": lambda a: sym.floordiv(a[0], a[1]),
    "CeilDiv": lambda a: sym.ceildiv(a[0], a[1]),
    "Mod": lambda a: sym.floormod(a[0], a[1]),
    "PythonMod": lambda a: sym.floormod(a[0], a[1]),
    "ModularIndexing": _modular_indexing,
    "Max": lambda a: _fold(sym.max_, a),
    "Min": lambda a: _fold(sym.min_, a),
}


class SymbolTable:
    """torch symbols -> SymVars, and sympy size expressions -> Dims."""

    def __init__(self, range_constraints: Mapping[Any, Any], dim_names: Mapping[str, str] | None = None, dim_bounds: Mapping[str, Bounds] | None = None) -> None:
        self._ranges = {str(k): v for k, v in range_constraints.items()}
        self._names = dict(dim_names or {})
        self._bounds = dict(dim_bounds or {})
        self.vars: dict[str, SymVar] = {}
        self.solved: dict[str, Dim] = {}  # symbols only seen inside input sizes, as dims
        unknown = sorted(set(self._bounds) - set(self._ranges))
        if unknown:
            have = ", ".join(f"{s} ({self._names[s]})" if s in self._names else s for s in sorted(self._ranges)) or "none"
            raise UnsupportedError(f"no dynamic dim {', '.join(unknown)} in the exported program (its dynamic dims: {have})")

    def var(self, symbol: str) -> SymVar:
        """The SymVar of a torch symbol, created on first use with its bounds."""
        v = self.vars.get(symbol)
        if v is not None:
            return v
        lo, hi = self._exported_range(symbol)
        want_lo, want_hi = self._bounds.get(symbol, (None, None))
        name = self._names.get(symbol, symbol)
        if want_lo is not None:
            if want_lo < lo:
                raise UnsupportedError(f"dim {name}: lower bound {want_lo} is below the exported lower bound {lo}; the program was exported for {name} >= {lo}")
            lo = want_lo
        if want_hi is not None:
            if hi is not None and want_hi > hi:
                raise UnsupportedError(f"dim {name}: upper bound {want_hi} is above the exported upper bound {hi}; the program was exported for {name} <= {hi}")
            hi = want_hi
        if hi is not None and hi < lo:
            raise UnsupportedError(f"dim {name}: empty range [{lo}, {hi}]")
        v = SymVar(name if name.isidentifier() else f"d_{symbol}", lo, hi)
        self.vars[symbol] = v
        return v

    def solve_linear(self, expr: Any, name: str) -> SymVar | None:
        """For an input size ``a * s + b`` over a symbol ``s`` that no input has as a bare size,
        a new var ``d`` for the size itself, with ``s`` becoming ``(d - b) // a`` everywhere
        (a caller asserts ``d == a * s + b`` once). None when ``expr`` is not of that form."""
        node = getattr(expr, "node", None)
        expr = node.expr if node is not None and hasattr(node, "expr") else expr
        symbols: set[Any] = set(getattr(expr, "free_symbols", ()))
        if len(symbols) != 1:
            return None
        (s,) = symbols
        poly = expr.as_poly(s) if hasattr(expr, "as_poly") else None
        if poly is None or poly.degree() != 1:
            return None
        a, b = (int(c) for c in poly.all_coeffs())
        if a <= 0 or str(s) in self.solved or str(s) in self.vars:
            return None
        lo, hi = self._exported_range(str(s))
        d = SymVar(name, a * lo + b, None if hi is None else a * hi + b)
        self.solved[str(s)] = sym.floordiv(sym.sub(d, b), a)
        return d

    def _exported_range(self, symbol: str) -> tuple[int, int | None]:
        vr = self._ranges.get(symbol)
        if vr is None:  # an unbacked size (data-dependent): only known to be >= 0
            return 0, None
        lo = _finite_int(vr.lower)
        return (0 if lo is None else max(lo, 0)), _finite_int(vr.upper)

    def dim(self, expr: Any) -> Dim:
        """A torch size (an int, a ``torch.SymInt`` or a sympy expression) as a Dim."""
        node = getattr(expr, "node", None)
        if node is not None and hasattr(node, "expr"):  # torch.SymInt
            expr = node.expr
        if isinstance(expr, bool):
            raise UnsupportedError(f"expected a size, got the bool {expr}")
        if isinstance(expr, int):
            return expr
        return self._sympy(expr)

    def _sympy(self, e: Any) -> Dim:
        if getattr(e, "is_Integer", False):
            return int(e)
        if getattr(e, "is_Symbol", False):
            name = str(e)
            return self.solved[name] if name in self.solved else self.var(name)
        kind = type(e).__name__
        if kind in ("TruncToInt", "FloorToInt", "CeilToInt"):  # a size scaled by a float factor
            return self._scaled(e, kind)
        fn = _FUNCTIONS.get(kind)
        if fn is None:
            raise UnsupportedError(f"symbolic size {e} uses {kind}, which tilework cannot express as a dim")
        if kind == "Mul" and any(getattr(a, "is_Rational", False) and not getattr(a, "is_Integer", False) for a in e.args):
            raise UnsupportedError(f"symbolic size {e} has a fractional coefficient")
        return fn([self._sympy(a) for a in e.args])

    def _scaled(self, e: Any, kind: str) -> Dim:
        """``trunc``/``floor``/``ceil`` of ``c * ToFloat(size)`` (what ``interpolate`` with a
        scale factor gives) for a factor ``c`` that is a fraction with a small denominator."""
        (arg,) = e.args
        factor = Fraction(1)
        if type(arg).__name__ == "Mul" and len(arg.args) == 2:
            c, arg = (arg.args if getattr(arg.args[0], "is_Number", False) else (arg.args[1], arg.args[0]))
            factor = Fraction(float(c)).limit_denominator(1024)
            if not getattr(c, "is_Number", False) or float(factor) != float(c) or factor < 0:
                raise UnsupportedError(f"symbolic size {e} scales by {c}, which is no small fraction")
        if type(arg).__name__ != "ToFloat":
            raise UnsupportedError(f"symbolic size {e} uses {kind} of {arg}, which tilework cannot express as a dim")
        scaled = sym.mul(self._sympy(arg.args[0]), factor.numerator)  # non-negative: trunc is floor
        if kind == "CeilToInt":
            return sym.ceildiv(scaled, factor.denominator)
        return sym.floordiv(scaled, factor.denominator)


def parse_dim_spec(spec: str) -> tuple[str, str | None, Bounds]:
    """``[NEW=]REF[<=HI]``, ``REF>=LO`` or ``LO<=REF<=HI`` as ``(REF, NEW, (lo, hi))``.

    ``REF`` names a dynamic dim: a torch symbol (``s53``) or ``INPUT.AXIS`` (``input_ids.1``);
    ``NEW`` renames it. Spaces may stand around ``=``, ``<=`` and ``>=``, not inside a name."""
    text = re.sub(r"\s*([<>]?=)\s*", r"\1", spec.strip())
    spaced = re.search(r"[^<>=]*\s[^<>=]*", text)
    if spaced:
        raise UnsupportedError(f"cannot read dim spec {spec!r}: {spaced.group()!r} has a space in it; a name or bound is one word")
    new: str | None = None
    if "=" in text.split("<")[0].split(">")[0] and not text.startswith(("<", ">")):
        head, _, text = text.partition("=")
        if "<" in head or ">" in head or not head:
            raise UnsupportedError(f"cannot read dim spec {spec!r}")
        new = head
    lo: int | None = None
    hi: int | None = None
    parts = text.split("<=")
    try:
        if len(parts) == 3:
            lo, ref, hi = int(parts[0]), parts[1], int(parts[2])
        elif len(parts) == 2:
            ref, hi = parts[0], int(parts[1])
        elif ">=" in text:
            ref, lo_text = text.split(">=", 1)
            lo = int(lo_text)
        else:
            ref = text
    except ValueError:
        raise UnsupportedError(f"cannot read dim spec {spec!r}: bounds must be integers (e.g. seq<=512, 1<=seq<=512, seq>=2)") from None
    if not ref:
        raise UnsupportedError(f"cannot read dim spec {spec!r}: no dim named")
    return ref, new, (lo, hi)


__all__ = ["SymbolTable", "Bounds", "parse_dim_spec"]
