"""kill_after_last_use: release each tensor right after its last use.

Requires a lowered module (no dataflow blocks). After the binding holding the last use of a
tensor (or tuple) value — counting uses through aliases (``y = x``) and inside If branches —
it inserts ``vm_kill(x)``, which drops the VM register's reference so the memory returns to the
allocator (or its pool) while the function still runs. Parameters and returned values are never
killed, nor are values that own no memory: tensors carved from planned storage
(``vm_alloc_tensor_from_storage``: the plan frees the storage itself) and views of them (a kill
would cost an instruction and free nothing). Guarantees: no binding after a kill reads the
killed value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard

from tilework.ir.graph import (
    used_vars,
    AnyBinding,
    Binding,
    BindingBlock,
    Call,
    GraphFunc,
    OpRef,
    If,
    SeqExpr,
    Var,
)
from tilework.ir.info import TensorInfo, TupleInfo
from tilework.ir.module import IRModule
from tilework.op import vm as _vm_ops  # noqa: F401  (registers vm_kill)
from tilework.transform.lower_shapes import VOID, _vm_call
from tilework.transform.base import Pass


def _kill_in_seq(seq: SeqExpr, keep: set[Var]) -> SeqExpr:
    bindings = [b for block in seq.blocks for b in block.bindings]
    root: dict[Var, Var] = {}
    carved: set[Var] = set()  # values that own no memory (see the module docstring)
    for b in bindings:
        if isinstance(b.value, Var):  # an alias (y = x, or a checked match_cast): one value
            root[b.var] = root.get(b.value, b.value)
        elif _is_call(b.value, "vm_alloc_tensor_from_storage"):
            carved.add(b.var)
        elif _is_call(b.value, "vm_view") and isinstance(b.value.args[0], Var) and root.get(b.value.args[0], b.value.args[0]) in carved:
            carved.add(b.var)
    keep_roots = {root.get(v, v) for v in keep} | {root.get(v, v) for v in used_vars(seq.body)}
    last: dict[Var, int] = {}
    for i, b in enumerate(bindings):
        for v in used_vars(b.value):
            last[root.get(v, v)] = i
    kills: dict[int, list[Var]] = {}
    for i, b in enumerate(bindings):
        r = root.get(b.var, b.var)
        if r is not b.var or r in keep_roots or r in carved or not isinstance(b.var.info, (TensorInfo, TupleInfo)):
            continue
        if b.var.info == VOID:
            continue
        at = last.get(r)
        if at is not None and at > i:
            kills.setdefault(at, []).append(r)
    out: list[AnyBinding] = []
    for i, b in enumerate(bindings):
        if isinstance(b, Binding) and isinstance(b.value, If):
            inner_keep = keep | set(used_vars(seq.body))
            b = Binding(b.var, If(b.value.cond, _kill_in_seq(b.value.then_branch, inner_keep), _kill_in_seq(b.value.else_branch, inner_keep), b.value.info))
        out.append(b)
        for r in kills.get(i, []):
            out.append(Binding(Var("_kill", VOID), _vm_call("vm_kill", [r])))
    return SeqExpr((BindingBlock(tuple(out)),) if out else (), seq.body, seq.info)


def _is_call(e: object, name: str) -> TypeGuard[Call]:
    return isinstance(e, Call) and isinstance(e.callee, OpRef) and e.callee.name == name


@dataclass(frozen=True)
class KillAfterLastUse(Pass):
    name: str = "kill_after_last_use"

    def run(self, mod: IRModule) -> IRModule:
        out = mod
        for name, f in mod.graph_funcs():
            out = out.with_func(name, _kill_func(f))
        return out


def _kill_func(f: GraphFunc) -> GraphFunc:
    return f.replace(body=_kill_in_seq(f.body, set(f.params)))


__all__ = ["KillAfterLastUse"]
