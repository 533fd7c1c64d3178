"""Recurrent layers: ``rnn`` runs one direction of an LSTM, GRU or Elman RNN over a sequence
whose length may be symbolic, as one loop over time inside one kernel.

``rnn(xw, r, rb, h0, [c0, peep,] lens, cell, reverse, linear_before_reset, clip)``:

- ``xw: [T, B, G * H]``: the input projections ``x_t @ W.T + b_w`` of every step (a matrix
  product the caller computes for all steps at once), ``G`` gates of ``H`` units each;
- ``r: [G * H, H]`` the recurrent weights and ``rb: [G * H]`` their bias;
- ``h0, c0: [B, H]`` the initial states (``c0`` and the peepholes ``peep: [3 * H]``, for the
  input, forget and output gates, only for ``lstm``); ``lens: [B]`` (int64) each sequence's
  length: steps at or past it leave the state alone and output zeros (ONNX's
  ``sequence_lens``); ``reverse`` runs each sequence from its last valid step back.

Gate order and cells (torch's layout): ``lstm`` ``(i, f, g, o)``: ``c = f * c + i * g``,
``h = o * tanh(c)`` with sigmoid gates and a tanh candidate; ``gru`` ``(r, z, n)``:
``n = tanh(xw_n + r * (h @ R_n + rb_n))`` (``linear_before_reset``, torch's form) or
``tanh(xw_n + (r * h) @ R_n + rb_n)``, ``h = (1 - z) * n + z * h``; ``rnn_tanh``/``rnn_relu``:
``h = act(xw + h @ R + rb)``. ``clip`` (> 0) clamps every gate's pre-activation.

The result is a tuple ``(y: [T, B, H], h_n: [B, H])``, plus ``c_n: [B, H]`` for ``lstm``.
Legalization: a hand-built kernel, parallel over the batch; per sequence the state lives in
O(G * H) scratch and each step is a matrix-vector product followed by the gate update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, TupleInfo, shape_str
from tilework.ir.loop import Allocate, Buffer, For, IfThenElse, Load, PExpr, Scalar, Stmt, Store, TensorFunc, convert
from tilework.ir.sym import Dim, SymVar
from tilework.op.base import InferCtx, Op, OpPattern, make_call, register, require_equal, require_float, tensor_arg, unify_dtype
from tilework.op.calls import call_tensor
from tilework.op.kernel import block, compute_dtype, free_syms, hand_kernel, known_tensor, seq, serial_var

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

CELLS = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _arg_names(cell: str) -> tuple[str, ...]:
    return ("xw", "r", "rb", "h0", "c0", "peep", "lens") if cell == "lstm" else ("xw", "r", "rb", "h0", "lens")


def _infer_rnn(call: Call, ctx: InferCtx) -> StructInfo:
    cell = call.attrs["cell"]
    if cell not in CELLS:
        raise ctx.error(f"cell must be one of {', '.join(CELLS)}, got {cell!r}")
    names = _arg_names(cell)
    if len(call.args) != len(names):
        raise ctx.error(f"a {cell} takes ({', '.join(names)}), got {len(call.args)} argument(s)")
    args = {n: tensor_arg(call, i, ctx) for i, n in enumerate(names)}
    for n, a in args.items():
        if n != "lens":
            require_float(a, ctx)
    if args["lens"].dtype not in (None, "int64"):
        raise ctx.error(f"lens must be int64, got {args['lens'].dtype}")
    dtype = unify_dtype([a.dtype for n, a in args.items() if n != "lens"], ctx)
    ranks = {"xw": 3, "r": 2, "rb": 1, "h0": 2, "c0": 2, "peep": 1, "lens": 1}
    for n, a in args.items():
        if a.ndim not in (-1, ranks[n]):
            raise ctx.shape_error(f"{n} must be {ranks[n]}-D, got shape {shape_str(a.shape)}")
    xw, r = args["xw"], args["r"]
    n_out = 3 if cell == "lstm" else 2
    if xw.shape is None or r.shape is None:
        return TupleInfo(tuple(TensorInfo(None, dtype, 3 if k == 0 else 2) for k in range(n_out)))
    t, b, gh = xw.shape
    hidden = r.shape[1]
    g = CELLS[cell]
    require_equal(gh, sym.mul(g, hidden), ctx, f"xw {shape_str(xw.shape)} must hold {g} gates of the hidden size {sym.to_str(hidden)}")
    require_equal(r.shape[0], sym.mul(g, hidden), ctx, f"r {shape_str(r.shape)} must be [{g} * hidden, hidden]")
    checks = [("rb", 0, sym.mul(g, hidden)), ("h0", 0, b), ("h0", 1, hidden), ("c0", 0, b), ("c0", 1, hidden), ("peep", 0, sym.mul(3, hidden)), ("lens", 0, b)]
    for n, axis, want in checks:
        given = args.get(n)
        if given is not None and given.shape is not None:
            require_equal(given.shape[axis], want, ctx, f"dim {axis} of {n} {shape_str(given.shape)} must be {sym.to_str(want)}")
    state = TensorInfo((b, hidden), dtype)
    return TupleInfo((TensorInfo((t, b, hidden), dtype), *(state,) * (n_out - 1)))


# -- legalization ---------------------------------------------------------------------------


def _ld(buf: Buffer, *idx: Scalar) -> Load:
    return Load(buf, tuple(idx))


class _Kernel:
    """The statements of one ``rnn`` kernel (see the module docstring)."""

    def __init__(self, call: Call, bufs: dict[str, Buffer], outs: Sequence[Buffer]) -> None:
        self.cell = str(call.attrs["cell"])
        self.reverse = bool(call.attrs["reverse"])
        self.lbr = bool(call.attrs["linear_before_reset"])
        clip = call.attrs["clip"]
        self.clip = None if clip is None or float(clip) <= 0 else float(clip)
        self.bufs, self.outs = bufs, list(outs)
        xw = bufs["xw"]
        self.steps, self.batch, _ = xw.shape
        self.hidden = bufs["r"].shape[1]
        self.acc = compute_dtype(xw.dtype)
        g = CELLS[self.cell]
        self.h = Buffer("rnn_h", (self.hidden,), self.acc)
        self.c = Buffer("rnn_c", (self.hidden,), self.acc)
        self.g = Buffer("rnn_g", (sym.mul(g, self.hidden),), self.acc)
        self.hr = Buffer("rnn_hr", (self.hidden,), self.acc)

    def f(self, x: Scalar) -> PExpr:
        return te.cast(x, self.acc)

    def pre(self, x: Scalar) -> Scalar:
        """A gate's pre-activation, clipped when asked."""
        if self.clip is None:
            return x
        return te.minimum(te.maximum(x, te.constant(-self.clip, self.acc)), te.constant(self.clip, self.acc))

    def matvec(self, rows: Dim, row0: Dim, src: Buffer, name: str) -> Stmt:
        """``g[row0 + j] = rb[row0 + j] + sum_k src[k] * r[row0 + j, k]`` for ``j < rows``."""
        r, rb = self.bufs["r"], self.bufs["rb"]
        j, k = serial_var(f"{name}_j", rows), serial_var(f"{name}_k", self.hidden)
        row = sym.add(row0, j)
        acc = Buffer(f"{name}_acc", (1,), self.acc)
        body = seq([
            Store(acc, (0,), self.f(_ld(rb, row))),
            For(k, self.hidden, Store(acc, (0,), _ld(acc, 0) + _ld(src, k) * self.f(_ld(r, row, k)))),
            Store(self.g, (row,), _ld(acc, 0)),
        ])  # fmt: skip
        return Allocate(acc, For(j, rows, block(name, body)))

    def update(self, b: SymVar, tt: Scalar) -> Stmt:
        """The gate update of unit ``j`` at step ``tt`` (after the matrix-vector products)."""
        xw, y = self.bufs["xw"], self.outs[0]
        hsz = self.hidden
        j = serial_var("rnn_u", hsz)

        def x_at(gate: int) -> PExpr:
            return self.f(_ld(xw, tt, b, sym.add(sym.mul(gate, hsz), j)))

        def g_at(gate: int) -> Load:
            return _ld(self.g, sym.add(sym.mul(gate, hsz), j))

        h_old, c_old = _ld(self.h, j), _ld(self.c, j)
        stmts: list[Stmt]
        if self.cell == "lstm":
            peep = self.bufs["peep"]

            def p(k: int) -> PExpr:
                return self.f(_ld(peep, sym.add(sym.mul(k, hsz), j)))

            i = te.sigmoid(self.pre(x_at(0) + g_at(0) + p(0) * c_old))
            fg = te.sigmoid(self.pre(x_at(1) + g_at(1) + p(1) * c_old))
            cand = te.tanh(self.pre(x_at(2) + g_at(2)))
            c_new = fg * c_old + i * cand
            stmts = [Store(self.c, (j,), c_new)]
            o = te.sigmoid(self.pre(x_at(3) + g_at(3) + p(2) * _ld(self.c, j)))
            stmts.append(Store(self.h, (j,), o * te.tanh(_ld(self.c, j))))
        elif self.cell == "gru":
            z = te.sigmoid(self.pre(x_at(1) + g_at(1)))
            if self.lbr:
                rg = te.sigmoid(self.pre(x_at(0) + g_at(0)))
                n = te.tanh(self.pre(x_at(2) + rg * g_at(2)))
            else:
                n = te.tanh(self.pre(x_at(2) + g_at(2)))
            stmts = [Store(self.h, (j,), (1.0 - z) * n + z * h_old)]
        else:
            v = self.pre(x_at(0) + g_at(0))
            act = te.tanh(v) if self.cell == "rnn_tanh" else te.maximum(v, te.constant(0.0, self.acc))
            stmts = [Store(self.h, (j,), act)]
        stmts.append(Store(y, (tt, b, j), convert(_ld(self.h, j), y.dtype)))
        return For(j, hsz, block("rnn_update", seq(stmts)))

    def step(self, b: SymVar, t: SymVar) -> Stmt:
        lens, y = self.bufs["lens"], self.outs[0]
        length = _ld(lens, b)
        tt: Scalar = length - 1 - t if self.reverse else t
        hsz = self.hidden
        if self.cell == "gru" and not self.lbr:
            # r first, then n's product reads r * h
            xw = self.bufs["xw"]
            k = serial_var("rnn_r", hsz)
            reset = te.sigmoid(self.pre(self.f(_ld(xw, tt, b, k)) + _ld(self.g, k)))
            products = seq([
                self.matvec(sym.mul(2, hsz), 0, self.h, "rnn_gates"),
                For(k, hsz, block("rnn_reset", Store(self.hr, (k,), reset * _ld(self.h, k)))),
                self.matvec(hsz, sym.mul(2, hsz), self.hr, "rnn_cand"),
            ])  # fmt: skip
        else:
            products = self.matvec(self.g.shape[0], 0, self.h, "rnn_gates")
        live = seq([products, self.update(b, tt)])
        j = serial_var("rnn_z", hsz)
        dead = For(j, hsz, block("rnn_pad", Store(y, (t, b, j), convert(0.0, y.dtype))))
        return IfThenElse(te.lt(t, length), live, dead)

    def body(self) -> Stmt:
        b = serial_var("rnn_b", self.batch)
        t = serial_var("rnn_t", self.steps)
        i, j = serial_var("rnn_i", self.hidden), serial_var("rnn_o", self.hidden)
        h0 = self.bufs["h0"]
        init = [Store(self.h, (i,), self.f(_ld(h0, b, i)))]
        final = [Store(self.outs[1], (b, j), convert(_ld(self.h, j), self.outs[1].dtype))]
        if self.cell == "lstm":
            init.append(Store(self.c, (i,), self.f(_ld(self.bufs["c0"], b, i))))
            final.append(Store(self.outs[2], (b, j), convert(_ld(self.c, j), self.outs[2].dtype)))
        per_seq = seq([
            For(i, self.hidden, block("rnn_init", seq(init))),
            For(t, self.steps, self.step(b, t)),
            For(j, self.hidden, block("rnn_final", seq(final))),
        ])  # fmt: skip
        for scratch in (self.h, self.c, self.g, self.hr):
            per_seq = Allocate(scratch, per_seq)
        return For(b, self.batch, per_seq, "parallel")


