"""Parsing pieces used at every level: call-style argument lists, struct info, dtypes, dims,
attribute values, literals and sym var declarations."""

from __future__ import annotations

from typing import Any, Callable

from tilework.errors import SymbolicError
from tilework.ir.graph import Attrs
from tilework.ir.dtype import DTYPES
from tilework.ir.info import AnyInfo, FuncInfo, PrimInfo, ShapeInfo, StructInfo, TensorInfo, TupleInfo
from tilework.ir.sym import Dim, SymVar
from tilework.text.cursor import Cursor, Scope
from tilework.text.parse_scalar import ScalarParser, signed_literal

INFO_NAMES = ("Any", "Prim", "Shape", "Tensor", "Tuple", "Func")

ArgSpec = list[tuple[str, Callable[[], Any]]]


def call_args(cur: Cursor, spec: ArgSpec, what: str) -> dict[str, Any]:
    """``(a, b, key=c)`` after the callee: positional args bind to ``spec`` in order, keyword
    args by name; returns the values given, by parameter name."""
    cur.expect("(", f"after {what}")
    out: dict[str, Any] = {}
    names = [n for n, _ in spec]
    parsers = dict(spec)
    positional = 0
    seen_kw = False
    while not cur.at(")"):
        if cur.at_kind("name") and cur.at("=", 1):
            key = cur.next()
            cur.next()
            if key.value not in parsers:
                raise cur.error(f"{what} has no argument '{key.value}' (it takes {', '.join(names) or 'none'})", key)
            if key.value in out:
                raise cur.error(f"argument '{key.value}' is given twice", key)
            out[key.value] = parsers[key.value]()
            seen_kw = True
        else:
            if seen_kw:
                raise cur.error("positional argument after a keyword argument")
            if positional >= len(spec):
                raise cur.error(f"too many arguments to {what} (it takes {', '.join(names) or 'none'})")
            name, parser = spec[positional]
            out[name] = parser()
            positional += 1
        if not cur.accept(","):
            break
    cur.expect(")", f"after the arguments of {what}")
    return out


