"""The loop-level rule of the well-formedness checker (``tilework.ir.verify``, rule 9):
``LoopCheck`` walks one TensorFunc."""

from __future__ import annotations

from typing import Iterable

from tilework.ir import loop as L
from tilework.ir import sym_walk
from tilework.ir.sym import SymExpr, SymVar
from tilework.ir.verify_base import Checker, Diagnostic, dims_syms
from tilework.ir.verify_render import Where

_SCALAR_OPS = L.BINARY_OPS + L.COMPARE_OPS + L.LOGICAL_OPS


class LoopCheck(Checker):
    """Walks one TensorFunc, tracking the buffers and sym vars in scope at each statement."""

    def __init__(self, name: str, func: L.TensorFunc, out: list[Diagnostic]) -> None:
        super().__init__(name, func, out)
        self.tfunc = func
        self.bound: dict[SymVar, str] = {}  # every sym var bound so far -> by what
        self.buffers: set[L.Buffer] = set()  # every buffer defined so far

    def bad(self, message: str, where: Where = None, once: object = None) -> None:
        self.emit("loop", message, where, once)

    def run(self) -> None:
        f = self.tfunc
        n_bufs = len(f.buffers)
        if not 0 <= f.num_outputs <= n_bufs:
            self.bad(f"num_outputs is {f.num_outputs} but @{self.name} has {n_bufs} buffer param(s): outputs are the last buffer params")
        syms: set[SymVar] = set()
        for p in f.params:
            if isinstance(p, SymVar):
                syms.add(p)
                self.bound.setdefault(p, "a sym param")
            elif isinstance(p, L.Buffer):
                if p in self.buffers:
                    self.bad(f"buffer {p.name} is a param twice")
                self.buffers.add(p)
                for d in p.shape:
                    if isinstance(d, SymVar):
                        syms.add(d)
                        self.bound.setdefault(d, f"the shape of buffer {p.name}")
            else:
                self.bad(f"param {p!r} is a {type(p).__name__}, not a Buffer or SymVar")
        for b in f.buffers:
            self.syms_in(dims_syms(b.shape), syms, f"the shape of buffer {b.name}", None)
        self.stmt(f.body, frozenset(self.buffers), frozenset(syms))

    def syms_in(self, used: Iterable[SymVar], syms: frozenset[SymVar] | set[SymVar], what: str, where: Where) -> None:
        for v in used:
            if v not in syms:
                msg = f"{what} uses sym var {v.name}, which is not defined here: sym vars come from sym params"
                self.bad(msg + ", bare dims of buffer params, and enclosing loops and block iter vars", where, ("sym", v))

    def bind(self, v: SymVar, how: str, where: Where) -> None:
        first = self.bound.get(v)
        if first is not None:
            self.bad(f"{how} binds {v.name}, already bound by {first}: give it a fresh SymVar", where)
        else:
            self.bound[v] = how

    def stmt(self, s: L.Stmt, bufs: frozenset[L.Buffer], syms: frozenset[SymVar]) -> None:
        if isinstance(s, L.SeqStmt):
            for child in s.stmts:
                self.stmt(child, bufs, syms)
        elif isinstance(s, L.Store):
            self.access(s.buffer, len(s.indices), bufs, "store to", s)
            for x in (*s.indices, s.value):
                self.scalar(x, bufs, syms, s)
        elif isinstance(s, L.For):
            if s.kind not in L.LOOP_KINDS:
                self.bad(f"loop {s.var.name} has kind {s.kind!r}; loop kinds are {', '.join(L.LOOP_KINDS)}", s)
            self.syms_in(dims_syms([s.extent]), syms, f"the extent of loop {s.var.name}", s)
            self.bind(s.var, f"loop {s.var.name}", s)
            self.stmt(s.body, bufs, syms | {s.var})
        elif isinstance(s, L.Block):
            self.block(s, bufs, syms)
        elif isinstance(s, L.Allocate):
            b = s.buffer
            self.syms_in(dims_syms(b.shape), syms, f"the shape of buffer {b.name}", s)
            if b in self.buffers:
                self.bad(f"buffer {b.name} is allocated but already defined: allocate a fresh Buffer", s)
            self.buffers.add(b)
            self.stmt(s.body, bufs | {b}, syms)
        elif isinstance(s, L.IfThenElse):
            self.scalar(s.cond, bufs, syms, s)
            self.stmt(s.then_body, bufs, syms)
            if s.else_body is not None:
                self.stmt(s.else_body, bufs, syms)
        else:
            self.bad(f"the body holds a {type(s).__name__}, which is not a loop-level statement")

    def block(self, s: L.Block, bufs: frozenset[L.Buffer], syms: frozenset[SymVar]) -> None:
        inner = set(syms)
        for iv in s.iter_vars:
            what = f"iter var {iv.var.name} of block {s.name}"
            if iv.kind not in ("spatial", "reduce"):
                self.bad(f"{what} has kind {iv.kind!r}; kinds are 'spatial' and 'reduce'", s)
            self.syms_in(dims_syms([iv.extent, iv.binding]), syms, what, s)
            self.bind(iv.var, what, s)
            inner.add(iv.var)
        for b in s.reads + s.writes:
            self.access(b, None, bufs, f"block {s.name} accesses", s)
        for body in (s.init, s.body):
            if body is not None:
                self.stmt(body, bufs, frozenset(inner))

    def access(self, b: L.Buffer, n_indices: int | None, bufs: frozenset[L.Buffer], what: str, where: Where) -> None:
        if b not in bufs:
            msg = f"{what} buffer {b.name}, which is neither a param of @{self.name} nor allocated around this use"
            self.bad(msg + ": add it as a param or wrap the use in Allocate", where, ("buf", b, id(where)))
        if n_indices is not None and n_indices != len(b.shape):
            msg = f"{what} {b.name} with {n_indices} index(es) but {b.name} has rank {len(b.shape)}"
            self.bad(msg + ": give one index per dim", where)

    def scalar(self, x: L.Scalar, bufs: frozenset[L.Buffer], syms: frozenset[SymVar], where: Where) -> None:
        for e in L.walk_scalars(x):
            if isinstance(e, SymExpr):
                self.syms_in(sym_walk.free_vars(e), syms, f"this {type(where).__name__}", where)
            elif isinstance(e, L.Load):
                self.access(e.buffer, len(e.indices), bufs, "load from", where)
            elif isinstance(e, L.Binary) and e.op not in _SCALAR_OPS:
                self.bad(f"binary op {e.op!r} is unknown; valid ops are {', '.join(_SCALAR_OPS)}", where)
            elif isinstance(e, L.Unary) and e.op not in L.UNARY_OPS:
                self.bad(f"unary op {e.op!r} is unknown; valid ops are {', '.join(L.UNARY_OPS)}", where)
            elif isinstance(e, L.Intrin) and e.name not in L.INTRINSICS:
                self.bad(f"intrinsic {e.name!r} is unknown; valid ones are {', '.join(L.INTRINSICS)}", where)
            elif isinstance(e, L.Intrin) and len(e.args) != L.INTRINSIC_ARITY.get(e.name, 1):
                self.bad(f"intrinsic {e.name} takes {L.INTRINSIC_ARITY.get(e.name, 1)} argument(s), got {len(e.args)}", where)
            elif isinstance(e, L.Intrin) and e.name == L.DOT_BF16X2 and (e.dtype != "float32" or [L.dtype_of(a) for a in e.args] != ["float32"] + ["bfloat16"] * 4):
                self.bad(f"intrinsic {e.name} takes a float32 accumulator and four bfloat16 values and gives float32, got {[L.dtype_of(a) for a in e.args]} -> {e.dtype}", where)
            elif isinstance(e, L.Intrin) and e.name == L.DOT_U8I8X4 and (e.dtype != "int32" or [L.dtype_of(a) for a in e.args] != ["int32"] + ["uint8"] * 4 + ["int8"] * 4):
                self.bad(f"intrinsic {e.name} takes an int32 accumulator, four uint8 and four int8 values and gives int32, got {[L.dtype_of(a) for a in e.args]} -> {e.dtype}", where)
            elif isinstance(e, L.Intrin) and e.name in L.PREFETCHES and not isinstance(e.args[0], L.Load):
                self.bad(f"intrinsic {e.name} takes a load (of the element to prefetch)", where)
            elif not isinstance(e, (int, L.PExpr)):
                self.bad(f"{e!r} (a {type(e).__name__}) is not a scalar expression: wrap constants in Const", where)


__all__ = ["LoopCheck"]
