"""Rebuilding graph functions binding by binding.

``FuncRewriter`` re-emits every binding of a function through a ``BlockBuilder`` so that struct
info is re-inferred and A-normal form is kept, while a subclass changes what it wants by
overriding ``rewrite_value`` (the common case: replace a call by another expression) or
``visit_binding`` (full control). Variables are remapped to their new versions as it goes.
"""

from __future__ import annotations

from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Binding, DataflowVar, Expr, GraphFunc, If, MatchCast, SeqExpr, Var
from tilework.ir.module import IRModule
from tilework.ir.visitor import substitute


class FuncRewriter:
    """Rewrite the graph functions of a module; subclasses override the hooks."""

    def __init__(self, mod: IRModule) -> None:
        self.mod = mod
        self.bb = BlockBuilder(mod)
        self.var_map: dict[Var, Expr] = {}

    # -- entry points ---------------------------------------------------------------------

    def run(self) -> IRModule:
        """Rewrite every graph function; other functions are kept as they are."""
        for name, func in list(self.mod.graph_funcs()):
            self.bb.add_func(name, self.rewrite_func(name, func))
        return self.finish()

    def finish(self) -> IRModule:
        return self.bb.get()

    def rewrite_func(self, name: str, func: GraphFunc) -> GraphFunc:
        self.var_map = {}
        self.func_name = name
        with self.bb.function(name, func.params, func.attrs, pure=func.pure):
            for block in func.body.blocks:
                if block.is_dataflow:
                    with self.bb.dataflow():
                        for b in block.bindings:
                            self.visit_binding(b, in_dataflow=True)
                else:
                    for b in block.bindings:
                        self.visit_binding(b, in_dataflow=False)
            out = self.remap(func.body.body)
            self.bb.emit_func_output(out, ret_info=func.ret_info)
        result = self.bb.get()[name]
        assert isinstance(result, GraphFunc)
        return result

    # -- hooks ----------------------------------------------------------------------------

    def rewrite_value(self, binding: Binding, value: Expr) -> Expr:
        """The new value for a binding; ``value`` already has its vars remapped."""
        return value

    def visit_binding(self, b: Binding | MatchCast, in_dataflow: bool) -> None:
        if isinstance(b, MatchCast):
            escapes = in_dataflow and not isinstance(b.var, DataflowVar)
            self.var_map[b.var] = self.bb.match_cast(self.remap(b.value), b.cast_info, name=b.var.name, output=escapes)
            return
        value = b.value
        if isinstance(value, If):
            self.var_map[b.var] = self.bb.emit_if(
                self.remap(value.cond),
                lambda: self._branch(value.then_branch),
                lambda: self._branch(value.else_branch),
                name=b.var.name,
            )
            return
        new_value = self.rewrite_value(b, self.remap(value))
        self.emit_like(b.var, new_value, in_dataflow)

    # -- helpers --------------------------------------------------------------------------

    def emit_like(self, old: Var, value: Expr, in_dataflow: bool) -> Var:
        """Bind ``value`` to a var that plays ``old``'s role (dataflow-local or escaping)."""
        if in_dataflow and not isinstance(old, DataflowVar):
            new = self.bb.emit_output(value, name=old.name)
        else:
            new = self.bb.emit(value, name=old.name)
        self.var_map[old] = new
        return new

    def _branch(self, seq: SeqExpr) -> Expr:
        for block in seq.blocks:
            for b in block.bindings:
                self.visit_binding(b, in_dataflow=False)
        return self.remap(seq.body)

    def remap(self, e: Expr) -> Expr:
        """``e`` with every var replaced by its new version."""
        return substitute(e, self.var_map)
