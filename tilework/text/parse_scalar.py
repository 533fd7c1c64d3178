"""Scalar expressions with Python precedence: symbolic dims everywhere, and in TensorFuncs
also loads, typed constants, casts, selects and intrinsics.

Arithmetic on two index values (ints, sym vars) folds through ``sym`` and stays canonical;
as soon as an operand is a loop-level expression the result is a ``Binary`` whose dtype is
that of its first such operand (``bool`` for comparisons and logic).
"""

from __future__ import annotations

import difflib
from typing import Callable, Sequence

from tilework.errors import SymbolicError
from tilework.ir import sym
from tilework.ir.dtype import DTYPES
from tilework.ir.loop import (
    INTRINSICS,
    Binary,
    Buffer,
    Cast,
    Const,
    Intrin,
    Load,
    Scalar,
    Select,
    Unary,
)
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.text.cursor import Cursor, Scope
from tilework.text.lexer import Token
from tilework.text.print_loop import SYM_FOLDED, binary_dtype, intrin_dtype, is_index, natural_dtype, unary_dtype

_SYM_OPS: dict[str, Callable[[Dim, Dim], Dim]] = {
    "+": sym.add,
    "-": sym.sub,
    "*": sym.mul,
    "//": sym.floordiv,
    "%": sym.floormod,
    "min": sym.min_,
    "max": sym.max_,
}
_CMP = frozenset(("<", "<=", "==", "!=", ">", ">="))
_ADD = frozenset(("+", "-"))
_MUL = frozenset(("*", "/", "//", "%"))
_ENDS = frozenset((",", ")", "]"))  # after a lone int or name, the expression is that atom
_CALL_FORMS = ("cast", "select", "min", "max", "pow", "binary", "unary", "intrin")  # with INTRINSICS, const and the dtypes


def _did_you_mean(name: str, names: Sequence[str]) -> str:
    """``"; did you mean x?"`` for the names close to ``name``, or nothing."""
    close = difflib.get_close_matches(name, names, n=3)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def signed_literal(cur: Cursor) -> int | float | bool:
    """An int, float, ``True``/``False``, ``inf`` or ``nan``, with an optional leading minus."""
    neg = cur.accept("-") is not None
    tok = cur.next()
    value: int | float | bool
    if tok.kind == "int":
        value = int(tok.value)
    elif tok.kind == "float":
        value = float(tok.value)
    elif tok.kind == "name" and tok.value in ("inf", "nan"):
        value = float(tok.value)
    elif tok.kind == "name" and tok.value in ("True", "False") and not neg:
        return tok.value == "True"
    else:
        raise cur.error(f"expected a number, found {tok.describe()}", tok)
    return -value if neg else value


