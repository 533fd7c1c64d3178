"""The printer: IR to the text format (see ``tilework.text`` for the syntax).

Every var carries its struct info in the text, every sym var is declared with its bounds at the
start of the function that uses it, and names are made unique per function (``x``, ``x_1``), so
``parse(print_module(m))`` is structurally equal to ``m``.
"""

from __future__ import annotations

import keyword
from typing import Any, Mapping

import numpy as np

from tilework.ir import info as I
from tilework.ir import sym_walk
from tilework.ir.graph import (
    AnyBinding,
    Binding,
    Call,
    Constant,
    DataflowVar,
    Expr,
    ExternFunc,
    GlobalVar,
    GraphFunc,
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
from tilework.ir.info import PrimInfo, StructInfo
from tilework.ir.loop import INTRINSICS, Stmt, TensorFunc
from tilework.ir.module import Function, IRModule
from tilework.ir.sym import SymExpr, SymVar
from tilework.ir.visitor import ExprVisitor
from tilework.text.print_base import BasePrinter, Meta, inline_const, sym_decl
from tilework.text.print_loop import TensorPrinter
from tilework.text.syntax import GRAPH_FORMS, float_str, quote

DEFAULT_EXTERN_INFO = ExternFunc("").info


def global_name(name: str) -> str:
    """A global function name as written after ``@`` or ``def``: quoted unless an identifier."""
    return name if name.isidentifier() and not keyword.iskeyword(name) else quote(name)


def _op_names() -> frozenset[str]:
    from tilework.op.base import all_ops

    return frozenset(all_ops())


# -- sym vars used by a graph function ----------------------------------------------------


class _SymCollector(ExprVisitor):
    """The sym vars a graph function mentions, in first-occurrence order."""

    def __init__(self) -> None:
        self.found: dict[SymVar, None] = {}

    def dim(self, d: object) -> None:
        if isinstance(d, SymExpr):
            for v in sym_walk.free_vars(d):
                self.found[v] = None

    def info(self, i: StructInfo) -> None:
        for v in I.free_vars(i):
            self.found[v] = None

    def attr(self, v: Any) -> None:
        if isinstance(v, SymExpr):
            self.dim(v)
        elif isinstance(v, (tuple, list)):
            for x in v:
                self.attr(x)
        elif isinstance(v, Mapping):
            for x in v.values():
                self.attr(x)
        elif isinstance(v, StructInfo):
            self.info(v)

    def visit_other(self, e: Any) -> None:
        pass  # not a graph expression: the printer shows it as such, nothing to collect

    def visit_shape_expr(self, e: ShapeExpr) -> None:
        for d in e.values:
            self.dim(d)

    def visit_prim_value(self, e: PrimValue) -> None:
        if not isinstance(e.value, (bool, float)):
            self.dim(e.value)
        self.info(e.info)

    def visit_extern_func(self, e: ExternFunc) -> None:
        self.info(e.info)

    def visit_call(self, e: Call) -> None:
        super().visit_call(e)
        self.attr(e.attrs)
        for s in e.sinfo_args:
            self.info(s)

    def visit_binding(self, b: Binding) -> None:
        self.info(b.var.info)
        super().visit_binding(b)

    def visit_match_cast(self, b: MatchCast) -> None:
        self.info(b.var.info)
        self.info(b.cast_info)
        super().visit_match_cast(b)

    def func(self, f: GraphFunc) -> list[SymVar]:
        for p in f.params:
            self.info(p.info)
        self.info(f.ret_info)
        self.attr(f.attrs)
        self.visit(f.body)
        return list(self.found)


# -- graph functions ----------------------------------------------------------------------


class GraphPrinter(BasePrinter):
    """Prints graph functions, bindings and expressions."""

    def var_name(self, v: Var) -> str:
        return self.namer.name(v, v.name)

    def func(self, name: str, f: GraphFunc) -> None:
        syms = _SymCollector().func(f)
        for v in syms:
            self.sym_name(v)
        params = ", ".join(f"{self.var_name(p)}: {self.info(p.info)}" for p in f.params)
        args = []
        if not f.pure:
            args.append("pure=False")
        if f.attrs:
            args.append(f"attrs={self.attrs_dict(f.attrs)}")
        self.emit(0, "@graph" + (f"({', '.join(args)})" if args else ""))
        self.emit(0, f"def {global_name(name)}({params}) -> {self.info(f.ret_info)}:")
        for v in syms:
            self.emit(1, sym_decl(self.sym_name(v), v))
        self.seq(f.body, 1, is_func=True)

    def seq(self, s: SeqExpr, depth: int, is_func: bool) -> None:
        prev_flat = False
        for blk in s.blocks:
            if blk.is_dataflow:
                self.emit(depth, "with dataflow():")
                for b in blk.bindings:
                    self.binding(b, depth + 1)
                outs = [self.var_name(b.var) for b in blk.bindings if not isinstance(b.var, DataflowVar)]
                if outs:
                    self.emit(depth + 1, f"output({', '.join(outs)})")
                if not blk.bindings:
                    self.emit(depth + 1, "pass")
                prev_flat = False
            elif prev_flat or not blk.bindings:
                # an explicit block keeps the boundary between two adjacent ordinary blocks
                self.emit(depth, "with bindings():")
                for b in blk.bindings:
                    self.binding(b, depth + 1)
                if not blk.bindings:
                    self.emit(depth + 1, "pass")
                prev_flat = False
            else:
                for b in blk.bindings:
                    self.binding(b, depth)
                prev_flat = True
        body = self.expr(s.body)
        self.emit(depth, f"return {body}" if is_func else body)

    def binding(self, b: AnyBinding, depth: int) -> None:
        name = self.var_name(b.var)
        if isinstance(b, MatchCast):
            ann = "" if b.var.info == b.cast_info else f": {self.info(b.var.info)}"
            self.emit(depth, f"{name}{ann} = match_cast({self.expr(b.value)}, {self.info(b.cast_info)})", b)
            return
        head = f"{name}: {self.info(b.var.info)} = "
        if isinstance(b.value, If):
            self.emit(depth, head + f"if {self.expr(b.value.cond)}:", b)
            self.seq(b.value.then_branch, depth + 1, is_func=False)
            self.emit(depth, "else:")
            self.seq(b.value.else_branch, depth + 1, is_func=False)
            return
        self.emit(depth, head + self.expr(b.value), b)

    # -- expressions ----------------------------------------------------------------------

    def expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return self.var_name(e)
        if isinstance(e, Constant):
            return inline_const(e) or self.meta.ref(e)
        if isinstance(e, ShapeExpr):
            return "shape(" + ", ".join(self.dim(d) for d in e.values) + ")"
        if isinstance(e, PrimValue):
            return self.prim(e)
        if isinstance(e, StringImm):
            return quote(e.value)
        if isinstance(e, GlobalVar):
            return "@" + global_name(e.name)
        if isinstance(e, ExternFunc):
            if e.info == DEFAULT_EXTERN_INFO:
                return f"extern({quote(e.symbol)})"
            return f"extern({quote(e.symbol)}, {self.info(e.info)})"
        if isinstance(e, OpRef):
            return self.op_text(e.name)
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, Tuple):
            if len(e.fields) == 1:
                return f"({self.expr(e.fields[0])},)"
            return "(" + ", ".join(self.expr(f) for f in e.fields) + ")"
        if isinstance(e, TupleGetItem):
            return f"{self.expr(e.tuple_value)}[{e.index}]"
        return f"<{type(e).__name__}: only a binding can hold it>"

    def op_text(self, name: str) -> str:
        """An op by its bare name, which the parser resolves in the registry (local names,
        which the printer keeps apart from op names, shadow it)."""
        if name.isidentifier() and not keyword.iskeyword(name) and name not in GRAPH_FORMS:
            return name
        return f"op({quote(name)})"

    def prim(self, e: PrimValue) -> str:
        v = e.value.item() if isinstance(e.value, np.generic) else e.value
        if isinstance(v, bool):
            text = str(v)
        elif isinstance(v, float):
            text = float_str(v)
        else:
            text = self.dim(v)
        if e.info == PrimValue.of(v).info:
            return f"prim({text})"
        if isinstance(e.info, PrimInfo) and e.info.dtype is not None and e.info == PrimValue.of(v, e.info.dtype).info:
            return f"prim({text}, {quote(e.info.dtype)})"
        return f"prim({text}, info={self.info(e.info)})"

    def call(self, c: Call) -> str:
        parts = [self.expr(a) for a in c.args]
        parts += [f"{k}={self.attr_value(v)}" for k, v in c.attrs.items()]
        if isinstance(c.callee, OpRef):
            from tilework.op.base import lookup

            op = lookup(c.callee.name)
            out_is_attr = op is not None and "out" in op.attrs
            if len(c.sinfo_args) == 1 and not out_is_attr and "out" not in c.attrs:
                parts.append(f"out={self.info(c.sinfo_args[0])}")
            elif c.sinfo_args:
                parts.append("sinfo_args=[" + ", ".join(self.info(s) for s in c.sinfo_args) + "]")
        elif c.sinfo_args:
            parts.append("sinfo_args=[" + ", ".join(self.info(s) for s in c.sinfo_args) + "]")
        return f"{self.expr(c.callee)}({', '.join(parts)})"


