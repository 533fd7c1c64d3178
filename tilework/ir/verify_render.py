"""Rendering of verifier diagnostics: the function with the offending binding or statement
marked (through the text printer when it can print the IR, else a compact fallback)."""

from __future__ import annotations

from typing import Iterable, Union

from tilework.ir import display
from tilework.ir import loop as L
from tilework.ir import sym
from tilework.ir.sym import SymExpr
from tilework.ir.graph import AnyBinding, Binding, Call, ExternFunc, GlobalVar, GraphFunc, MatchCast, OpRef, PrimValue, ShapeExpr, Tuple, Var
from tilework.ir.info import StructInfo
from tilework.ir.module import Function

Where = Union[Binding, MatchCast, L.Stmt, None]


def _render(name: str, func: Function, where: Where, note: str) -> str:
    """``func`` printed with ``where`` marked and ``note`` beside the carets: the text printer's
    form when it can print it, else a compact one (the signature and the marked binding)."""
    printer = display.printer()
    if printer is not None:
        try:
            return str(printer.print_func(name, func, highlight=where, note=note))
        except Exception:  # the printer may choke on the very IR being reported; never hide the error
            pass
    lines = [f"  {_signature(name, func)}:"]
    if where is not None:
        text = _binding_str(where) if isinstance(where, (Binding, MatchCast)) else _stmt_str(where)
        lines += [f"    {text}", f"    {'^' * len(text)}"]
    lines.append(f"    {note}")
    return "\n".join(lines)


def _info_str(info: StructInfo) -> str:
    """Struct info as the text format writes it: ``Tensor((n, 4), "float32")``."""
    printer = display.printer()
    if printer is not None:
        try:
            return str(printer.print_info(info))
        except Exception:  # a malformed info must still be reported
            pass
    return repr(info)


def _signature(name: str, func: Function) -> str:
    if isinstance(func, GraphFunc):
        params = ", ".join(f"%{p.name}: {_info_str(p.info)}" for p in func.params)
        return f"def @{name}({params}) -> {_info_str(func.ret_info)}"
    return f"tensor @{name}" if isinstance(func, L.TensorFunc) else f"@{name}"


def _dim_str(d: object) -> str:
    return sym.to_str(d) if isinstance(d, (int, SymExpr)) else "..."


def _shape_str(dims: Iterable[object]) -> str:
    return "shape(" + ", ".join(_dim_str(d) for d in dims) + ")"


def _expr_str(e: object) -> str:
    """A compact form of a graph expression for messages: leaves in full, compounds shallowly."""
    if isinstance(e, (Var, GlobalVar, OpRef)):
        return repr(e)
    if isinstance(e, ExternFunc):
        return f"extern({e.symbol!r})"
    if isinstance(e, ShapeExpr):
        return _shape_str(e.values)
    if isinstance(e, PrimValue):
        return _dim_str(e.value) if isinstance(e.value, (int, SymExpr)) else repr(e.value)
    if isinstance(e, Tuple):
        return "(" + ", ".join(_expr_str(f) for f in e.fields) + ("," if len(e.fields) == 1 else "") + ")"
    if isinstance(e, Call):
        return f"{_expr_str(e.callee)}(" + ", ".join(_expr_str(a) for a in e.args) + ")"
    return f"<{type(e).__name__}>"


def _callee_str(e: Call) -> str:
    c = e.callee
    if isinstance(c, OpRef) and c.name in ("call_tensor", "call_lib", "call_packed") and e.args:
        return f"{c.name}({_expr_str(e.args[0])})"
    return _expr_str(c)


def _binding_str(b: AnyBinding) -> str:
    if isinstance(b, MatchCast):
        return f"%{b.var.name} = match_cast({_expr_str(b.value)}, {_info_str(b.cast_info)})"
    return f"%{b.var.name}: {_info_str(b.var.info)} = {_expr_str(b.value)}"


def _stmt_str(s: Where) -> str:
    if isinstance(s, L.Store):
        return f"store to {s.buffer.name}[{', '.join(_dim_str(i) for i in s.indices)}]"
    if isinstance(s, L.For):
        return f"for {s.var.name} in range({sym.to_str(s.extent)}) ({s.kind})"
    if isinstance(s, L.Block):
        return f"block {s.name}({', '.join(f'{iv.var.name}: {iv.kind}' for iv in s.iter_vars)})"
    if isinstance(s, L.Allocate):
        return f"allocate {s.buffer.name}"
    return type(s).__name__


