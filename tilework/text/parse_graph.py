"""Parsing graph function bodies.

Nodes are built directly. The struct info written on a binding is the var's info (and the info
of the call it binds); a binding written without one gets its info inferred by the rules the
BlockBuilder uses (op inference, function signatures), so hand-written text may leave it out.
"""

from __future__ import annotations

import base64
import difflib
import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable


from tilework.errors import TileworkError
from tilework.ir import info as I
from tilework.ir.builder import infer_func_call
from tilework.ir.graph import (
    EMPTY_ATTRS,
    AnyBinding,
    Attrs,
    Binding,
    BindingBlock,
    Call,
    Constant,
    DataflowBlock,
    DataflowVar,
    Expr,
    ExternFunc,
    GlobalVar,
    If,
    MatchCast,
    OpRef,
    PrimValue,
    SeqExpr,
    ShapeExpr,
    StringImm,
    Tuple,
    TupleGetItem,
    Var,
)
from tilework.ir.info import AnyInfo, FuncInfo, StructInfo, TupleInfo
from tilework.ir.sym import SymVar
from tilework.op import base as opbase
from tilework.text.cursor import Cursor, Scope
from tilework.text.lexer import Token
from tilework.text.parse_common import Common, call_args
from tilework.text.parse_scalar import signed_literal
from tilework.ir.dtype import decode_array
from tilework.text.syntax import array_from_list


@dataclass
class ModuleCtx:
    """What a function body sees of its module: global signatures and the metadata constants."""

    globals: dict[str, StructInfo] = field(default_factory=dict)
    meta: dict[int, Constant] = field(default_factory=dict)

    def global_var(self, name: str) -> GlobalVar:
        return GlobalVar(name, self.globals.get(name, AnyInfo()))


def _field_info(info: StructInfo, index: int) -> StructInfo:
    if isinstance(info, TupleInfo) and 0 <= index < len(info.fields):
        return info.fields[index]
    return AnyInfo()


def parse_constant(c: Common, with_values: bool) -> Constant:
    """After ``const``: ``([values], "dtype", shape=..., name=...)`` inline, or for a metadata
    entry ``(dtype=..., shape=..., data="base64", name=...)``."""
    cur = c.cur
    tok = cur.peek()
    spec: list[tuple[str, Callable[[], Any]]] = [("dtype", c.dtype), ("shape", c.dims), ("data", c.string), ("name", c.string)]
    if with_values:
        spec = [("values", c.nested_literal)] + spec[:2] + spec[3:]
    a = call_args(cur, spec, "const")
    if "dtype" not in a or (with_values and "values" not in a):
        raise cur.error("const needs its values and a dtype: const([1.0, 2.0], \"float32\")", tok)
    shape = a.get("shape")
    if shape is not None and not all(isinstance(d, int) for d in shape):
        raise cur.error("a constant's shape must be static", tok)
    try:
        if with_values:
            arr = array_from_list(a["values"], a["dtype"], shape)
        else:
            if "data" not in a or shape is None:
                raise cur.error("a metadata constant needs dtype, shape and data", tok)
            raw = base64.b64decode(a["data"], validate=True)
            arr = decode_array(a["dtype"], shape, raw)
    except (ValueError, TypeError, TileworkError) as e:
        raise cur.error(f"bad constant: {e}", tok) from None
    return Constant.of(arr, name=a.get("name", ""))


