"""Printing TensorFuncs: buffers, loops, blocks, statements and scalar expressions.

Index arithmetic (ints and ``SymExpr``) prints as plain arithmetic and parses back through
``sym``, so it stays canonical. A ``Binary``/``Unary`` that the parser would not rebuild as is
(both operands index values, or a dtype other than the natural one) prints in the explicit
form ``binary("+", a, b, dtype="int64")``.
"""

from __future__ import annotations

from typing import Any, Mapping, TypeGuard

from tilework.ir import sym_walk
from tilework.ir.dtype import DTYPES
from tilework.ir.loop import (
    INTRINSICS,
    Allocate,
    Binary,
    Block,
    Buffer,
    Cast,
    Const,
    For,
    IfThenElse,
    Intrin,
    Load,
    PExpr,
    Scalar,
    Select,
    SeqStmt,
    Stmt,
    Store,
    TensorFunc,
    Unary,
    walk_scalars,
    walk_stmts,
)
from tilework.ir.sym import Dim, FloorDiv, FloorMod, Max, Min, Poly, SymExpr, SymVar
from tilework.text.print_base import BasePrinter, sym_decl
from tilework.text.syntax import LOOP_KIND_SYNTAX, float_str, quote

OR, AND, NOT, CMP, ADD, MUL, UNARY, ATOM = range(1, 9)
INFIX_PREC = {
    "or": OR, "and": AND, "<": CMP, "<=": CMP, "==": CMP, "!=": CMP, ">": CMP, ">=": CMP,
    "+": ADD, "-": ADD, "*": MUL, "/": MUL, "//": MUL, "%": MUL,
}  # fmt: skip
CALL_BINARY = ("min", "max", "pow")
SYM_FOLDED = ("+", "-", "*", "//", "%", "min", "max")  # index-value ops the parser folds into sym
BOOL_RESULT = ("<", "<=", "==", "!=", ">", ">=", "and", "or")
BOOL_INTRINSICS = ("isnan", "isinf")


def is_index(x: Scalar) -> TypeGuard[Dim]:
    return isinstance(x, (int, SymExpr))


def natural_dtype(operands: tuple[Scalar, ...]) -> str:
    """The dtype the parser gives an arithmetic expression: that of its first non-index operand."""
    for x in operands:
        if isinstance(x, PExpr):
            return x.dtype
    return "int64"


def binary_dtype(op: str, a: Scalar, b: Scalar) -> str:
    return "bool" if op in BOOL_RESULT else natural_dtype((a, b))


def unary_dtype(op: str, a: Scalar) -> str:
    return "bool" if op == "not" else natural_dtype((a,))


def intrin_dtype(name: str, args: tuple[Scalar, ...]) -> str:
    return "bool" if name in BOOL_INTRINSICS else natural_dtype(args)


def _sym_prec(e: int | SymExpr) -> int:
    if isinstance(e, int):
        return ATOM if e >= 0 else ADD
    if isinstance(e, (SymVar, Min, Max)):
        return ATOM
    if isinstance(e, (FloorDiv, FloorMod)):
        return MUL
    if isinstance(e, Poly) and len(e.terms) == 1 and e.const == 0 and e.terms[0][1] > 0:
        return MUL
    return ADD


def _wrap(text: str, need: bool) -> str:
    return f"({text})" if need else text


def _literal(v: Any) -> str:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return float_str(v)
    return str(v)


class _LoopSyms:
    """Sym vars of a TensorFunc in first-occurrence order, and the loop / iter vars that are
    used outside the statement that binds them (those must be declared up front)."""

    def __init__(self, binders: set[SymVar]) -> None:
        self.found: dict[SymVar, None] = {}
        self.binders = binders
        self.active: set[SymVar] = set()
        self.escaped: set[SymVar] = set()

    def dim(self, d: Any) -> None:
        if not isinstance(d, SymExpr):
            return
        for v in sym_walk.free_vars(d):
            self.found[v] = None
            if v in self.binders and v not in self.active:
                self.escaped.add(v)

    def attr(self, v: Any) -> None:
        if isinstance(v, SymExpr):
            self.dim(v)
        elif isinstance(v, (tuple, list)):
            for x in v:
                self.attr(x)
        elif isinstance(v, Mapping):
            for x in v.values():
                self.attr(x)

    def scalar(self, x: Scalar) -> None:
        for y in walk_scalars(x):
            self.dim(y)

    def stmt(self, s: Stmt) -> None:
        if isinstance(s, For):
            self.dim(s.extent)
            self.found[s.var] = None
            self.active.add(s.var)
            self.stmt(s.body)
            self.active.discard(s.var)
        elif isinstance(s, Block):
            for iv in s.iter_vars:
                self.dim(iv.extent)
                self.dim(iv.binding)
                self.found[iv.var] = None
                self.active.add(iv.var)
            if s.init is not None:
                self.stmt(s.init)
            self.stmt(s.body)
            for iv in s.iter_vars:
                self.active.discard(iv.var)
        elif isinstance(s, Store):
            for i in s.indices:
                self.scalar(i)
            self.scalar(s.value)
        elif isinstance(s, Allocate):
            for d in s.buffer.shape:
                self.dim(d)
            self.stmt(s.body)
        elif isinstance(s, IfThenElse):
            self.scalar(s.cond)
            self.stmt(s.then_body)
            if s.else_body is not None:
                self.stmt(s.else_body)
        elif isinstance(s, SeqStmt):
            for x in s.stmts:
                self.stmt(x)


