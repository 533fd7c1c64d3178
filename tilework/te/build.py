"""``create_func``: lower a compute DAG to a loop-level ``TensorFunc``.

Every compute stage becomes one ``Block`` inside a loop nest over its shape (spatial loops
outside, reduction loops inside), in dependence order. A stage whose value is a reduction gets
the block ``init`` (the reducer's identity) and an accumulating body. A reduction nested
inside a larger expression (``te.sum(...) / n``) is lifted into a stage of its own over the
index vars it depends on, so every block holds at most one reduction at its top. Intermediate
stages write scratch buffers that ``Allocate`` wraps around the whole body; outputs write the
output params. Every block gets fresh loop vars and iter vars (iter var ``vX`` bound to loop var
``X``), so the TensorFunc shares no var with the DSL tensors or with another function.

Params are the input buffers, the output buffers, then the sym vars the body needs that no
param buffer has as a bare dim (``(n, m)`` supplies ``n`` and ``m``; ``(n * 2,)`` supplies none),
in order of first use, unless ``sym_params`` fixes them.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping, Sequence

from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.graph import EMPTY_ATTRS, Attrs
from tilework.ir.dtype import is_float_dtype
from tilework.ir.loop import (
    Allocate,
    Binary,
    Block,
    Buffer,
    Cast,
    Const,
    For,
    IfThenElse,
    Intrin,
    IterVar,
    Load,
    PExpr,
    Scalar,
    Select,
    SeqStmt,
    Stmt,
    Store,
    TensorFunc,
    Unary,
    const,
    free_sym_vars,
    stmt_scalars,
    walk_scalars,
    walk_stmts,
)
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.te.tensor import Reduce, ReduceVar, Tensor, TensorLoad, _bounded_var, identity_value

_ACCUMULATE = {"sum": "+", "prod": "*", "max": "max", "min": "min"}


def create_func(
    args: Sequence[Tensor],
    outputs: Sequence[Tensor] | None = None,
    sym_params: Sequence[SymVar] | None = None,
    attrs: Attrs | Mapping[str, object] | None = None,
) -> TensorFunc:
    """The TensorFunc computing ``outputs`` from the input tensors.

    With ``outputs`` None, ``args`` lists the inputs followed by the outputs: the trailing
    computed tensors are the outputs. Otherwise ``args`` are the inputs. An input may be a
    computed tensor (its stage is then not part of the function).
    """
    ins, outs = _split_args(args, outputs)
    lowering = _Lowering(ins, outs)
    body = lowering.run()
    params: list[Buffer | SymVar] = [lowering.buffers[t] for t in (*ins, *outs)]
    needed = _free_syms(body, lowering.bound)
    supplied = {d for b in params if isinstance(b, Buffer) for d in b.shape if isinstance(d, SymVar)}
    for b in params:
        if isinstance(b, Buffer):
            for d in b.shape:
                for v in sym_walk.free_vars(d):
                    needed.setdefault(v, None)
    if sym_params is None:
        params.extend(v for v in needed if v not in supplied)
    else:
        missing = [v.name for v in needed if v not in supplied and v not in sym_params]
        if missing:
            raise ValueError(f"create_func: sym var(s) {', '.join(missing)} are needed but not in sym_params")
        params.extend(sym_params)
    fattrs = attrs if isinstance(attrs, Attrs) else (Attrs(attrs) if attrs else EMPTY_ATTRS)
    return TensorFunc(tuple(params), body, len(outs), fattrs)


def _split_args(args: Sequence[Tensor], outputs: Sequence[Tensor] | None) -> tuple[list[Tensor], list[Tensor]]:
    for t in args:
        if not isinstance(t, Tensor):
            raise TypeError(f"create_func: expected te tensors, got {t!r}")
    if outputs is None:
        k = len(args)
        while k > 0 and not args[k - 1].is_placeholder:
            k -= 1
        ins, outs = list(args[:k]), list(args[k:])
    else:
        ins, outs = list(args), list(outputs)
    if not outs:
        raise ValueError("create_func: no output (a computed tensor) was given")
    for t in outs:
        if t.is_placeholder:
            raise ValueError(f"create_func: output {t.name} is a placeholder; outputs must be computed")
    ids = [id(t) for t in (*ins, *outs)]
    if len(set(ids)) != len(ids):
        raise ValueError("create_func: a tensor is listed twice among inputs and outputs")
    return ins, outs


def walk_te(x: Scalar) -> Iterator[Scalar]:
    """Every sub-expression of a DSL expression, descending into tensor loads and reductions."""
    for e in walk_scalars(x):
        yield e
        if isinstance(e, TensorLoad):
            for i in e.indices:
                yield from walk_te(i)
        elif isinstance(e, Reduce):
            yield from walk_te(e.source)
            if e.where is not None:
                yield from walk_te(e.where)


def _te_free_vars(x: Scalar) -> list[SymVar]:
    out: dict[SymVar, None] = {}
    for e in walk_te(x):
        if isinstance(e, (int, SymExpr)):
            for v in sym_walk.free_vars(e):
                out[v] = None
    return list(out)


class _Lowering:
    def __init__(self, ins: list[Tensor], outs: list[Tensor]) -> None:
        self.inputs = ins
        self.outputs = outs
        self.names: set[str] = set()
        self.block_names: set[str] = set()
        self.buffers: dict[Tensor, Buffer] = {}
        self.scratch: list[Buffer] = []
        self.stmts: list[Stmt] = []
        self.bound: set[SymVar] = set()  # loop vars and iter vars the body introduces

    def fresh(self, name: str, taken: set[str] | None = None) -> str:
        """A name not yet in ``taken`` (buffer names by default), derived from ``name``."""
        used = self.names if taken is None else taken
        base = name if name.isidentifier() else "t"
        out, k = base, 1
        while out in used:
            out, k = f"{base}_{k}", k + 1
        used.add(out)
        return out

    def buffer(self, name: str, shape: tuple[Dim, ...], dtype: str) -> Buffer:
        return Buffer(self.fresh(name), shape, dtype)

    def run(self) -> Stmt:
        for t in (*self.inputs, *self.outputs):
            self.buffers[t] = self.buffer(t.name, t.shape, t.dtype)
        for t in self._order():
            if t not in self.buffers:
                buf = self.buffer(t.name, t.shape, t.dtype)
                self.buffers[t] = buf
                self.scratch.append(buf)
            self._stage(t)
        body: Stmt = self.stmts[0] if len(self.stmts) == 1 else SeqStmt(tuple(self.stmts))
        for buf in reversed(self.scratch):
            body = Allocate(buf, body)
        return body

    def _order(self) -> list[Tensor]:
        """Computed tensors the outputs need, producers before consumers."""
        given = set(self.inputs)
        order: list[Tensor] = []
        state: dict[Tensor, int] = {}

        def visit(t: Tensor, user: Tensor | None) -> None:
            if t in given or state.get(t) == 2:
                return
            if t.stage is None:
                by = f" (used by {user.name})" if user is not None else ""
                raise ValueError(f"create_func: placeholder {t.name}{by} is not among the inputs")
            if state.get(t) == 1:
                raise ValueError(f"create_func: tensor {t.name} depends on itself")
            state[t] = 1
            for e in walk_te(t.stage.body):
                if isinstance(e, TensorLoad):
                    visit(e.tensor, t)
            state[t] = 2
            order.append(t)

        for t in self.outputs:
            visit(t, None)
        return order

    # -- stages ---------------------------------------------------------------------------

    def _stage(self, t: Tensor) -> None:
        assert t.stage is not None
        self._emit(t.name, self.buffers[t], list(zip(t.stage.axes, t.shape)), t.stage.body)

    def _emit(self, name: str, out: Buffer, axes: list[tuple[SymVar, Dim]], body: Scalar) -> None:
        if isinstance(body, Reduce):
            scope = axes + [(a, a.extent) for a in body.axes]
            src = self._lift(name, body.source, scope)
            where = None if body.where is None else self._lift(name, body.where, scope)
            self._reduce_block(name, out, axes, Reduce(body.combiner, src, body.axes, where, body.dtype))
            return
        self._spatial_block(name, out, axes, self._lift(name, body, axes))

    def _lift(self, name: str, x: Scalar, scope: list[tuple[SymVar, Dim]]) -> Scalar:
        """``x`` with every reduction in it computed by a stage of its own and loaded."""
        if not isinstance(x, PExpr):
            return x
        if isinstance(x, Reduce):
            inner = scope + [(a, a.extent) for a in x.axes]
            src = self._lift(name, x.source, inner)
            where = None if x.where is None else self._lift(name, x.where, inner)
            red = Reduce(x.combiner, src, x.axes, where, x.dtype)
            used = set(_te_free_vars(red))
            axes = [(v, e) for v, e in scope if v in used and v not in x.axes]
            buf = self.buffer(f"{name}_{x.combiner}", tuple(e for _, e in axes), x.dtype)
            self.scratch.append(buf)
            self._reduce_block(buf.name, buf, axes, red)
            return Load(buf, tuple(v for v, _ in axes))
        return _rebuild(x, lambda c: self._lift(name, c, scope))

    def _loops(self, axes: list[tuple[SymVar, Dim]], kind: str) -> tuple[list[For], list[IterVar], dict[SymVar, Dim]]:
        loops: list[For] = []
        ivs: list[IterVar] = []
        subst: dict[SymVar, Dim] = {}
        for v, ext in axes:
            lv = SymVar(*_bounded_var(v.name, ext))
            iv = SymVar(*_bounded_var("v" + v.name, ext))
            self.bound.update((lv, iv))
            loops.append(For(lv, ext, SeqStmt(())))
            ivs.append(IterVar(iv, ext, kind, lv))
            subst[v] = iv
        return loops, ivs, subst

    def _place(self, loops: list[For], block: Block) -> None:
        stmt: Stmt = block
        for lp in reversed(loops):
            stmt = For(lp.var, lp.extent, stmt)
        self.stmts.append(stmt)

    def _spatial_block(self, name: str, out: Buffer, axes: list[tuple[SymVar, Dim]], value: Scalar) -> None:
        loops, ivs, subst = self._loops(axes, "spatial")
        idx = tuple(iv.var for iv in ivs)
        store = Store(out, idx, _to_ir(value, subst, self.buffers))
        self._place(loops, _block(self.fresh(name, self.block_names), ivs, store, None))

    def _reduce_block(self, name: str, out: Buffer, axes: list[tuple[SymVar, Dim]], red: Reduce) -> None:
        loops, ivs, subst = self._loops(axes, "spatial")
        rloops, rivs, rsubst = self._loops([(a, a.extent) for a in red.axes], "reduce")
        subst.update(rsubst)
        idx = tuple(iv.var for iv in ivs)
        src = _to_ir(red.source, subst, self.buffers)
        where = None if red.where is None else _to_ir(red.where, subst, self.buffers)
        acc = Load(out, idx)
        if red.combiner in _ACCUMULATE:
            init: Stmt = Store(out, idx, const(identity_value(red.combiner, red.dtype), red.dtype))
            body: Stmt = Store(out, idx, Binary(_ACCUMULATE[red.combiner], acc, src, red.dtype))
        else:
            init, body = self._arg_reduce(name, out, idx, red, src, [iv.var for iv in rivs])
        if where is not None:
            body = IfThenElse(where, body)
        self._place(loops + rloops, _block(self.fresh(name, self.block_names), ivs + rivs, body, init))

    def _arg_reduce(self, name: str, out: Buffer, idx: tuple[Dim, ...], red: Reduce, src: Scalar, rvars: list[SymVar]) -> tuple[Stmt, Stmt]:
        """argmax/argmin: a scratch buffer carries the best value next to its index; a strict
        comparison keeps the first extreme, and the first NaN wins over any number."""
        vt = src.dtype if isinstance(src, PExpr) else "int64"
        val = self.buffer(f"{name}_val", out.shape, vt)
        self.scratch.append(val)
        best = Load(val, idx)
        op = ">" if red.combiner == "argmax" else "<"
        better: Scalar = Binary(op, src, best, "bool")
        if is_float_dtype(vt):
            nan_first = Binary("and", Intrin("isnan", (src,), "bool"), Unary("not", Intrin("isnan", (best,), "bool"), "bool"), "bool")
            better = Binary("or", better, nan_first, "bool")
        flat: Dim = 0
        for v, a in zip(rvars, red.axes):
            flat = sym.add(sym.mul(flat, a.extent), v)
        init = SeqStmt((Store(val, idx, const(identity_value(red.combiner, vt), vt)), Store(out, idx, 0)))
        body = IfThenElse(better, SeqStmt((Store(val, idx, src), Store(out, idx, flat))))
        return init, body


def _block(name: str, ivs: list[IterVar], body: Stmt, init: Stmt | None) -> Block:
    reads: dict[Buffer, None] = {}
    writes: dict[Buffer, None] = {}
    for part in (init, body):
        if part is None:
            continue
        for s in walk_stmts(part):
            if isinstance(s, Store):
                writes[s.buffer] = None
            for x in stmt_scalars(s):
                for e in walk_scalars(x):
                    if isinstance(e, Load):
                        reads[e.buffer] = None
    return Block(name, tuple(ivs), tuple(reads), tuple(writes), body, init)


def _rebuild(x: PExpr, f: Callable[[Scalar], Scalar]) -> Scalar:
    """``x`` with ``f`` applied to each direct child scalar (leaves unchanged)."""
    if isinstance(x, Binary):
        return Binary(x.op, f(x.a), f(x.b), x.dtype)
    if isinstance(x, Unary):
        return Unary(x.op, f(x.a), x.dtype)
    if isinstance(x, Cast):
        return Cast(x.dtype, f(x.value))
    if isinstance(x, Select):
        return Select(f(x.cond), f(x.a), f(x.b), x.dtype)
    if isinstance(x, Intrin):
        return Intrin(x.name, tuple(f(a) for a in x.args), x.dtype)
    if isinstance(x, Load):
        return Load(x.buffer, tuple(f(i) for i in x.indices))
    if isinstance(x, TensorLoad):
        return TensorLoad(x.tensor, tuple(f(i) for i in x.indices))
    if isinstance(x, Const):
        return x
    raise TypeError(f"not a scalar expression node: {type(x).__name__}")


def _to_ir(x: Scalar, subst: Mapping[SymVar, Dim], buffers: Mapping[Tensor, Buffer]) -> Scalar:
    """A DSL expression as loop-level IR: vars substituted, tensor loads as buffer loads."""
    if isinstance(x, (int, SymExpr)):
        return sym_walk.substitute(x, subst)
    if isinstance(x, Reduce):
        raise AssertionError("a reduction was not lifted into its own stage")
    if isinstance(x, TensorLoad):
        return Load(buffers[x.tensor], tuple(_to_ir(i, subst, buffers) for i in x.indices))
    return _rebuild(x, lambda c: _to_ir(c, subst, buffers))


def _free_syms(body: Stmt, bound: set[SymVar]) -> dict[SymVar, None]:
    """Sym vars ``body`` uses that it does not bind itself, in order of first use."""
    out: dict[SymVar, None] = {}
    for v in free_sym_vars(body):
        if isinstance(v, ReduceVar):
            raise ValueError(f"create_func: reduce axis {v.name} is used outside a reducer over it")
        if v not in bound:
            out[v] = None
    return out
