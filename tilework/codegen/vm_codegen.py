"""VM codegen: bytecode for the graph functions of a lowered module.

Generation expects the output of the lowering pipeline: no dataflow blocks, every op call
lowered to a ``vm_*`` op (a VM builtin of the same name, called with the call's arguments and
then its attributes in declared order), a kernel call, an extern call or a graph-function
call. The instruction set is documented in ``tilework.runtime.bytecode``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilework.errors import BuildError
from tilework.ir import opdef
from tilework.ir.graph import (
    AnyBinding,
    Call,
    Constant,
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
from tilework.ir.loop import TensorFunc
from tilework.ir.module import IRModule
from tilework.runtime.bytecode import Instr, VMFunction


@dataclass
class _FuncGen:
    mod: IRModule
    constants: list[np.ndarray]
    const_index: dict[int, int]
    regs: dict[Var, int] = field(default_factory=dict)
    code: list[Instr] = field(default_factory=list)
    num_regs: int = 0

    def new_reg(self) -> int:
        self.num_regs += 1
        return self.num_regs - 1

    def reg_of(self, v: Var) -> int:
        try:
            return self.regs[v]
        except KeyError:
            raise BuildError(f"VM codegen: %{v.name} is used before it is defined") from None

    def const(self, c: Constant) -> tuple[str, int]:
        idx = self.const_index.get(id(c))
        if idx is None:
            idx = len(self.constants)
            self.constants.append(c.data)
            self.const_index[id(c)] = idx
        return ("c", idx)

    def arg(self, e: Expr) -> tuple[str, Any]:
        if isinstance(e, Var):
            return ("r", self.reg_of(e))
        if isinstance(e, Constant):
            return self.const(e)
        if isinstance(e, ShapeExpr):
            if not all(isinstance(d, int) for d in e.values):
                raise BuildError("VM codegen: a symbolic shape reached the VM (run lower_shapes first)")
            return ("i", tuple(e.values))
        if isinstance(e, PrimValue):
            if not isinstance(e.value, (int, float, bool)):
                raise BuildError("VM codegen: a symbolic prim value reached the VM (run lower_shapes first)")
            return ("i", e.value)
        if isinstance(e, StringImm):
            return ("i", e.value)
        if isinstance(e, (Tuple, TupleGetItem)):
            return ("r", self.materialize(e))
        raise BuildError(f"VM codegen: cannot pass {type(e).__name__} as an argument")

    def materialize(self, e: Expr) -> int:
        """A register holding the value of ``e``."""
        if isinstance(e, Var):
            return self.reg_of(e)
        dst = self.new_reg()
        self.emit_value(dst, e)
        return dst

    def emit_call(self, dst: int, kind: str, name: str, args: list[tuple[str, Any]]) -> None:
        self.code.append(("call", dst, (kind, name), tuple(args)))

    def emit_value(self, dst: int, value: Expr) -> None:
        if isinstance(value, Call):
            self.emit_call_expr(dst, value)
        elif isinstance(value, Tuple):
            self.emit_call(dst, "builtin", "vm.make_tuple", [self.arg(f) for f in value.fields])
        elif isinstance(value, TupleGetItem):
            self.emit_call(dst, "builtin", "vm.tuple_getitem", [self.arg(value.tuple_value), ("i", value.index)])
        elif isinstance(value, If):
            self.emit_if(dst, value)
        elif isinstance(value, (Constant, ShapeExpr, PrimValue, StringImm, Var)):
            self.emit_call(dst, "builtin", "vm.copy", [self.arg(value)])
        else:
            raise BuildError(f"VM codegen: cannot run a {type(value).__name__} binding")

    def emit_call_expr(self, dst: int, call: Call) -> None:
        callee = call.callee
        if isinstance(callee, OpRef):
            op = opdef.get(callee.name)
            if not callee.name.startswith("vm_"):
                raise BuildError(f"op {callee.name} reached the VM: it has no lowering (legalize it first)")
            args = [self.arg(a) for a in call.args] + [("i", call.attrs[k]) for k in op.attrs]
            self.emit_call(dst, "builtin", callee.name, args)
            return
        args = [self.arg(a) for a in call.args]
        if isinstance(callee, ExternFunc):
            self.emit_call(dst, "extern", callee.symbol, args)
        elif isinstance(callee, GlobalVar):
            func = self.mod.get(callee.name)
            if isinstance(func, TensorFunc):
                self.emit_call(dst, "kernel", callee.name, args)
            elif isinstance(func, GraphFunc):
                self.emit_call(dst, "func", callee.name, args)
            elif isinstance(func, ExternFunc):
                self.emit_call(dst, "extern", func.symbol, args)
            else:
                raise BuildError(f"call of @{callee.name}, which is not in the module")
        else:
            raise BuildError(f"VM codegen: cannot call a {type(callee).__name__}")

    def emit_if(self, dst: int, e: If) -> None:
        cond = self.new_reg()
        self.emit_call(cond, "builtin", "vm_read_if_cond", [self.arg(e.cond)])
        branch_at = len(self.code)
        self.code.append(("if", cond, -1))
        self.emit_seq_into(dst, e.then_branch)
        goto_at = len(self.code)
        self.code.append(("goto", -1))
        else_pc = len(self.code)
        self.emit_seq_into(dst, e.else_branch)
        end_pc = len(self.code)
        self.code[branch_at] = ("if", cond, else_pc)
        self.code[goto_at] = ("goto", end_pc)

    def emit_seq_into(self, dst: int, seq: SeqExpr) -> None:
        self.emit_bindings(seq)
        self.emit_call(dst, "builtin", "vm.copy", [self.arg(seq.body)])

    def emit_bindings(self, seq: SeqExpr) -> None:
        for block in seq.blocks:
            for b in block.bindings:
                self.emit_binding(b)

    def emit_binding(self, b: AnyBinding) -> None:
        value = b.value
        if isinstance(b, MatchCast):
            # lower_shapes has emitted the checks before it: the cast names the checked value
            self.regs[b.var] = self.reg_of(value) if isinstance(value, Var) else self.materialize(value)
            return
        if isinstance(value, Var):
            self.regs[b.var] = self.reg_of(value)  # an alias shares the register
            return
        if isinstance(value, Call) and isinstance(value.callee, OpRef) and value.callee.name == "vm_kill":
            target = value.args[0]
            if isinstance(target, Var):
                r = self.reg_of(target)
                self.emit_call(r, "builtin", "vm_kill", [("r", r)])
            return
        dst = self.new_reg()
        self.regs[b.var] = dst
        self.emit_value(dst, value)


def generate(mod: IRModule) -> tuple[dict[str, VMFunction], list[np.ndarray]]:
    """Bytecode for every graph function of a lowered module, and the constant pool."""
    constants: list[np.ndarray] = []
    const_index: dict[int, int] = {}
    funcs: dict[str, VMFunction] = {}
    for name, f in mod.graph_funcs():
        gen = _FuncGen(mod, constants, const_index)
        for p in f.params:
            gen.regs[p] = gen.new_reg()
        gen.emit_bindings(f.body)
        ret = gen.materialize(f.body.body)
        gen.code.append(("ret", ret))
        funcs[name] = VMFunction(name, tuple(p.name for p in f.params), gen.num_regs, tuple(gen.code))
    return funcs, constants
