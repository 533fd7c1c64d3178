"""rewrite_reshape_to_view: kernels that only copy their input into a new shape become views.

After legalize, ``reshape``, ``flatten``, ``squeeze`` and ``expand_dims`` are kernels that copy
every element of their input, in row-major order, into an output of another shape. Such a
``call_tensor(@k, (x,), out=Tensor(shape, dtype))`` becomes ``vm_view(x, shape(...))``: the
VM returns ``x.reshape(shape)``, a view sharing ``x``'s memory (the VM's tensors are
contiguous), so no kernel runs and nothing is allocated.

A kernel qualifies by its structure, whatever op it came from (``is_reshape_kernel``): one input
and one output buffer of the same dtype; a perfect loop nest, each loop feeding one spatial
iter var of the same extent, around a single block without ``init`` whose only statement is
``out[v0, ..., vk] = in[idx]`` with the iter vars in order over the output's shape; after
dropping the unit dims of both sides, ``idx`` is provably the row-major reshape index
(``tilework.op.kernel.reshape_index``) and both sides hold provably the same number of
elements. Symbolic dims are fine (``(n, m) -> (n * m,)``). Kernels left unused by the rewrite
are removed from the module.

Requires a legalized module, before scheduling (a scheduled kernel no longer has the plain
loop nest and is kept as it is). Guarantees a well-formed module computing the same values; the
value of each rewritten binding aliases its input's memory. ``lower_calls`` keeps ``vm_view``
as it is and ``lower_shapes`` makes its shape argument concrete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard

from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.graph import Call, Expr, GlobalVar, ShapeExpr, Tuple
from tilework.ir.info import TensorInfo
from tilework.ir.loop import Block, For, Load, Scalar, Store, TensorFunc
from tilework.ir.module import IRModule
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.op import vm as _vm_ops  # noqa: F401  (registers vm_view)
from tilework.op.base import make_call
from tilework.op.kernel import reshape_index
from tilework.transform.dead_code_elimination import referenced_globals
from tilework.transform.base import Pass
from tilework.pattern.core import Match, op_call
from tilework.transform.rewrite_driver import Rule, apply_rules


def _is_index(x: Scalar) -> TypeGuard[Dim]:
    return isinstance(x, (int, SymExpr))


def _same(a: Dim, b: Dim) -> bool:
    return a is b or sym.prove_eq(a, b)


def _single_block(func: TensorFunc) -> Block | None:
    """The one block of a perfect loop nest whose loops feed its iter vars one to one."""
    loops: list[For] = []
    s = func.body
    while isinstance(s, For):
        loops.append(s)
        s = s.body
    if not isinstance(s, Block) or s.init is not None or len(s.iter_vars) != len(loops):
        return None
    for loop, iv in zip(loops, s.iter_vars):
        if iv.kind != "spatial" or iv.binding is not loop.var or not _same(iv.extent, loop.extent):
            return None
    return s


def is_reshape_kernel(func: TensorFunc) -> bool:
    """Whether ``func`` copies its one input into its one output in row-major order."""
    if func.num_outputs != 1 or len(func.inputs) != 1:
        return False
    src, dst = func.inputs[0], func.outputs[0]
    if src.dtype != dst.dtype:
        return False
    block = _single_block(func)
    if block is None or not isinstance(block.body, Store):
        return False
    store = block.body
    ivars = [iv.var for iv in block.iter_vars]
    if store.buffer is not dst or len(store.indices) != len(dst.shape) or len(ivars) != len(dst.shape):
        return False
    if any(i is not v for i, v in zip(store.indices, ivars)):
        return False
    if any(not _same(iv.extent, d) for iv, d in zip(block.iter_vars, dst.shape)):
        return False
    load = store.value
    if not isinstance(load, Load) or load.buffer is not src or not all(_is_index(i) for i in load.indices):
        return False
    return _row_major(list(load.indices), src.shape, ivars, dst.shape)


def _row_major(idx: list[Scalar], in_shape: tuple[Dim, ...], ivars: list[SymVar], out_shape: tuple[Dim, ...]) -> bool:
    """``in[idx]`` over ``out``'s iter vars is the row-major reshape, unit dims aside."""
    unit = {v: 0 for v, d in zip(ivars, out_shape) if d == 1}
    idx_dims = [sym_walk.substitute(i, unit) for i in idx if isinstance(i, (int, SymExpr))]
    kept_idx: list[Dim] = []
    kept_in: list[Dim] = []
    for i, d in zip(idx_dims, in_shape):
        if d == 1:
            if not _same(i, 0):
                return False
            continue
        kept_idx.append(i)
        kept_in.append(d)
    kept_vars = [v for v, d in zip(ivars, out_shape) if d != 1]
    kept_out = [d for d in out_shape if d != 1]
    if not _same(sym.product(kept_in), sym.product(kept_out)):
        return False
    expected = reshape_index(kept_vars, kept_out, kept_in)
    return len(expected) == len(kept_idx) and all(_is_index(e) and _same(a, e) for a, e in zip(kept_idx, expected))


class _Views:
    def __init__(self, mod: IRModule) -> None:
        self.mod = mod
        self.verdicts: dict[str, bool] = {}
        self.rewritten: set[str] = set()

    def qualifies(self, name: str) -> bool:
        got = self.verdicts.get(name)
        if got is None:
            func = self.mod.get(name)
            got = self.verdicts[name] = isinstance(func, TensorFunc) and is_reshape_kernel(func)
        return got

    def rewrite(self, value: Expr, m: Match) -> Expr | None:
        assert isinstance(value, Call)
        gv, args = value.args[0], value.args[1]
        if not isinstance(gv, GlobalVar) or not isinstance(args, Tuple) or len(args.fields) != 1:
            return None
        out = value.sinfo_args[0] if len(value.sinfo_args) == 1 else None
        if not isinstance(out, TensorInfo) or out.shape is None or not self.qualifies(gv.name):
            return None
        x = args.fields[0]
        if not isinstance(x.info, TensorInfo) or x.info.dtype != out.dtype:
            return None
        self.rewritten.add(gv.name)
        return make_call("vm_view", [x, ShapeExpr.of(out.shape)])


@dataclass(frozen=True)
class RewriteReshapeToView(Pass):
    name: str = "rewrite_reshape_to_view"

    def run(self, mod: IRModule) -> IRModule:
        views = _Views(mod)
        rule = Rule("reshape_to_view", op_call("call_tensor"), views.rewrite)
        out = apply_rules(mod, (rule,), inline_aliases=False)
        used: set[str] = set()
        for _, f in out.graph_funcs():
            used |= referenced_globals(f)
        for name in views.rewritten - used:
            out = out.without(name)
        return out


__all__ = ["RewriteReshapeToView", "is_reshape_kernel"]
