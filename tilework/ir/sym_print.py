"""Text of symbolic dims in Python syntax (the text parser reads it back).

``tilework.ir.sym`` builds the expressions and re-exports ``to_str`` (its ``repr`` is this
text); this module reads a node's fields rather than importing its classes, so ``sym`` can
import it: an ``OP`` of ``min``/``max`` is a call, ``//``/``%`` an infix term, ``terms`` and
``const`` a polynomial, and anything else a var, printed by ``names``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from tilework.ir.sym import Dim, SymVar

_PREC_ADD, _PREC_MUL, _PREC_ATOM = 1, 2, 3


def _str_prec(e: Dim, names: Callable[[SymVar], str]) -> tuple[str, int]:
    if isinstance(e, int):
        return str(e), (_PREC_ATOM if e >= 0 else _PREC_ADD)
    node: Any = e
    op = getattr(node, "OP", None)
    if op in ("min", "max"):
        return f"{op}({_str(node.a, names)}, {_str(node.b, names)})", _PREC_ATOM
    if op is not None:  # // or %
        a, pa = _str_prec(node.a, names)
        b, pb = _str_prec(node.b, names)
        if pa < _PREC_MUL:
            a = f"({a})"
        if pb <= _PREC_MUL:
            b = f"({b})"
        return f"{a} {op} {b}", _PREC_MUL
    if not hasattr(node, "terms"):
        return names(node), _PREC_ATOM
    parts: list[str] = []
    prec = _PREC_ADD
    for m, c in node.terms:
        printed = [_str_prec(a, names) for a in m]
        if len(m) == 1 and abs(c) == 1:
            body, prec = printed[0]
            if c < 0 and not parts and prec == _PREC_MUL:
                body = f"({body})"  # a leading unary minus binds tighter than // and %
        else:
            factors = [s if p == _PREC_ATOM else f"({s})" for s, p in printed]
            if abs(c) != 1:
                factors.insert(0, str(abs(c)))
            body, prec = " * ".join(factors), _PREC_MUL
        parts.append(("- " if c < 0 else "+ ") + body)
    if node.const:
        parts.append(("- " if node.const < 0 else "+ ") + str(abs(node.const)))
    s = " ".join(parts)
    if len(parts) == 1 and s.startswith("+ "):
        return s[2:], prec
    return (s[2:] if s.startswith("+ ") else "-" + s[2:]), _PREC_ADD


def _str(e: Dim, names: Callable[[SymVar], str]) -> str:
    return _str_prec(e, names)[0]


def to_str(e: Dim, names: Callable[[SymVar], str] | None = None) -> str:
    """Python-syntax text of ``e``; ``names`` renames vars (the printer makes names unique).
    ``eval`` of the text with the vars bound and ``min``/``max`` mapped to ``min_``/``max_``
    rebuilds ``e`` itself."""
    return _str(e, names or (lambda v: v.name))
