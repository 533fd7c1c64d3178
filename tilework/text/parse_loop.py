"""Parsing TensorFunc bodies: loops, blocks, allocations, conditionals and stores.

A statement list of one statement is that statement, of any other length a ``SeqStmt``;
``with seq():`` states a ``SeqStmt`` of exactly the statements it holds. Loop and block iter
vars are introduced by their statement unless the function declared them up front.
"""

from __future__ import annotations

from tilework.ir.loop import Allocate, Block, Buffer, For, IfThenElse, IterVar, SeqStmt, Stmt, Store
from tilework.ir.sym import SymVar
from tilework.text.cursor import Cursor, Scope
from tilework.text.lexer import Token
from tilework.text.parse_common import Common, call_args
from tilework.text.syntax import LOOP_SYNTAX_KIND


def as_stmt(stmts: list[Stmt]) -> Stmt:
    return stmts[0] if len(stmts) == 1 else SeqStmt(tuple(stmts))


class LoopParser:
    """Parses the body of one TensorFunc."""

    def __init__(self, cur: Cursor, scope: Scope) -> None:
        self.cur = cur
        self.scope = scope
        self.c = Common(cur, scope)

    def suite(self) -> list[Stmt]:
        """Statements up to the closing dedent (consumed); ``pass`` adds nothing."""
        out: list[Stmt] = []
        while not self.cur.at_kind("dedent"):
            if self.cur.at_kind("eof"):
                raise self.cur.error("unexpected end of input inside a block")
            s = self.stmt()
            if s is not None:
                out.append(s)
        self.cur.next()
        return out

    def stmt(self) -> Stmt | None:
        cur = self.cur
        tok = cur.peek()
        if cur.accept("pass"):
            cur.expect_newline("after 'pass'")
            return None
        if tok.kind == "indent":
            raise cur.error("unexpected indentation")
        if cur.at("for"):
            return self.for_loop()
        if cur.at("if"):
            return self.if_stmt()
        if cur.at("with"):
            return self.with_stmt()
        if tok.kind == "name" and cur.at("[", 1):
            return self.store()
        raise cur.error(f"expected a statement (for, with, if, or a store like B[i] = ...), found {tok.describe()}")

    def _binder(self, tok: Token) -> SymVar:
        """The sym var a loop or iter var name introduces: the declared one, else a new one."""
        declared = self.scope.declared.get(tok.value)
        if declared is not None:
            return declared
        v = SymVar(tok.value)
        self.scope.define(self.cur, tok, v)
        return v

    def for_loop(self) -> Stmt:
        cur = self.cur
        cur.next()
        name = cur.expect_kind("name", "a loop variable after 'for'")
        cur.expect("in", "after the loop variable")
        kind_tok = cur.expect_kind("name", "range(...), parallel(...), vectorized(...), unrolled(...) or loop(...)")
        if kind_tok.value == "loop":
            a = call_args(cur, [("extent", self.c.dim), ("kind", self.c.string)], "loop")
            if "extent" not in a or "kind" not in a:
                raise cur.error("loop needs an extent and a kind: loop(n, kind=\"serial\")", kind_tok)
            extent, kind = a["extent"], a["kind"]
        elif kind_tok.value in LOOP_SYNTAX_KIND:
            cur.expect("(", f"after '{kind_tok.value}'")
            extent = self.c.dim()
            cur.expect(")", "after the loop extent")
            kind = LOOP_SYNTAX_KIND[kind_tok.value]
        else:
            raise cur.error("expected range(...), parallel(...), vectorized(...), unrolled(...) or loop(...)", kind_tok)
        cur.expect_suite("after the loop header")
        self.scope.push()
        try:
            var = self._binder(name)
            body = as_stmt(self.suite())
        finally:
            self.scope.pop()
        return For(var, extent, body, kind)

    def if_stmt(self) -> Stmt:
        cur = self.cur
        cur.next()
        cond = self.c.scalars.expr()
        cur.expect_suite("after the condition")
        then_body = self.scoped_suite()
        else_body = None
        if cur.accept("else"):
            cur.expect_suite("after 'else'")
            else_body = self.scoped_suite()
        return IfThenElse(cond, then_body, else_body)

    def scoped_suite(self) -> Stmt:
        self.scope.push()
        try:
            return as_stmt(self.suite())
        finally:
            self.scope.pop()

    def store(self) -> Stmt:
        cur = self.cur
        tok = cur.next()
        buf = self.scope.lookup(tok.value)
        if not isinstance(buf, Buffer):
            raise cur.error(f"'{tok.value}' is not a buffer", tok)
        indices = self.c.scalars.indices(tok)
        cur.expect("=", "after the stored-to element")
        value = self.c.scalars.expr()
        cur.expect_newline("after the store")
        return Store(buf, indices, value)

    # -- with-statements ------------------------------------------------------------------

    def with_stmt(self) -> Stmt:
        cur = self.cur
        cur.next()
        kind = cur.expect_kind("name", "block(...), allocate(...) or seq() after 'with'")
        if kind.value == "block":
            return self.block()
        if kind.value == "allocate":
            a = call_args(cur, [("shape", self.c.dims), ("dtype", self.c.dtype)], "allocate")
            if "shape" not in a or "dtype" not in a:
                raise cur.error("allocate needs a shape and a dtype", kind)
            cur.expect("as", "after allocate(...)")
            name = cur.expect_kind("name", "the buffer name after 'as'")
            cur.expect_suite("after the allocation")
            self.scope.push()
            try:
                buf = Buffer(name.value, a["shape"], a["dtype"])
                self.scope.define(cur, name, buf)
                body = as_stmt(self.suite())
            finally:
                self.scope.pop()
            return Allocate(buf, body)
        if kind.value == "seq":
            cur.expect("(", "after 'seq'")
            cur.expect(")", "after 'seq('")
            cur.expect_suite("after 'with seq()'")
            return SeqStmt(tuple(self.suite()))
        raise cur.error("expected block(...), allocate(...) or seq() after 'with'", kind)

    def block(self) -> Stmt:
        cur = self.cur
        cur.expect("(", "after 'block'")
        name = cur.expect_kind("str", "the block name").value
        cur.expect(")", "after the block name")
        cur.expect_suite("after the block header")
        self.scope.push()
        try:
            iter_vars = []
            while cur.at_kind("name") and cur.at("=", 1) and any(cur.at(k, 2) for k in ("spatial", "reduce", "axis")):
                iter_vars.append(self.iter_var())
            reads = self.buffer_list("reads")
            writes = self.buffer_list("writes")
            init = None
            if cur.at("with") and cur.at("init", 1):
                cur.next()
                cur.next()
                cur.expect("(", "after 'init'")
                cur.expect(")", "after 'init('")
                cur.expect_suite("after 'with init()'")
                init = self.scoped_suite()
            body = as_stmt(self.suite())
        finally:
            self.scope.pop()
        return Block(name, tuple(iter_vars), reads, writes, body, init)

    def iter_var(self) -> IterVar:
        cur = self.cur
        name = cur.next()
        cur.next()
        kind_tok = cur.next()
        if kind_tok.value == "axis":
            a = call_args(cur, [("kind", self.c.string), ("extent", self.c.dim), ("binding", self.c.dim)], "axis")
        else:
            a = call_args(cur, [("extent", self.c.dim), ("binding", self.c.dim)], kind_tok.value)
            a["kind"] = kind_tok.value
        if "extent" not in a or "binding" not in a:
            raise cur.error(f"{kind_tok.value} needs an extent and a binding: {kind_tok.value}(n, i)", kind_tok)
        cur.expect_newline("after the iter var")
        return IterVar(self._binder(name), a["extent"], a["kind"], a["binding"])

    def buffer_list(self, what: str) -> tuple[Buffer, ...]:
        cur = self.cur
        if not cur.at(what):
            return ()
        cur.next()
        cur.expect("(", f"after '{what}'")
        out = []
        while not cur.at(")"):
            tok = cur.expect_kind("name", "a buffer name")
            buf = self.scope.lookup(tok.value)
            if not isinstance(buf, Buffer):
                raise cur.error(f"'{tok.value}' is not a buffer", tok)
            out.append(buf)
            if not cur.accept(","):
                break
        cur.expect(")", f"after the buffers of {what}")
        cur.expect_newline(f"after {what}(...)")
        return tuple(out)