# -- modules ------------------------------------------------------------------------------


def _func_lines(name: str, func: Function, meta: Meta, taken: frozenset[str], highlight: object = None, note: str | None = None) -> list[str]:
    if isinstance(func, GraphFunc):
        gp = GraphPrinter(meta, taken, highlight, note)
        gp.func(name, func)
        return gp.lines
    if isinstance(func, TensorFunc):
        tp = TensorPrinter(meta, frozenset(INTRINSICS), highlight, note)
        tp.func(global_name(name), func)
        return tp.lines
    if isinstance(func, ExternFunc):
        bp = BasePrinter(meta)
        return [f"@{global_name(name)} = extern({quote(func.symbol)}, {bp.info(func.info)})"]
    return [f"# @{name}: <{type(func).__name__}>"]


def print_module(mod: IRModule) -> str:
    """The text of a whole module; large constants go to a ``meta`` section at its end."""
    meta = Meta()
    taken = _op_names()
    out: list[str] = []
    if mod.attrs:
        head = BasePrinter(meta)
        collector = _SymCollector()
        collector.attr(mod.attrs)
        for v in collector.found:
            out.append(sym_decl(head.sym_name(v), v))
        out.append(f"attrs = {head.attrs_dict(mod.attrs)}")
    for name, func in mod.items():
        if out:
            out.append("")
        out.extend(_func_lines(name, func, meta, taken))
    if meta.consts:
        out.append("")
        out.extend(meta.lines(full=True))
    return "\n".join(out) + "\n"


def print_func(name: str, func: Function, highlight: AnyBinding | Stmt | None = None, note: str | None = None) -> str:
    """The text of one function. When ``highlight`` is one of its bindings or statements, a
    line of carets under it is followed by ``note`` (used for errors in context). Large
    constants are summarized in comments rather than printed."""
    meta = Meta()
    lines = _func_lines(name, func, meta, _op_names(), highlight, note)
    if meta.consts:
        lines.append("")
        lines.extend(meta.lines(full=False))
    return "\n".join(lines) + "\n"


def print_expr(expr: Expr) -> str:
    """The text of a graph-level expression, names as they are (made parseable)."""
    return GraphPrinter(Meta()).expr(expr)


def print_info(info: StructInfo) -> str:
    """The text of a struct info, e.g. ``Tensor((n, 4), "float32")``."""
    return BasePrinter(Meta()).info(info)


def print_binding(binding: AnyBinding) -> str:
    """The text of one binding (several lines for an ``If``)."""
    gp = GraphPrinter(Meta())
    if isinstance(binding, (Binding, MatchCast)):
        gp.binding(binding, 0)
    return "\n".join(gp.lines)


__all__ = ["print_module", "print_func", "print_expr", "print_info", "print_binding", "global_name"]