class Common:
    """Parsers for the pieces of text that any function can hold, given its scope."""

    def __init__(self, cur: Cursor, scope: Scope) -> None:
        self.cur = cur
        self.scope = scope
        self.scalars = ScalarParser(cur, scope)

    def dim(self) -> Dim:
        return self.scalars.dim()

    def dims(self, what: str = "a shape") -> tuple[Dim, ...]:
        """``(a, b)`` or ``[a, b]`` (a single dim in parentheses counts as one element)."""
        cur = self.cur
        close = {"(": ")", "[": "]"}.get(cur.peek().value if cur.at_kind("op") else "")
        if close is None:
            raise cur.error(f"expected {what} like (n, 4), found {cur.peek().describe()}")
        cur.next()
        out: list[Dim] = []
        while not cur.at(close):
            out.append(self.dim())
            if not cur.accept(","):
                break
        cur.expect(close, f"after the dims of {what}")
        return tuple(out)

    def dims_or_none(self) -> tuple[Dim, ...] | None:
        if self.cur.accept("None"):
            return None
        return self.dims()

    def dtype(self) -> str:
        tok = self.cur.next()
        if tok.kind == "name" and tok.value in DTYPES:
            return tok.value
        if tok.kind != "str":
            raise self.cur.error(f"expected a dtype string like \"float32\", found {tok.describe()}", tok)
        if tok.value not in DTYPES:
            raise self.cur.error(f"unknown dtype '{tok.value}'", tok)
        return tok.value

    def dtype_or_none(self) -> str | None:
        if self.cur.accept("None"):
            return None
        return self.dtype()

    def int_lit(self) -> int:
        tok = self.cur.peek()
        v = signed_literal(self.cur)
        if type(v) is not int:
            raise self.cur.error("expected an integer", tok)
        return v

    def int_or_none(self) -> int | None:
        if self.cur.accept("None"):
            return None
        return self.int_lit()

    def bool_lit(self) -> bool:
        tok = self.cur.next()
        if tok.kind == "name" and tok.value in ("True", "False"):
            return tok.value == "True"
        raise self.cur.error(f"expected True or False, found {tok.describe()}", tok)

    def string(self) -> str:
        return self.cur.expect_kind("str", "a string").value

    # -- struct info ----------------------------------------------------------------------

    def at_info(self) -> bool:
        return self.cur.at_kind("name") and self.cur.peek().value in INFO_NAMES and (self.cur.at("(", 1) or self.cur.peek().value == "Any")

    def info(self) -> StructInfo:
        cur = self.cur
        tok = cur.peek()
        if tok.kind != "name" or tok.value not in INFO_NAMES:
            raise cur.error(f"expected struct info ({', '.join(INFO_NAMES)}), found {tok.describe()}")
        cur.next()
        kind = tok.value
        if kind == "Any":
            return AnyInfo()
        if kind == "Tuple":
            cur.expect("(", "after Tuple")
            fields: list[StructInfo] = []
            while not cur.at(")"):
                fields.append(self.info())
                if not cur.accept(","):
                    break
            cur.expect(")", "after the fields of Tuple")
            return TupleInfo(tuple(fields))
        if kind == "Prim":
            a = call_args(cur, [("dtype", self.dtype_or_none), ("value", self.dim)], "Prim")
            return PrimInfo(a.get("dtype", "int64"), a.get("value"))
        if kind == "Shape":
            a = call_args(cur, [("values", self.dims), ("ndim", self.int_lit)], "Shape")
            values = a.get("values")
            return ShapeInfo(values, len(values) if values is not None else a.get("ndim", -1))
        if kind == "Tensor":
            spec = [("shape", self.dims_or_none), ("dtype", self.dtype_or_none), ("ndim", self.int_lit)]
            a = call_args(cur, spec, "Tensor")
            shape = a.get("shape")
            if shape is not None and a.get("ndim", len(shape)) != len(shape):
                raise cur.error(f"Tensor: ndim={a['ndim']} disagrees with a shape of {len(shape)} dims", tok)
            return TensorInfo(shape, a.get("dtype"), len(shape) if shape is not None else a.get("ndim", -1))
        a = call_args(cur, [("params", self.info_list_or_none), ("ret", self.info), ("pure", self.bool_lit)], "Func")
        return FuncInfo(a.get("params"), a.get("ret", AnyInfo()), a.get("pure", True))

    def info_list(self) -> list[StructInfo]:
        self.cur.expect("[", "to start a list of struct info")
        out: list[StructInfo] = []
        while not self.cur.at("]"):
            out.append(self.info())
            if not self.cur.accept(","):
                break
        self.cur.expect("]", "after the list of struct info")
        return out

    def info_list_or_none(self) -> tuple[StructInfo, ...] | None:
        if self.cur.accept("None"):
            return None
        return tuple(self.info_list())

    # -- attribute values -----------------------------------------------------------------

    def attrs_dict(self) -> Attrs:
        cur = self.cur
        cur.expect("{", "to start a dict of attributes")
        items: dict[str, Any] = {}
        while not cur.at("}"):
            key = cur.expect_kind("str", "an attribute name string")
            if key.value in items:
                raise cur.error(f"attribute '{key.value}' is given twice", key)
            cur.expect(":", "after the attribute name")
            items[key.value] = self.attr_value()
            if not cur.accept(","):
                break
        cur.expect("}", "after the attributes")
        return Attrs(items)

    def attr_value(self) -> Any:
        """None, bools, strings, floats, dims, [lists] (tuples), {dicts} (Attrs), struct info."""
        cur = self.cur
        tok = cur.peek()
        if tok.kind == "str":
            return cur.next().value
        if tok.kind == "name" and tok.value in ("None", "True", "False"):
            cur.next()
            return None if tok.value == "None" else tok.value == "True"
        if self._at_float():
            return float(signed_literal(cur))
        if cur.at("["):
            cur.next()
            out = []
            while not cur.at("]"):
                out.append(self.attr_value())
                if not cur.accept(","):
                    break
            cur.expect("]", "after the list")
            return tuple(out)
        if cur.at("{"):
            return self.attrs_dict()
        if self.at_info():
            return self.info()
        if cur.at("(") and self._paren_is_tuple():
            cur.next()
            items = []
            while not cur.at(")"):
                items.append(self.attr_value())
                if not cur.accept(","):
                    break
            cur.expect(")", "after the tuple")
            return tuple(items)
        return self.dim()

    def _at_float(self) -> bool:
        k = 1 if self.cur.at("-") else 0
        tok = self.cur.peek(k)
        return tok.kind == "float" or (tok.kind == "name" and tok.value in ("inf", "nan"))

    def _paren_is_tuple(self) -> bool:
        """Whether the parenthesis at the cursor holds a comma at its own level (or is empty)."""
        depth = 0
        i = 0
        while True:
            tok = self.cur.peek(i)
            if tok.kind == "eof":
                return False
            if tok.kind == "op" and tok.value in "([{":
                depth += 1
            elif tok.kind == "op" and tok.value in ")]}":
                depth -= 1
                if depth == 0:
                    return i == 1
            elif depth == 1 and tok.kind == "op" and tok.value == ",":
                return True
            i += 1

    # -- literals and declarations ----------------------------------------------------------

    def nested_literal(self) -> Any:
        """A number, bool, or nested list of them (a constant's values)."""
        if self.cur.accept("["):
            out = []
            while not self.cur.at("]"):
                out.append(self.nested_literal())
                if not self.cur.accept(","):
                    break
            self.cur.expect("]", "after the list of values")
            return out
        return signed_literal(self.cur)

    def at_sym_decl(self) -> bool:
        return self.cur.at_kind("name") and self.cur.at("=", 1) and self.cur.at("sym", 2) and self.cur.at("(", 3)

    def sym_decl(self) -> None:
        """``n = sym(lo=1, hi=4096)``: declares a sym var (lo defaults to 0, hi to none)."""
        name = self.cur.next()
        self.cur.next()
        sym_tok = self.cur.next()
        a = call_args(self.cur, [("lo", self.int_lit), ("hi", self.int_or_none)], "sym")
        try:
            v = SymVar(name.value, a.get("lo", 0), a.get("hi"))
        except SymbolicError as e:
            raise self.cur.error(str(e), sym_tok) from None
        self.scope.declare_sym(self.cur, name, v)
        self.cur.expect_newline("after the declaration")

    def sym_decls(self) -> None:
        while self.at_sym_decl():
            self.sym_decl()