def _legalize_rnn(call: Call, ctx: "LegalizeCtx") -> Expr:
    names = _arg_names(str(call.attrs["cell"]))
    bufs = {}
    for i, n in enumerate(names):
        shape, dtype = known_tensor(call.args[i].info, call, n)
        bufs[n] = Buffer(n, shape, dtype)
    info = call.info
    assert isinstance(info, TupleInfo)
    outs = [Buffer(f"out{k}", *known_tensor(f, call, f"result {k}")) for k, f in enumerate(info.fields)]
    body = _Kernel(call, bufs, outs).body()
    buffers = [*bufs.values(), *outs]
    func: TensorFunc = hand_kernel([*buffers, *free_syms(body, buffers)], body, "opaque").replace(num_outputs=len(outs))
    gv = ctx.add_kernel("rnn", func)
    return call_tensor(gv, list(call.args), call.info, tuple(func.sym_params))


register(Op("rnn", _infer_rnn, OpPattern.OPAQUE, attrs={"cell": "lstm", "reverse": False, "linear_before_reset": True, "clip": None}, legalize=_legalize_rnn))


def rnn(
    xw: Expr, r: Expr, rb: Expr, h0: Expr, lens: Expr, cell: str, c0: Expr | None = None, peep: Expr | None = None,
    reverse: bool = False, linear_before_reset: bool = True, clip: float | None = None,
) -> Call:  # fmt: skip
    """One direction of a recurrent layer (see the module docstring); ``c0`` and ``peep`` are
    required for ``lstm`` and refused otherwise."""
    if (cell == "lstm") != (c0 is not None and peep is not None):
        raise ValueError("c0 and peep are given exactly for an lstm")
    args = [xw, r, rb, h0, c0, peep, lens] if cell == "lstm" else [xw, r, rb, h0, lens]
    return make_call("rnn", [a for a in args if a is not None], cell=cell, reverse=bool(reverse), linear_before_reset=bool(linear_before_reset), clip=None if clip is None else float(clip))


__all__ = ["rnn", "CELLS"]