class GraphParser:
    """Parses the body of one graph function."""

    def __init__(self, cur: Cursor, scope: Scope, ctx: ModuleCtx, params: list[Var]) -> None:
        self.cur = cur
        self.scope = scope
        self.ctx = ctx
        self.c = Common(cur, scope)
        defined: set[SymVar] = set()
        for p in params:
            defined.update(I.defined_vars(p.info))
        self.sym_defined = [defined]

    # -- sequences and blocks -------------------------------------------------------------

    def seq(self, is_func: bool) -> SeqExpr:
        """Statements up to the end of the block: ``return value`` ends a function body, a bare
        value ends an If branch. Consumes the closing dedent."""
        cur = self.cur
        blocks: list[BindingBlock] = []
        flat: list[AnyBinding] = []
        while True:
            tok = cur.peek()
            if tok.kind == "indent":
                raise cur.error("unexpected indentation")
            if tok.kind in ("dedent", "eof"):
                raise cur.error("a function body must end with 'return <value>'" if is_func else "an if branch must end with its value")
            if cur.at("with"):
                if flat:
                    blocks.append(BindingBlock(tuple(flat)))
                    flat = []
                blocks.append(self.with_block())
            elif self._at_binding():
                flat.append(self.binding(None))
            elif is_func:
                cur.expect("return", "or a binding")
                body = self.leaf()
                break
            else:
                body = self.leaf()
                break
        cur.expect_newline("after the value")
        if not cur.at_kind("dedent"):
            raise cur.error("nothing may follow the value that ends a block")
        cur.next()
        if flat:
            blocks.append(BindingBlock(tuple(flat)))
        visible = self.sym_defined[-1]
        info = body.info if is_func else I.erase(body.info, lambda v: v in visible)
        return SeqExpr(tuple(blocks), body, info)

    def _at_binding(self) -> bool:
        return self.cur.at_kind("name") and (self.cur.at(":", 1) or self.cur.at("=", 1))

    def with_block(self) -> BindingBlock:
        cur = self.cur
        cur.next()
        kind = cur.expect_kind("name", "'dataflow' or 'bindings' after 'with'")
        if kind.value not in ("dataflow", "bindings"):
            raise cur.error("expected 'dataflow' or 'bindings' after 'with'", kind)
        cur.expect("(", f"after '{kind.value}'")
        cur.expect(")", f"after '{kind.value}('")
        cur.expect_suite(f"after 'with {kind.value}()'")
        outputs = self._scan_outputs() if kind.value == "dataflow" else {}
        bindings: list[AnyBinding] = []
        while not cur.at_kind("dedent"):
            if cur.accept("pass"):
                cur.expect_newline("after 'pass'")
            elif cur.at("output") and cur.at("(", 1):
                self._skip_line()
            elif self._at_binding():
                bindings.append(self.binding(outputs if kind.value == "dataflow" else None))
            else:
                raise cur.error(f"expected a binding inside 'with {kind.value}()', found {cur.peek().describe()}")
        cur.next()
        bound = {b.var.name for b in bindings}
        for name, tok in outputs.items():
            if name not in bound:
                raise cur.error(f"output '{name}' is not bound in this dataflow block", tok)
        return DataflowBlock(tuple(bindings)) if kind.value == "dataflow" else BindingBlock(tuple(bindings))

    def _scan_outputs(self) -> dict[str, Token]:
        """The names listed by ``output(...)`` lines of the dataflow block at the cursor."""
        cur = self.cur
        out: dict[str, Token] = {}
        depth = 0
        line_start = True
        for i, tok in enumerate(itertools.islice(cur.toks, cur.pos, None)):  # i: tokens ahead; the last is eof
            kind = tok.kind
            if kind == "eof" or (kind == "dedent" and depth == 0):
                break
            if kind == "indent":
                depth += 1
            elif kind == "dedent":
                depth -= 1
            elif depth == 0 and line_start and tok.value == "output" and kind == "name" and cur.at("(", i + 1):
                j = i + 2
                while cur.peek(j).kind == "name":
                    out[cur.peek(j).value] = cur.peek(j)
                    j += 1
                    if not cur.at(",", j):
                        break
                    j += 1
                if not cur.at(")", j):
                    raise cur.error("expected ')' after the output names", cur.peek(j))
            line_start = kind == "newline" or kind == "indent" or kind == "dedent"
        return out

    def _skip_line(self) -> None:
        while not self.cur.at_kind("newline"):
            self.cur.next()
        self.cur.next()

    # -- bindings -------------------------------------------------------------------------

    def binding(self, outputs: dict[str, Token] | None) -> AnyBinding:
        cur = self.cur
        name = cur.next()
        ann = self.c.info() if cur.accept(":") else None
        cur.expect("=", f"after '{name.value}'" + (" and its struct info" if ann is not None else ""))
        in_dataflow = outputs is not None and name.value not in outputs
        make: Callable[[str, StructInfo], Var] = DataflowVar if in_dataflow else Var
        if cur.at("match_cast") and cur.at("(", 1):
            cur.next()
            cur.next()
            matched = self.leaf()
            cur.expect(",", "after the value of match_cast")
            cast = self.c.info()
            cur.expect(")", "after the struct info of match_cast")
            cur.expect_newline("after the binding")
            var = make(name.value, ann if ann is not None else cast)
            self.scope.define(cur, name, var)
            self.sym_defined[-1] = self.sym_defined[-1] | set(I.defined_vars(cast))
            return MatchCast(var, matched, cast)
        if cur.at("if"):
            value: Expr = self.if_expr(ann)
        else:
            tok = cur.peek()
            value = self.finish(self.expr(), ann, tok)
            cur.expect_newline("after the binding")
        var = make(name.value, ann if ann is not None else value.info)
        self.scope.define(cur, name, var)
        return Binding(var, value)

    def if_expr(self, ann: StructInfo | None) -> If:
        cur = self.cur
        cur.next()
        cond = self.leaf()
        cur.expect_suite("after the condition")
        then_branch = self.branch()
        cur.expect("else", "after the then-branch of 'if'")
        cur.expect_suite("after 'else'")
        else_branch = self.branch()
        info = ann if ann is not None else I.lca(then_branch.info, else_branch.info)
        return If(cond, then_branch, else_branch, info)

    def branch(self) -> SeqExpr:
        self.scope.push()
        self.sym_defined.append(set(self.sym_defined[-1]))
        try:
            return self.seq(is_func=False)
        finally:
            self.sym_defined.pop()
            self.scope.pop()

    # -- expressions ----------------------------------------------------------------------

    def leaf(self) -> Expr:
        tok = self.cur.peek()
        return self.finish(self.expr(), None, tok)

    def finish(self, e: Expr, ann: StructInfo | None, tok: Token) -> Expr:
        """Give a call (or tuple, tuple item) its info: ``ann`` when written, else inferred."""
        if isinstance(e, Call):
            return replace(e, info=ann if ann is not None else self.infer(e, tok))
        if isinstance(e, (Tuple, TupleGetItem)) and ann is not None:
            return replace(e, info=ann)
        return e

    def infer(self, call: Call, tok: Token) -> StructInfo:
        callee = call.callee
        if not isinstance(callee, OpRef) and not isinstance(callee.info, FuncInfo):
            raise self.cur.error("the callee is not known to be a function; write the binding's struct info", tok)
        try:
            if isinstance(callee, OpRef):
                return opbase.infer_with_checks(call)[0]
            assert isinstance(callee.info, FuncInfo)
            return infer_func_call(callee.info, call.args, "the callee")
        except TileworkError as e:
            raise self.cur.error(f"cannot infer the struct info of this call ({e}); write it on the binding", tok) from None

    def expr(self) -> Expr:
        cur = self.cur
        tok = cur.peek()
        e = self.primary()
        while True:
            if cur.at("("):
                e = self.call(e, tok)
            elif cur.at("["):
                base = self.finish(e, None, tok)
                cur.next()
                index = cur.expect_kind("int", "a tuple index")
                cur.expect("]", "after the tuple index")
                e = TupleGetItem(base, int(index.value), _field_info(base.info, int(index.value)))
            else:
                return e

    def primary(self) -> Expr:
        cur = self.cur
        tok = cur.peek()
        if tok.kind == "global":
            cur.next()
            return self.ctx.global_var(tok.value)
        if tok.kind == "str":
            cur.next()
            return StringImm(tok.value, AnyInfo())
        if cur.at("("):
            return self.tuple_or_paren()
        if tok.kind != "name":
            raise cur.error(f"expected an expression, found {tok.describe()}")
        special = self.special_form(tok)
        if special is not None:
            return special
        obj = self.scope.lookup(tok.value)
        if isinstance(obj, Var):
            cur.next()
            return obj
        if obj is not None:
            raise cur.error(f"'{tok.value}' is a symbolic dim; wrap it as prim({tok.value}) or shape({tok.value})", tok)
        op = opbase.lookup(tok.value)
        if op is not None:
            cur.next()
            return op.ref()
        if cur.at("(", 1) and tok.value in self.ctx.globals:
            raise cur.error(f"unknown op '{tok.value}'; did you mean @{tok.value} (a function of this module)?", tok)
        if cur.at("(", 1):
            close = difflib.get_close_matches(tok.value, list(opbase.all_ops()), n=3)
            raise cur.error(f"unknown op '{tok.value}'" + (f"; did you mean {' or '.join(close)}?" if close else ""), tok)
        raise cur.error(f"undefined name '{tok.value}'", tok)

    def tuple_or_paren(self) -> Expr:
        cur = self.cur
        cur.expect("(", "")
        fields: list[Expr] = []
        trailing = False
        while not cur.at(")"):
            fields.append(self.leaf())
            trailing = cur.accept(",") is not None
            if not trailing:
                break
        cur.expect(")", "after the tuple fields")
        if len(fields) == 1 and not trailing:
            return fields[0]
        return Tuple(tuple(fields), TupleInfo(tuple(f.info for f in fields)))

    def special_form(self, tok: Token) -> Expr | None:
        cur = self.cur
        name = tok.value
        if name == "meta" and cur.at("[", 1):
            cur.next()
            cur.next()
            index = cur.expect_kind("int", "a metadata index")
            cur.expect("]", "after the metadata index")
            if int(index.value) not in self.ctx.meta:
                raise cur.error(f"no metadata entry meta[{index.value}]", index)
            return self.ctx.meta[int(index.value)]
        if not cur.at("(", 1) or name not in ("const", "prim", "shape", "extern", "op"):
            return None
        cur.next()
        if name == "const":
            return parse_constant(self.c, with_values=True)
        if name == "shape":
            return ShapeExpr.of(self.c.dims("a shape"))
        if name == "extern":
            a = call_args(cur, [("symbol", self.c.string), ("info", self.c.info)], "extern")
            if "symbol" not in a:
                raise cur.error("extern needs the symbol name: extern(\"cblas_sgemm\")", tok)
            return ExternFunc(a["symbol"], a["info"]) if "info" in a else ExternFunc(a["symbol"])
        if name == "op":
            a = call_args(cur, [("name", self.c.string)], "op")
            op = opbase.lookup(a.get("name", ""))
            if op is None:
                raise cur.error(f"unknown op '{a.get('name', '')}'", tok)
            return op.ref()
        return self.prim(tok)

    def prim(self, tok: Token) -> PrimValue:
        c = self.c
        a = call_args(self.cur, [("value", self._prim_value), ("dtype", c.dtype), ("info", c.info)], "prim")
        if "value" not in a:
            raise self.cur.error("prim needs a value: prim(n + 1)", tok)
        if "info" in a:
            return PrimValue(a["value"], a["info"])
        return PrimValue.of(a["value"], a.get("dtype"))

    def _prim_value(self) -> Any:
        cur = self.cur
        if cur.at("True") or cur.at("False"):
            return cur.next().value == "True"
        if self.c._at_float():
            return float(signed_literal(cur))
        return self.c.dim()

    def call(self, callee: Expr, tok: Token) -> Call:
        cur = self.cur
        op = opbase.lookup(callee.name) if isinstance(callee, OpRef) else None
        cur.expect("(", "")
        args: list[Expr] = []
        attrs: dict[str, Any] = {}
        sinfo: tuple[StructInfo, ...] = ()
        while not cur.at(")"):
            if cur.at_kind("name") and cur.at("=", 1):
                key = cur.next()
                cur.next()
                if key.value == "sinfo_args":
                    sinfo = tuple(self.c.info_list())
                elif key.value == "out" and op is not None and "out" not in op.attrs:
                    sinfo = (self.c.info(),)
                elif op is not None and key.value not in op.attrs:
                    accepts = ", ".join(op.attrs) or "none"
                    raise cur.error(f"op '{op.name}' has no attribute '{key.value}' (it accepts: {accepts})", key)
                else:
                    attrs[key.value] = self.c.attr_value()
            else:
                if attrs:
                    raise cur.error("positional argument after a keyword argument")
                args.append(self.leaf())
            if not cur.accept(","):
                break
        cur.expect(")", "after arguments")
        if op is None:
            return Call(callee, tuple(args), Attrs(attrs) if attrs else EMPTY_ATTRS, sinfo)
        if op.num_args is not None and len(args) != op.num_args:
            raise cur.error(f"op '{op.name}' takes {op.num_args} argument(s), got {len(args)}", tok)
        full = {k: attrs.get(k, d) for k, d in op.attrs.items()}
        return Call(op.ref(), tuple(args), Attrs(full) if full else EMPTY_ATTRS, sinfo)
