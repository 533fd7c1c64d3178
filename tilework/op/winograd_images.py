"""``winograd_conv_nhwc``: a whole F(2, 3) convolution (``tilework.op.winograd``) in one
kernel that runs its three steps one image at a time, so that an image's transformed input
and products stay in cache between the steps.

Run as three kernels over the whole batch, the input transform writes ``V`` (``[16, N * TH *
TW, C]``) for every image before the product reads it: DenseNet-121's 56 x 56 layers (128
channels in) make 6.4 MB of it per image, 51 MB at batch 8, which no cache holds, and the
product then runs at the memory's pace. Here the kernel is a serial loop over the images;
for each it computes that image's ``V`` into scratch (``[16, TH * TW, C]``), the 16
products into scratch ``M`` (``[16, TH * TW, O]``) and the image's output (with the bias),
each step as the kernel of one image would (the schedule rule ``winograd_images`` schedules
each step like a function of its own; their parallel loops run inside the loop over the
images). The batch may be symbolic: the loop runs over it.

``winograd_conv_nhwc(x, u, bias, padding, out_features)``: ``x: [N, H, W, C]`` (static
``H``, ``W``), ``u`` the transformed weight packed as ``tilework.transform.conv_gemm``'s
``winograd_weight`` gives it (``[16, panels, C, width]``), ``bias: [O]`` or none: the conv's
``[N, OH, OW, O]``, the same sums as ``winograd_output_nhwc(batch_linear_io(
winograd_input_nhwc(x, padding), u), bias)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, shape_str
from tilework.ir.loop import Allocate, Block, Buffer, For, IfThenElse, Load, PExpr, Scalar, SeqStmt, Stmt, Store, TensorFunc, free_sym_vars, map_scalars
from tilework.ir.sym import SymVar
from tilework.op.base import InferCtx, Op, OpPattern, make_call, register, require_equal, require_float, tensor_arg
from tilework.op.calls import call_tensor
from tilework.op.conv import _inside, _ints_attr
from tilework.op.conv_nhwc import _padded_nhwc
from tilework.op.kernel import arg, compute_dtype, out_tensor
from tilework.op.linalg import _panel_dot
from tilework.op.winograd import ALPHA, TILE, input_patch, output_gather, output_hw, tables, tiles

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

PREFIX = "wino_image_"  # the names of the steps' blocks (the schedule rule finds the kernel by them)
IMAGE_VAR = PREFIX + "n"  # the loop over the images
PAD_IN_LOOP = True  # pad each image into scratch in the loop (else one padded copy of the batch first)


def _infer(call: Call, ctx: InferCtx) -> StructInfo:
    if len(call.args) not in (2, 3):
        raise ctx.error(f"takes (x, u) or (x, u, bias), got {len(call.args)} argument(s)")
    x, u = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    require_float(x, ctx)
    padding = _ints_attr(call, "padding", 4, ctx, 0)
    o = call.attrs.get("out_features")
    if not isinstance(o, int) or isinstance(o, bool) or o < 1:
        raise ctx.error(f"out_features must be a positive int, got {o!r}")
    if x.ndim not in (-1, 4) or u.ndim not in (-1, 4):
        raise ctx.shape_error(f"takes x [batch, height, width, channels] and u [16, panels, channels, width], got shapes {shape_str(x.shape)} and {shape_str(u.shape)}")
    if u.shape is not None:
        require_equal(u.shape[0], ALPHA * ALPHA, ctx, f"u {shape_str(u.shape)} must hold {ALPHA * ALPHA} matrices")
        if x.shape is not None:
            require_equal(u.shape[2], x.shape[3], ctx, f"channels of x {shape_str(x.shape)} and u {shape_str(u.shape)} differ")
    if len(call.args) == 3:
        bias = tensor_arg(call, 2, ctx)
        if bias.shape is not None:
            require_equal(bias.shape[0] if len(bias.shape) == 1 else -1, o, ctx, f"bias {shape_str(bias.shape)} must be [{o}]")
    if x.shape is None:
        return TensorInfo(None, x.dtype, 4)
    oh, ow = output_hw(x.shape, padding, ctx)
    return TensorInfo((x.shape[0], oh, ow, o), x.dtype)


IndexMap = Callable[[tuple[Scalar, ...]], tuple[Scalar, ...]]


def rebase(s: Stmt, moves: Mapping[Buffer, tuple[Buffer, IndexMap]]) -> Stmt:
    """``s`` with every load and store of a buffer in ``moves`` redirected to its new buffer
    at the mapped indices (one image's buffer into the batch's, a 6-D view into the 3-D
    scratch)."""

    def moved(x: PExpr) -> Scalar | None:
        if isinstance(x, Load) and x.buffer in moves:
            buf, f = moves[x.buffer]
            return Load(buf, f(x.indices))
        return None

    def scalar(x: Scalar) -> Scalar:
        return map_scalars(x, moved)

    def stmt(x: Stmt) -> Stmt:
        if isinstance(x, Store):
            idx = tuple(scalar(i) for i in x.indices)
            buf = x.buffer
            if buf in moves:
                buf, f = moves[buf]
                idx = f(idx)
            return Store(buf, idx, scalar(x.value))
        if isinstance(x, Block):
            init = None if x.init is None else stmt(x.init)
            reads = tuple(moves[b][0] if b in moves else b for b in x.reads)
            writes = tuple(moves[b][0] if b in moves else b for b in x.writes)
            return Block(x.name, x.iter_vars, reads, writes, stmt(x.body), init)
        if isinstance(x, For):
            return For(x.var, x.extent, stmt(x.body), x.kind)
        if isinstance(x, SeqStmt):
            return SeqStmt(tuple(stmt(c) for c in x.stmts))
        if isinstance(x, Allocate):
            return Allocate(x.buffer, stmt(x.body))
        if isinstance(x, IfThenElse):
            return IfThenElse(scalar(x.cond), stmt(x.then_body), None if x.else_body is None else stmt(x.else_body))
        return x

    return stmt(s)


def _add(a: Scalar, b: Scalar) -> Scalar:
    return sym.add(a, b) if isinstance(a, (int, sym.SymExpr)) and isinstance(b, (int, sym.SymExpr)) else a + b


def _mul(a: Scalar, b: int) -> Scalar:
    return sym.mul(a, b) if isinstance(a, (int, sym.SymExpr)) else a * b


def _legalize(call: Call, ctx: "LegalizeCtx") -> Expr:
    x = arg(call, 0, "x")
    u = arg(call, 1, "u")
    bias = arg(call, 2, "bias") if len(call.args) == 3 else None
    shape, dtype = out_tensor(call)
    n, oh, ow, o = shape
    assert isinstance(oh, int) and isinstance(ow, int) and isinstance(o, int)
    assert isinstance(x.shape[1], int) and isinstance(x.shape[2], int)
    c = x.shape[3]
    th, tw = tiles(oh), tiles(ow)
    top, left, bottom, right = (int(p) for p in call.attrs["padding"])
    bottom = max(bottom, TILE * th + ALPHA - TILE - x.shape[1] - top)
    right = max(right, TILE * tw + ALPHA - TILE - x.shape[2] - left)
    hp, wp = x.shape[1] + top + bottom, x.shape[2] + left + right
    (bt_const, bt), (at_const, at) = tables(dtype)
    nv = SymVar(IMAGE_VAR, 0, None)

    def image(idx: tuple[Scalar, ...]) -> tuple[Scalar, ...]:
        return (_add(idx[0], nv), *idx[1:])

    def flat(idx: tuple[Scalar, ...]) -> tuple[Scalar, ...]:
        a, b, z, i, j, ch = idx
        return (_add(_mul(a, ALPHA), b), _add(_mul(_add(_mul(z, th), i), tw), j), ch)

    # one image's steps, each its own loop program over an image's buffers
    x1 = te.placeholder((1, hp, wp, c), dtype, "xp")
    patch = input_patch(x1, bt)

    def patch_rows(ab: Scalar, t: Scalar, ch: Scalar) -> Scalar:  # V written as the products read it
        return patch(sym.floordiv(ab, ALPHA), sym.floormod(ab, ALPHA), 0, sym.floordiv(t, tw), sym.floormod(t, tw), ch)  # type: ignore[arg-type]

    v_rows = te.compute((ALPHA * ALPHA, th * tw, c), patch_rows, PREFIX + "input", dtype)
    step_in = te.create_func([x1, bt], [v_rows])
    v3 = te.placeholder((ALPHA * ALPHA, th * tw, c), dtype, "v")
    acc = compute_dtype(dtype)
    m3 = te.compute((ALPHA * ALPHA, th * tw, o), lambda b, i, j: _panel_dot(v3, u, (b, i), (b,), j, acc), PREFIX + "product", dtype)
    step_mul = te.create_func([v3, u], [m3])
    m6 = te.placeholder((ALPHA, ALPHA, 1, th, tw, o), dtype, "m")
    y1 = te.compute((1, oh, ow, o), output_gather(m6, at, bias), PREFIX + "output", dtype)
    step_out = te.create_func([m6, at] if bias is None else [m6, at, bias], [y1])
    x1_buf, bt_buf, v6_buf = step_in.buffers
    v3_buf, u_buf, m3_buf = step_mul.buffers
    m6_buf, at_buf, *rest = step_out.buffers
    y1_buf = rest[-1]
    x_buf, y_buf = Buffer("x", (n, hp, wp, c), dtype), Buffer("y", tuple(shape), dtype)

    steps: list[Stmt] = []
    scratch = [v3_buf, m3_buf]
    x_arg = call.args[0]
    if not any((top, left, bottom, right)):
        moves = {x1_buf: (x_buf, image), v6_buf: (v3_buf, _same)}
    elif PAD_IN_LOOP:  # the image's padded copy: scratch too
        x_buf = Buffer("x", tuple(x.shape), dtype)

        def pad(z: Scalar, h: Scalar, w: Scalar, ch: Scalar) -> Scalar:
            pos = [h - top, w - left]
            return te.if_then_else(_inside(pos, x.shape[1:3]), x0[z, pos[0], pos[1], ch], te.cast(0.0, dtype))

        x0 = te.placeholder((1, *x.shape[1:]), dtype, "x")
        step_pad = te.create_func([x0], [te.compute((1, hp, wp, c), pad, PREFIX + "pad", dtype)])
        x0_buf, xp1_buf = step_pad.buffers
        steps.append(rebase(step_pad.body, {x0_buf: (x_buf, image), xp1_buf: (x1_buf, _same)}))
        scratch.append(x1_buf)
        moves = {v6_buf: (v3_buf, _same)}
    else:
        x_arg, xp = _padded_nhwc(ctx, call.args[0], x, (top, left, bottom, right), 0.0, "winograd_pad")
        moves = {x1_buf: (x_buf, image), v6_buf: (v3_buf, _same)}
    steps += [
        rebase(step_in.body, moves),
        step_mul.body,
        rebase(step_out.body, {m6_buf: (m3_buf, flat), y1_buf: (y_buf, image)}),
    ]
    body: Stmt = SeqStmt(tuple(steps))
    for b in scratch:
        body = Allocate(b, body)
    body = For(nv, n, body)
    buffers: list[Buffer] = [x_buf, bt_buf, u_buf, at_buf, *rest[:-1], y_buf]
    params: list[Buffer | SymVar] = [*buffers, *free_sym_vars(body, buffers)]
    func = TensorFunc(tuple(params), body)
    func = func.replace(attrs=func.attrs.with_(op_pattern="out_ewise_fusable"))
    args = [x_arg, bt_const, call.args[1], at_const, *call.args[2:]]
    return call_tensor(ctx.add_kernel("winograd_conv", func), args, call.info, tuple(func.sym_params))


def _same(idx: tuple[Scalar, ...]) -> tuple[Scalar, ...]:
    return idx


register(Op("winograd_conv_nhwc", _infer, OpPattern.OUT_EWISE_FUSABLE, attrs={"padding": None, "out_features": 0}, legalize=_legalize))


def winograd_conv_nhwc(x: Expr, u: Expr, bias: Expr | None, padding: Sequence[int], out_features: int) -> Call:
    """The F(2, 3) convolution of ``x: [N, H, W, C]`` by the packed transformed weight ``u``,
    one image at a time (see the module docstring)."""
    args = [x, u] if bias is None else [x, u, bias]
    return make_call("winograd_conv_nhwc", args, padding=tuple(int(p) for p in padding), out_features=out_features)


__all__ = ["IMAGE_VAR", "PREFIX", "IndexMap", "rebase", "winograd_conv_nhwc"]
