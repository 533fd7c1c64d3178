"""Walking and rebuilding graph expressions: the one dispatch for expression walks.

``ExprVisitor.visit(e)`` calls the method for the node type of ``e``: ``visit_var`` (a
``DataflowVar`` too), ``visit_constant``, ``visit_shape_expr``, ``visit_prim_value``,
``visit_string_imm``, ``visit_global_var``, ``visit_extern_func``, ``visit_op_ref``,
``visit_call``, ``visit_tuple``, ``visit_tuple_get_item``, ``visit_if``, ``visit_seq_expr``.
Each class builds its table (exact type -> method) once, when it is defined, so a dispatch is
one dict lookup whatever the node. ``ExprMutator.mutate(e)`` dispatches the same way to the
``mutate_*`` methods. A subclass overrides only the methods for the nodes it cares about.

What the default methods guarantee:

- **Reach and order.** Every sub-expression is visited, in field order: a call's callee, then
  its args; a tuple's fields; an If's condition, then branch, else branch; a SeqExpr's blocks
  in order, each binding's value and then its var, then the SeqExpr's result. A var that is
  read goes to ``visit_var``, a var that a binding binds to ``visit_var_def``: a walk that
  collects reads overrides ``visit_var`` alone. Nodes are visited once per occurrence (nothing
  is memoized). An override chooses where its own work goes: before or after calling
  ``super().visit_call(e)``, or instead of it (to prune the children).
- **Identity.** ``ExprMutator`` rebuilds a node only when a child came back as a different
  object; an untouched subtree comes back as the very same object, blocks and bindings
  included. A rebuilt node keeps the struct info of the node it replaces, or gets ``AnyInfo``
  with ``keep_info = False`` (for results that a ``BlockBuilder`` normalizes again).
- **Vars.** ``mutate_var`` replaces a read var by ``var_map``'s entry; ``mutate_var_def``
  gives the var a binding binds (default: the same). A mutator that renames returns a new var
  there and records it in ``var_map``, so the reads after the binding follow.
- Anything that is not a graph expression goes to ``visit_other`` / ``mutate_other``, which
  raise TypeError; a subclass of a node type is dispatched as its nearest node base.

These bases keep the bindings of a function as they are. Rewriting a function binding by
binding, with struct info inferred again and new bindings emitted, is ``FuncRewriter``'s job
(``tilework.ir.rewrite``).
"""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import Any, Callable, ClassVar, Sequence