def _binder_counts(body: Stmt) -> dict[SymVar, int]:
    counts: dict[SymVar, int] = {}
    for s in walk_stmts(body):
        if isinstance(s, For):
            counts[s.var] = counts.get(s.var, 0) + 1
        elif isinstance(s, Block):
            for iv in s.iter_vars:
                counts[iv.var] = counts.get(iv.var, 0) + 1
    return counts


class TensorPrinter(BasePrinter):
    """Prints one TensorFunc."""

    def buf_name(self, b: Buffer) -> str:
        return self.namer.name(b, b.name)

    def func(self, gname: str, f: TensorFunc) -> None:
        counts = _binder_counts(f.body)
        coll = _LoopSyms(set(counts))
        for p in f.params:
            if isinstance(p, SymVar):
                coll.dim(p)
            else:
                for d in p.shape:
                    coll.dim(d)
        coll.attr(f.attrs)
        coll.stmt(f.body)
        sym_params = set(f.sym_params)
        declared = [
            v for v in coll.found
            if not (counts.get(v) == 1 and v.lo == 0 and v.hi is None and v not in coll.escaped and v not in sym_params)
        ]  # fmt: skip
        for v in declared:
            self.sym_name(v)
        params = []
        for p in f.params:
            if isinstance(p, SymVar):
                params.append(f"{self.sym_name(p)}: int64")
            else:
                params.append(f"{self.buf_name(p)}: Buffer({self.dims(p.shape)}, {quote(p.dtype)})")
        args = []
        if f.num_outputs != 1:
            args.append(f"num_outputs={f.num_outputs}")
        if f.attrs:
            args.append(f"attrs={self.attrs_dict(f.attrs)}")
        self.emit(0, "@tensor" + (f"({', '.join(args)})" if args else ""))
        self.emit(0, f"def {gname}({', '.join(params)}):")
        for v in declared:
            self.emit(1, sym_decl(self.sym_name(v), v))
        self.suite(f.body, 1)

    # -- statements -----------------------------------------------------------------------

    def suite(self, s: Stmt, depth: int) -> None:
        """A statement list: a SeqStmt of n != 1 statements prints as its items."""
        if isinstance(s, SeqStmt) and len(s.stmts) != 1:
            for x in s.stmts:
                self.stmt(x, depth)
            if not s.stmts:
                self.emit(depth, "pass")
            return
        self.stmt(s, depth)

    def stmt(self, s: Stmt, depth: int) -> None:
        if isinstance(s, For):
            kw = LOOP_KIND_SYNTAX.get(s.kind)
            head = f"{kw}({self.dim(s.extent)})" if kw else f"loop({self.dim(s.extent)}, kind={quote(s.kind)})"
            self.emit(depth, f"for {self.sym_name(s.var)} in {head}:", s)
            self.suite(s.body, depth + 1)
        elif isinstance(s, Block):
            self.block(s, depth)
        elif isinstance(s, Store):
            self.emit(depth, f"{self.load_text(s.buffer, s.indices)} = {self.scalar(s.value)[0]}", s)
        elif isinstance(s, Allocate):
            b = s.buffer
            self.emit(depth, f"with allocate({self.dims(b.shape)}, {quote(b.dtype)}) as {self.buf_name(b)}:", s)
            self.suite(s.body, depth + 1)
        elif isinstance(s, IfThenElse):
            self.emit(depth, f"if {self.scalar(s.cond)[0]}:", s)
            self.suite(s.then_body, depth + 1)
            if s.else_body is not None:
                self.emit(depth, "else:")
                self.suite(s.else_body, depth + 1)
        elif isinstance(s, SeqStmt):
            self.emit(depth, "with seq():", s)
            for x in s.stmts:
                self.stmt(x, depth + 1)
            if not s.stmts:
                self.emit(depth + 1, "pass")
        else:
            self.emit(depth, f"<{type(s).__name__}>", s)

    def block(self, s: Block, depth: int) -> None:
        self.emit(depth, f"with block({quote(s.name)}):", s)
        inner = depth + 1
        for iv in s.iter_vars:
            ext, bind = self.dim(iv.extent), self.dim(iv.binding)
            if iv.kind in ("spatial", "reduce"):
                rhs = f"{iv.kind}({ext}, {bind})"
            else:
                rhs = f"axis({quote(iv.kind)}, {ext}, {bind})"
            self.emit(inner, f"{self.sym_name(iv.var)} = {rhs}")
        self.emit(inner, "reads(" + ", ".join(self.buf_name(b) for b in s.reads) + ")")
        self.emit(inner, "writes(" + ", ".join(self.buf_name(b) for b in s.writes) + ")")
        if s.init is not None:
            self.emit(inner, "with init():")
            self.suite(s.init, inner + 1)
        if not (isinstance(s.body, SeqStmt) and not s.body.stmts):
            self.suite(s.body, inner)

    # -- scalar expressions ---------------------------------------------------------------

    def load_text(self, b: Buffer, indices: tuple[Scalar, ...]) -> str:
        idx = ", ".join(self.scalar(i)[0] for i in indices) if indices else "()"
        return f"{self.buf_name(b)}[{idx}]"

    def scalar(self, x: Scalar) -> tuple[str, int]:
        """The text of ``x`` and its precedence (Python's)."""
        if isinstance(x, (int, SymExpr)):
            return self.dim(x), _sym_prec(x)
        if isinstance(x, Const):
            if x.dtype in DTYPES:
                return f"{x.dtype}({_literal(x.value)})", ATOM
            return f"const({_literal(x.value)}, {quote(x.dtype)})", ATOM
        if isinstance(x, Load):
            return self.load_text(x.buffer, x.indices), ATOM
        if isinstance(x, Binary):
            return self.binary(x)
        if isinstance(x, Unary):
            return self.unary(x)
        if isinstance(x, Cast):
            return f"cast({self.scalar(x.value)[0]}, {quote(x.dtype)})", ATOM
        if isinstance(x, Select):
            args = ", ".join(self.scalar(y)[0] for y in (x.cond, x.a, x.b))
            if x.dtype != natural_dtype((x.a, x.b)):
                args += f", dtype={quote(x.dtype)}"
            return f"select({args})", ATOM
        if isinstance(x, Intrin):
            args = ", ".join(self.scalar(y)[0] for y in x.args)
            tail = "" if x.dtype == intrin_dtype(x.name, x.args) else f", dtype={quote(x.dtype)}"
            if x.name in INTRINSICS:
                return f"{x.name}({args}{tail})", ATOM
            sep = ", " if args else ""
            return f"intrin({quote(x.name)}{sep}{args}, dtype={quote(x.dtype)})", ATOM
        return f"<{type(x).__name__}>", ATOM

    def binary(self, x: Binary) -> tuple[str, int]:
        (sa, pa), (sb, pb) = self.scalar(x.a), self.scalar(x.b)
        folded = x.op in SYM_FOLDED and is_index(x.a) and is_index(x.b)
        known = x.op in INFIX_PREC or x.op in CALL_BINARY
        if folded or not known or x.dtype != binary_dtype(x.op, x.a, x.b):
            return f"binary({quote(x.op)}, {sa}, {sb}, dtype={quote(x.dtype)})", ATOM
        if x.op in CALL_BINARY:
            return f"{x.op}({sa}, {sb})", ATOM
        p = INFIX_PREC[x.op]
        left = _wrap(sa, pa < p or (p == CMP and pa == CMP))
        right = _wrap(sb, pb <= p)
        return f"{left} {x.op} {right}", p

    def unary(self, x: Unary) -> tuple[str, int]:
        s, p = self.scalar(x.a)
        if x.op not in ("neg", "not") or (x.op == "neg" and is_index(x.a)) or x.dtype != unary_dtype(x.op, x.a):
            return f"unary({quote(x.op)}, {s}, dtype={quote(x.dtype)})", ATOM
        if x.op == "neg":
            return "-" + _wrap(s, p < UNARY), UNARY
        return "not " + _wrap(s, p < NOT), NOT