class ScalarParser:
    """Parses scalar / index expressions, resolving names through ``scope``."""

    def __init__(self, cur: Cursor, scope: Scope) -> None:
        self.cur = cur
        self.scope = scope

    def dim(self, what: str = "a symbolic dim") -> Dim:
        tok = self.cur.peek()
        x = self.expr()
        if isinstance(x, (int, SymExpr)):
            return x
        raise self.cur.error(f"expected {what}, found a {x.dtype} expression", tok)

    def expr(self) -> Scalar:
        cur = self.cur
        tok = cur.toks[cur.pos]
        if tok.kind != "eof" and cur.words[cur.pos + 1] in _ENDS and (tok.kind == "int" or (tok.kind == "name" and tok.value != "not")):
            return self.atom()  # most dims and indices: the precedence levels would find nothing to combine
        a = self._and()
        while self.cur.word() == "or":
            self.cur.next()
            b = self._and()
            a = Binary("or", a, b, "bool")
        return a

    def _and(self) -> Scalar:
        a = self._not()
        while self.cur.word() == "and":
            self.cur.next()
            b = self._not()
            a = Binary("and", a, b, "bool")
        return a

    def _not(self) -> Scalar:
        if self.cur.word() == "not":
            self.cur.next()
            a = self._not()
            return Unary("not", a, unary_dtype("not", a))
        return self._cmp()

    def _cmp(self) -> Scalar:
        a = self._arith()
        if self.cur.word() in _CMP:
            tok = self.cur.next()
            b = self._arith()
            if self.cur.word() in _CMP:
                raise self.cur.error("comparisons do not chain here; add parentheses")
            return Binary(tok.value, a, b, "bool")
        return a

    def _arith(self) -> Scalar:
        a = self._term()
        while self.cur.word() in _ADD:
            tok = self.cur.next()
            a = self.combine(tok, a, self._term())
        return a

    def _term(self) -> Scalar:
        a = self._unary()
        while self.cur.word() in _MUL:
            tok = self.cur.next()
            a = self.combine(tok, a, self._unary())
        return a

    def _unary(self) -> Scalar:
        if self.cur.word() != "-":
            return self.atom()
        self.cur.next()
        a = self._unary()
        if is_index(a):
            return sym.mul(a, -1)
        return Unary("neg", a, unary_dtype("neg", a))

    def combine(self, tok: Token, a: Scalar, b: Scalar) -> Scalar:
        op = tok.value
        if op in SYM_FOLDED and is_index(a) and is_index(b):
            try:
                return _SYM_OPS[op](a, b)
            except SymbolicError as e:
                raise self.cur.error(str(e), tok) from None
        return Binary(op, a, b, binary_dtype(op, a, b))

    # -- atoms ----------------------------------------------------------------------------

    def atom(self) -> Scalar:
        cur = self.cur
        tok = cur.peek()
        if tok.kind == "int":
            cur.next()
            return int(tok.value)
        if cur.accept("("):
            x = self.expr()
            cur.expect(")", "to close the parenthesis")
            return x
        if tok.kind != "name":
            raise cur.error(f"expected an expression, found {tok.describe()}")
        name = tok.value
        if cur.at("(", 1):
            special = self._call_form(tok)
            if special is not None:
                return special
        obj = self.scope.lookup(name)
        if isinstance(obj, SymVar):
            cur.next()
            return obj
        if isinstance(obj, Buffer):
            cur.next()
            return Load(obj, self.indices(tok))
        if obj is not None:
            raise cur.error(f"'{name}' is not a symbolic dim or a buffer here", tok)
        raise cur.error(self._undefined(name), tok)

    def _undefined(self, name: str) -> str:
        """What an undefined ``name`` was meant to be, by its use: a buffer (``z[...]``), a
        function (``sqrtt(...)``) or else a symbolic dim or loop var."""
        visible = self.scope.visible()
        if self.cur.at("[", 1):
            buffers = [n for n, v in visible.items() if isinstance(v, Buffer)]
            return f"undefined name '{name}': no buffer '{name}'; its buffers: {', '.join(buffers) or 'none'}{_did_you_mean(name, buffers)}"
        if self.cur.at("(", 1):
            functions = sorted({*INTRINSICS, *_CALL_FORMS, "const", *DTYPES})
            return f"undefined name '{name}': unknown function '{name}'{_did_you_mean(name, functions)}"
        dims = [n for n, v in visible.items() if isinstance(v, SymVar)]
        close = _did_you_mean(name, dims)
        return f"undefined name '{name}'{close}{' Or' if close else ';'} declare a symbolic dim at the start of the function: {name} = sym()"

    def indices(self, buf_tok: Token) -> tuple[Scalar, ...]:
        cur = self.cur
        cur.expect("[", f"after buffer '{buf_tok.value}'")
        if cur.at("(") and cur.at(")", 1):
            cur.next()
            cur.next()
            cur.expect("]", "after the empty index '()'")
            return ()
        out = [self.expr()]
        while cur.accept(","):
            out.append(self.expr())
        cur.expect("]", "after the indices")
        return tuple(out)

    def _args(self, what: str) -> tuple[list[Scalar | Token], dict[str, Token]]:
        """``(a, b, ..., dtype="x")``: positional args (scalars and strings) and string keyword args."""
        cur = self.cur
        cur.expect("(", f"after {what}")
        args: list[Scalar | Token] = []
        kws: dict[str, Token] = {}
        while not cur.at(")"):
            if cur.at_kind("name") and cur.at("=", 1):
                key = cur.next()
                cur.next()
                kws[key.value] = cur.expect_kind("str", f"a string for '{key.value}'")
            elif cur.at_kind("str"):
                args.append(cur.next())
            else:
                args.append(self.expr())
            if not cur.accept(","):
                break
        cur.expect(")", f"after the arguments of {what}")
        return args, kws

    def _call_form(self, tok: Token) -> Scalar | None:
        """The built-in call forms, or None when ``tok`` is not one of them."""
        cur = self.cur
        name = tok.value
        if name in DTYPES or name == "const":
            cur.next()
            cur.expect("(", f"after {name}")
            value = signed_literal(cur)
            dtype = name
            if name == "const":
                cur.expect(",", "after the constant's value")
                dtype = cur.expect_kind("str", "the constant's dtype").value
            cur.expect(")", "after the constant")
            return Const(value, dtype)
        if name not in _CALL_FORMS and name not in INTRINSICS:
            return None
        if self.scope.lookup(name) is not None:
            return None
        cur.next()
        args, kws = self._args(name)
        unknown = set(kws) - {"dtype"}
        if unknown:
            raise cur.error(f"{name} takes no argument '{unknown.pop()}'", tok)
        return self._build(tok, args, kws["dtype"].value if "dtype" in kws else None)

    def _build(self, tok: Token, args: list[Scalar | Token], dtype: str | None) -> Scalar:
        name = tok.value
        if name in ("binary", "unary", "intrin"):
            return self._build_named(tok, args, dtype)
        if name == "cast":
            self._arity(tok, args, 2)
            to = args[1]
            if not isinstance(to, Token):
                raise self.cur.error('cast needs the dtype as a string: cast(x, "float16")', tok)
            return Cast(to.value, self._values(tok, args[:1])[0])
        vals = self._values(tok, args)
        if name == "select":
            self._arity(tok, vals, 3)
            return Select(vals[0], vals[1], vals[2], dtype or natural_dtype((vals[1], vals[2])))
        if name in ("min", "max", "pow"):
            self._arity(tok, vals, 2)
            if dtype is None:
                return self.combine(tok, vals[0], vals[1])
            return Binary(name, vals[0], vals[1], dtype)
        return Intrin(name, tuple(vals), dtype or intrin_dtype(name, tuple(vals)))

    def _build_named(self, tok: Token, args: list[Scalar | Token], dtype: str | None) -> Scalar:
        """``binary("op", a, b, dtype=...)``, ``unary("op", a, dtype=...)``, ``intrin("name", ...)``."""
        name = tok.value
        head = args[0] if args else None
        if not isinstance(head, Token):
            raise self.cur.error(f"{name} needs the operation name as a string first", tok)
        if name == "intrin":
            vals = self._values(tok, args[1:])
            return Intrin(head.value, tuple(vals), dtype or intrin_dtype(head.value, tuple(vals)))
        if dtype is None:
            raise self.cur.error(f"{name} needs dtype=...", tok)
        vals = self._values(tok, args[1:])
        if name == "binary":
            self._arity(tok, vals, 2)
            return Binary(head.value, vals[0], vals[1], dtype)
        self._arity(tok, vals, 1)
        return Unary(head.value, vals[0], dtype)

    def _values(self, tok: Token, args: list[Scalar | Token]) -> list[Scalar]:
        """``args``, which must all be scalars (no string)."""
        vals = [a for a in args if not isinstance(a, Token)]
        if len(vals) != len(args):
            raise self.cur.error(f"{tok.value} takes no string argument here", tok)
        return vals

    def _arity(self, tok: Token, args: Sequence[object], n: int) -> None:
        if len(args) != n:
            raise self.cur.error(f"{tok.value} takes {n} argument(s), got {len(args)}", tok)