from tilework.ir.graph import (
    AnyBinding,
    Binding,
    BindingBlock,
    Call,
    Constant,
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
from tilework.ir.info import AnyInfo, StructInfo

_KINDS: dict[type, str] = {
    Var: "var",
    DataflowVar: "var",
    Constant: "constant",
    ShapeExpr: "shape_expr",
    PrimValue: "prim_value",
    StringImm: "string_imm",
    GlobalVar: "global_var",
    ExternFunc: "extern_func",
    OpRef: "op_ref",
    Call: "call",
    Tuple: "tuple",
    TupleGetItem: "tuple_get_item",
    If: "if",
    SeqExpr: "seq_expr",
}

_Table = dict[type, Callable[[Any, Any], Any]]


def _build_table(cls: type, prefix: str) -> _Table:
    return {t: getattr(cls, prefix + kind) for t, kind in _KINDS.items()}


def _resolve(cls: Any, prefix: str, t: type) -> Callable[[Any, Any], Any]:
    """The method for a type outside the table (cached in ``cls``'s table)."""
    kind = next((_KINDS[b] for b in t.__mro__ if b in _KINDS), "other")
    fn: Callable[[Any, Any], Any] = getattr(cls, prefix + kind)
    cls._table[t] = fn
    return fn


def _same(new: Sequence[object], old: Sequence[object]) -> bool:
    return all(map(operator.is_, new, old))


class ExprVisitor:
    """Walks a graph expression; see the module docstring for what the defaults visit."""

    _table: ClassVar[_Table]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._table = _build_table(cls, "visit_")

    def visit(self, e: Expr) -> None:
        fn = self._table.get(type(e)) or _resolve(type(self), "visit_", type(e))
        fn(self, e)

    def visit_other(self, e: Any) -> None:
        raise TypeError(f"{type(e).__name__} is not a graph expression")

    # -- leaves ---------------------------------------------------------------------------

    def visit_var(self, e: Var) -> None:
        """A var that is read (a DataflowVar too)."""

    def visit_var_def(self, v: Var) -> None:
        """The var of a binding or match_cast, after its value."""

    def visit_constant(self, e: Constant) -> None:
        pass

    def visit_shape_expr(self, e: ShapeExpr) -> None:
        pass

    def visit_prim_value(self, e: PrimValue) -> None:
        pass

    def visit_string_imm(self, e: StringImm) -> None:
        pass

    def visit_global_var(self, e: GlobalVar) -> None:
        pass

    def visit_extern_func(self, e: ExternFunc) -> None:
        pass

    def visit_op_ref(self, e: OpRef) -> None:
        pass

    # -- compounds ------------------------------------------------------------------------

    def visit_call(self, e: Call) -> None:
        self.visit(e.callee)
        for a in e.args:
            self.visit(a)

    def visit_tuple(self, e: Tuple) -> None:
        for f in e.fields:
            self.visit(f)

    def visit_tuple_get_item(self, e: TupleGetItem) -> None:
        self.visit(e.tuple_value)

    def visit_if(self, e: If) -> None:
        self.visit(e.cond)
        self.visit_seq_expr(e.then_branch)
        self.visit_seq_expr(e.else_branch)

    def visit_seq_expr(self, e: SeqExpr) -> None:
        for block in e.blocks:
            self.visit_block(block)
        self.visit(e.body)

    def visit_block(self, block: BindingBlock) -> None:
        for b in block.bindings:
            if isinstance(b, MatchCast):
                self.visit_match_cast(b)
            else:
                self.visit_binding(b)

    def visit_binding(self, b: Binding) -> None:
        self.visit(b.value)
        self.visit_var_def(b.var)

    def visit_match_cast(self, b: MatchCast) -> None:
        self.visit(b.value)
        self.visit_var_def(b.var)


ExprVisitor._table = _build_table(ExprVisitor, "visit_")


class ExprMutator:
    """Rebuilds a graph expression bottom-up; see the module docstring for what is kept."""

    _table: ClassVar[_Table]
    keep_info: ClassVar[bool] = True  # a rebuilt node keeps the old node's struct info

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._table = _build_table(cls, "mutate_")

    def __init__(self, var_map: dict[Var, Expr] | None = None) -> None:
        self.var_map: dict[Var, Expr] = {} if var_map is None else var_map  # shared, not copied

    def mutate(self, e: Expr) -> Expr:
        fn = self._table.get(type(e)) or _resolve(type(self), "mutate_", type(e))
        new: Expr = fn(self, e)
        return new

    def mutate_other(self, e: Any) -> Expr:
        raise TypeError(f"{type(e).__name__} is not a graph expression")

    def info_of(self, old: Expr) -> StructInfo:
        """The struct info of a node rebuilt in place of ``old``."""
        return old.info if self.keep_info else AnyInfo()

    # -- leaves ---------------------------------------------------------------------------

    def mutate_var(self, e: Var) -> Expr:
        """A var that is read (a DataflowVar too): its ``var_map`` entry, else itself."""
        return self.var_map.get(e, e)

    def mutate_var_def(self, v: Var) -> Var:
        """The var that a binding or match_cast binds in the result, after its value."""
        return v

    def mutate_constant(self, e: Constant) -> Expr:
        return e

    def mutate_shape_expr(self, e: ShapeExpr) -> Expr:
        return e

    def mutate_prim_value(self, e: PrimValue) -> Expr:
        return e

    def mutate_string_imm(self, e: StringImm) -> Expr:
        return e

    def mutate_global_var(self, e: GlobalVar) -> Expr:
        return e

    def mutate_extern_func(self, e: ExternFunc) -> Expr:
        return e

    def mutate_op_ref(self, e: OpRef) -> Expr:
        return e

    # -- compounds ------------------------------------------------------------------------

    def mutate_call(self, e: Call) -> Expr:
        callee = self.mutate(e.callee)
        args = tuple([self.mutate(a) for a in e.args])
        if callee is e.callee and _same(args, e.args):
            return e
        return Call(callee, args, e.attrs, e.sinfo_args, self.info_of(e))

    def mutate_tuple(self, e: Tuple) -> Expr:
        fields = tuple([self.mutate(f) for f in e.fields])
        return e if _same(fields, e.fields) else Tuple(fields, self.info_of(e))

    def mutate_tuple_get_item(self, e: TupleGetItem) -> Expr:
        t = self.mutate(e.tuple_value)
        return e if t is e.tuple_value else TupleGetItem(t, e.index, self.info_of(e))

    def mutate_if(self, e: If) -> Expr:
        cond = self.mutate(e.cond)
        then_b, else_b = self.mutate_seq_expr(e.then_branch), self.mutate_seq_expr(e.else_branch)
        if cond is e.cond and then_b is e.then_branch and else_b is e.else_branch:
            return e
        return If(cond, then_b, else_b, self.info_of(e))

    def mutate_seq_expr(self, e: SeqExpr) -> SeqExpr:
        blocks = tuple([self.mutate_block(b) for b in e.blocks])
        body = self.mutate(e.body)
        if body is e.body and _same(blocks, e.blocks):
            return e
        return SeqExpr(blocks, body, self.info_of(e))

    def mutate_block(self, block: BindingBlock) -> BindingBlock:
        """The block with each binding mutated; a DataflowBlock stays one."""
        bindings = tuple([self.mutate_match_cast(b) if isinstance(b, MatchCast) else self.mutate_binding(b) for b in block.bindings])
        return block if _same(bindings, block.bindings) else replace(block, bindings=bindings)

    def mutate_binding(self, b: Binding) -> AnyBinding:
        value = self.mutate(b.value)
        var = self.mutate_var_def(b.var)
        return b if value is b.value and var is b.var else Binding(var, value)

    def mutate_match_cast(self, b: MatchCast) -> AnyBinding:
        value = self.mutate(b.value)
        var = self.mutate_var_def(b.var)
        return b if value is b.value and var is b.var else MatchCast(var, value, b.cast_info)


ExprMutator._table = _build_table(ExprMutator, "mutate_")


class _Substitute(ExprMutator):
    keep_info = False


def substitute(e: Expr, mapping: dict[Var, Expr]) -> Expr:
    """``e`` with the vars it reads replaced per ``mapping``; the nodes on the way to a
    replacement are rebuilt with ``AnyInfo`` (a ``BlockBuilder`` infers it again), the rest
    is ``e``'s own."""
    return _Substitute(mapping).mutate(e)


__all__ = ["ExprVisitor", "ExprMutator", "substitute"]
