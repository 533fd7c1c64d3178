"""The parser: text to an IRModule (see ``tilework.text`` for the syntax).

A module is read in two passes so that functions may call functions defined further down:
the first pass reads the metadata constants, the extern declarations and every function's
signature (its sym var declarations first, since the signature uses them); the second pass
reads the module attrs and the function bodies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Union

from tilework.errors import ParseError
from tilework.ir import info as I
from tilework.ir import sym
from tilework.ir.graph import EMPTY_ATTRS, Attrs, ExternFunc, GraphFunc, Var
from tilework.ir.info import AnyInfo, FuncInfo, StructInfo
from tilework.ir.loop import Buffer, TensorFunc
from tilework.ir.module import Function, IRModule
from tilework.ir.sym import SymVar
from tilework.text.cursor import Cursor, Scope
from tilework.text.lexer import Token, tokenize
from tilework.text.parse_common import Common, call_args
from tilework.text.parse_graph import GraphParser, ModuleCtx, parse_constant
from tilework.text.parse_loop import LoopParser, as_stmt


def parse(text: str) -> IRModule:
    """The IRModule that ``text`` describes; raises ParseError (with line, column and a caret
    under the offending token) when it is not valid."""
    import tilework.op  # noqa: F401  (registers every op)

    if not isinstance(text, str):
        raise ParseError(f"parse expects the text of a module (a str), got {type(text).__name__}")
    if text.startswith("\ufeff"):  # a byte order mark, as some editors write UTF-8
        text = text[1:]
    cur = Cursor(text, tokenize(text))
    try:
        with sym.held():  # an expression the text repeats is simplified (min, max, //, %) once
            return _ModuleParser(cur).run()
    except RecursionError:  # a chain the nesting limits do not bound (- - - ... x)
        raise cur.error("the expression here nests too deeply to parse") from None


@dataclass
class _Header:
    name: str
    kind: str  # "graph" | "tensor"
    scope: Scope
    body_pos: int
    params: list[Union[Var, Buffer, SymVar]]
    ret: StructInfo | None
    deco: dict[str, Any]


class _ModuleParser:
    def __init__(self, cur: Cursor) -> None:
        self.cur = cur
        self.ctx = ModuleCtx()
        self.module_scope = Scope()

    def run(self) -> IRModule:
        cur = self.cur
        items = self._split()
        for kind, pos in items:
            cur.pos = pos
            if kind == "meta":
                self._meta_entry()
            elif kind == "sym":
                Common(cur, self.module_scope).sym_decl()
        funcs: dict[str, ExternFunc | _Header] = {}
        for kind, pos in items:
            cur.pos = pos
            if kind not in ("func", "extern"):
                continue
            item: ExternFunc | _Header
            name, item = self._header(pos) if kind == "func" else self._extern()
            if name in funcs:
                raise cur.error(f"function @{name} is defined twice", cur.toks[pos])
            funcs[name] = item
            self.ctx.globals[name] = _signature(item)
        attrs: Attrs = EMPTY_ATTRS
        seen_attrs = False
        for kind, pos in items:
            cur.pos = pos
            if kind == "attrs":
                if seen_attrs:
                    raise cur.error("module attrs are given twice")
                seen_attrs = True
                attrs = self._attrs()
        out: dict[str, Function] = {}
        for name, item in funcs.items():
            out[name] = self._body(item) if isinstance(item, _Header) else item
        return IRModule(out, attrs)

    # -- top-level items ------------------------------------------------------------------

    def _end_of_statement(self, pos: int) -> int:
        """The position after the statement starting at ``pos`` (and its indented block)."""
        kinds = self.cur.kinds
        while kinds[pos] != "newline" and kinds[pos] != "eof":
            pos += 1
        if kinds[pos] == "newline":
            pos += 1
        if kinds[pos] != "indent":
            return pos
        depth = 0
        while kinds[pos] != "eof":
            if kinds[pos] == "indent":
                depth += 1
            elif kinds[pos] == "dedent":
                depth -= 1
                if depth == 0:
                    return pos + 1
            pos += 1
        return pos

    def _split(self) -> list[tuple[str, int]]:
        cur = self.cur
        items: list[tuple[str, int]] = []
        pos = 0
        while cur.toks[pos].kind != "eof":
            cur.pos = pos
            tok = cur.peek()
            if tok.kind == "global":
                if cur.at("=", 1):
                    kind, end = "extern", self._end_of_statement(pos)
                else:
                    kind, end = "func", self._end_of_statement(self._end_of_statement(pos))
            elif cur.at("def"):
                kind, end = "func", self._end_of_statement(pos)
            elif cur.at("attrs") and cur.at("=", 1):
                kind, end = "attrs", self._end_of_statement(pos)
            elif cur.at("meta") and cur.at("[", 1):
                kind, end = "meta", self._end_of_statement(pos)
            elif tok.kind == "name" and cur.at("=", 1) and cur.at("sym", 2):
                kind, end = "sym", self._end_of_statement(pos)
            elif tok.kind == "indent":
                raise cur.error("unexpected indentation at module level")
            else:
                raise cur.error(
                    "expected a function (@graph def ... / @tensor def ...), an extern declaration "
                    f"(@name = extern(...)), 'attrs = {{...}}' or a 'meta[i] = const(...)' entry, found {tok.describe()}"
                )
            items.append((kind, pos))
            pos = end
        return items

    def _meta_entry(self) -> None:
        cur = self.cur
        cur.next()
        cur.next()
        index = cur.expect_kind("int", "a metadata index")
        cur.expect("]", "after the metadata index")
        cur.expect("=", "after meta[...]")
        cur.expect("const", "in a metadata entry")
        if int(index.value) in self.ctx.meta:
            raise cur.error(f"meta[{index.value}] is given twice", index)
        self.ctx.meta[int(index.value)] = parse_constant(Common(cur, self.module_scope), with_values=False)
        cur.expect_newline("after the metadata entry")

    def _extern(self) -> tuple[str, ExternFunc]:
        cur = self.cur
        name = cur.next()
        cur.next()
        tok = cur.expect("extern", "in an extern declaration")
        c = Common(cur, self.module_scope)
        a = call_args(cur, [("symbol", c.string), ("info", c.info)], "extern")
        if "symbol" not in a:
            raise cur.error("extern needs the symbol name", tok)
        cur.expect_newline("after the extern declaration")
        return name.value, ExternFunc(a["symbol"], a["info"]) if "info" in a else ExternFunc(a["symbol"])

    def _attrs(self) -> Attrs:
        cur = self.cur
        cur.next()
        cur.next()
        attrs = Common(cur, self.module_scope).attrs_dict()
        cur.expect_newline("after the module attrs")
        return attrs

    # -- functions ------------------------------------------------------------------------

    def _header(self, pos: int) -> tuple[str, _Header]:
        cur = self.cur
        deco_tok: Token | None = None
        if cur.at_kind("global"):
            deco_tok = cur.peek()
            if deco_tok.value not in ("graph", "tensor"):
                raise cur.error(f"unknown decorator '@{deco_tok.value}'; expected @graph or @tensor")
            cur.pos = self._end_of_statement(pos)
        kind = deco_tok.value if deco_tok is not None else "graph"
        cur.expect("def", "to start a function")
        name_tok = cur.next()
        if name_tok.kind not in ("name", "str"):
            raise cur.error("expected a function name after 'def'", name_tok)
        params_pos = cur.pos
        body_pos = self._body_start(params_pos)
        scope = Scope()
        c = Common(cur, scope)
        cur.pos = body_pos
        c.sym_decls()
        decls_end = cur.pos
        deco: dict[str, Any] = {}
        if deco_tok is not None:
            cur.pos = pos + 1
            if cur.at("("):
                spec = [("pure", c.bool_lit), ("attrs", c.attrs_dict)] if kind == "graph" else [("num_outputs", c.int_lit), ("attrs", c.attrs_dict)]
                deco = call_args(cur, spec, "@" + kind)
            cur.expect_newline("after the decorator")
        cur.pos = params_pos
        params = self._graph_params(c) if kind == "graph" else self._tensor_params(c)
        ret = None
        if kind == "graph" and cur.accept("->"):
            ret = c.info()
        cur.expect_suite("after the function signature")
        return name_tok.value, _Header(name_tok.value, kind, scope, decls_end, params, ret, deco)

    def _body_start(self, pos: int) -> int:
        """The position after the indent that starts the body of the def at ``pos``."""
        toks = self.cur.toks
        depth = 0
        i = pos
        while toks[i].kind not in ("eof", "newline"):
            t = toks[i]
            if t.kind == "op" and t.value in "([{":
                depth += 1
            elif t.kind == "op" and t.value in ")]}":
                depth -= 1
            elif depth == 0 and t.kind == "op" and t.value == ":" and toks[i + 1].kind == "newline":
                if toks[i + 2].kind != "indent":
                    raise self.cur.error("expected an indented function body", toks[i + 2])
                return i + 3
            i += 1
        raise self.cur.error("expected ':' and an indented body after the function signature", toks[i])

    def _graph_params(self, c: Common) -> list[Union[Var, Buffer, SymVar]]:
        cur = self.cur
        cur.expect("(", "after the function name")
        params: list[Union[Var, Buffer, SymVar]] = []
        while not cur.at(")"):
            name = cur.expect_kind("name", "a parameter name")
            info = c.info() if cur.accept(":") else AnyInfo()
            var = Var(name.value, info)
            c.scope.define(cur, name, var)
            params.append(var)
            if not cur.accept(","):
                break
        cur.expect(")", "after the parameters")
        return params

    def _tensor_params(self, c: Common) -> list[Union[Var, Buffer, SymVar]]:
        cur = self.cur
        cur.expect("(", "after the function name")
        params: list[Union[Var, Buffer, SymVar]] = []
        while not cur.at(")"):
            name = cur.expect_kind("name", "a parameter name")
            cur.expect(":", "after the parameter name (A: Buffer(...) or n: int64)")
            if cur.accept("int64"):
                v = c.scope.declared.get(name.value)
                if v is None:
                    v = SymVar(name.value)
                    c.scope.declare_sym(cur, name, v)
                params.append(v)
            else:
                kind = cur.expect("Buffer", "or 'int64' as the parameter type")
                a = call_args(cur, [("shape", c.dims), ("dtype", c.dtype)], "Buffer")
                if "shape" not in a or "dtype" not in a:
                    raise cur.error("Buffer needs a shape and a dtype", kind)
                buf = Buffer(name.value, a["shape"], a["dtype"])
                c.scope.define(cur, name, buf)
                params.append(buf)
            if not cur.accept(","):
                break
        cur.expect(")", "after the parameters")
        return params

    def _body(self, h: _Header) -> Function:
        cur = self.cur
        cur.pos = h.body_pos
        attrs = h.deco.get("attrs", EMPTY_ATTRS)
        if h.kind == "tensor":
            body = as_stmt(LoopParser(cur, h.scope).suite())
            tparams = tuple(p for p in h.params if isinstance(p, (Buffer, SymVar)))
            return TensorFunc(tparams, body, h.deco.get("num_outputs", 1), attrs)
        params = [p for p in h.params if isinstance(p, Var)]
        seq = GraphParser(cur, h.scope, self.ctx, params).seq(is_func=True)
        ret = h.ret
        if ret is None:
            param_vars: set[SymVar] = set()
            for p in params:
                param_vars.update(I.free_vars(p.info))
            ret = I.erase(seq.body.info, lambda v: v in param_vars)
        return GraphFunc(tuple(params), replace(seq, info=ret), ret, attrs, h.deco.get("pure", True))


def _signature(item: Function | _Header) -> StructInfo:
    if isinstance(item, ExternFunc):
        return item.info
    assert isinstance(item, _Header)
    if item.kind == "tensor":
        return FuncInfo(None, AnyInfo(), pure=True)
    params = tuple(p.info for p in item.params if isinstance(p, Var))
    return FuncInfo(params, item.ret if item.ret is not None else AnyInfo(), item.deco.get("pure", True))
