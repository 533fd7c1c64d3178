"""Winograd convolution pieces over channel-last data: a 3x3 convolution of stride 1 as
``F(2, 3)`` (Lavin and Gray, 2015), which ``tilework.transform.conv_gemm`` builds for the convs
with enough channels. Each 2 x 2 block of outputs is computed from a 4 x 4 patch of input:
``Y = AT [(G g GT) * (BT d B)] A``, the product elementwise, so the 9 multiplies per output and
channel pair of a direct convolution become 4, done as 16 independent matmuls.

- ``winograd_input_nhwc(x, padding)``: ``V[a, b, n, th, tw, c] = sum_ij BT[a, i] BT[b, j]
  xp[n, 2 th + i, 2 tw + j, c]`` over ``x: [N, H, W, C]`` padded (``padding`` is ``(top, left,
  bottom, right)``; the bottom and right padded further to whole tiles), ``[4, 4, N, TH, TW,
  C]`` with ``TH = ceil(OH / 2)``, ``TW = ceil(OW / 2)`` for the conv's output ``OH x OW``.
- The 16 products: ``batch_linear_io`` of ``V`` viewed ``[16, N * TH * TW, C]`` by the weights
  ``U = G g GT`` per tap pair, packed as ``[16, panels, C, width]`` at compile time
  (``winograd_weight``): ``M``, ``[16, N * TH * TW, O]``.
- ``winograd_output_nhwc(m, bias, height, width)``: ``y[n, h, w, o] = sum_ab AT[h % 2, a] AT[w % 2, b]
  M[a, b, n, h // 2, w // 2, o] (+ bias[o])`` of ``M`` viewed ``[4, 4, N, TH, TW, O]``, cut to the
  conv's ``[N, height, width, O]``.

Where an image's transformed input is large, ``tilework.op.winograd_images`` runs the same three
steps in one kernel, one image at a time (``input_patch`` and ``output_gather`` are the steps'
compute bodies, shared).

The transforms read their coefficients from small constant tables (one scalar load per tap
pair, hoisted out of the loop over channels, which is vectorized), and sum only the terms whose
coefficient is not zero: 4 of each input patch's 16 (``BT`` has two nonzeros a row), 9 of the
output's 16 (``AT`` three). The sums are the same bits (the dropped terms were exact zeros
added in between); ResNet-18 ran 1.09-1.16x faster at batch 8 and 1.05-1.08x at batch 1 than
with all 16 terms (same-process A/Bs, Zen 5, 2 threads). Both are labelled
``out_ewise_fusable`` (``_call_gather``): the output transform takes in the elementwise ops
after the conv (a residual add, an activation), and neither computes a producer once per
tap. Spatial dims must be static (the tiles and the cut are fixed at compile time); the batch
may be symbolic. Exact in real arithmetic; in float32 the error is that of a 4 x 4 transform
with coefficients 0, 1/2 and 1 (a few ulps of the sum of the products' magnitudes).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Constant, Expr
from tilework.ir.info import StructInfo, TensorInfo, shape_str
from tilework.ir.loop import Scalar
from tilework.ir.sym import Dim
from tilework.op.base import InferCtx, Op, OpPattern, make_call, register, require_equal, require_float, tensor_arg
from tilework.op.conv import _call_gather, _ints_attr
from tilework.op.conv_nhwc import _padded_nhwc
from tilework.op.kernel import arg, out_tensor

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

TILE = 2  # outputs per tile side: F(2, 3)
TAPS = 3  # the kernel's side
ALPHA = TILE + TAPS - 1  # the transformed tile's side
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
# The transforms sum only the nonzero coefficients: BT's row a at columns min(a, 1) and
# 2 + a // 3, AT's row r at columns r .. r + 2.
assert all(set(np.flatnonzero(BT[a])) == {min(a, 1), 2 + a // 3} for a in range(ALPHA))
assert all(set(np.flatnonzero(AT[r])) == set(range(r, r + TAPS)) for r in range(TILE))


def _bt_nonzero(a: Scalar) -> tuple[Scalar, Scalar]:
    """The columns of row ``a`` of ``BT`` that are not zero: ``min(a, 1)`` and ``2 + a // 3``
    (checked where the table is defined). The input transform sums those 2 x 2 terms of each
    patch, not all 16: 4x fewer loads and multiply-adds (see the module docstring)."""
    return sym.min_(a, 1), sym.add(2, sym.floordiv(a, 3))  # type: ignore[arg-type]


def tiles(n: int) -> int:
    """Tiles along a dim of ``n`` outputs."""
    return -(-n // TILE)


def transformed_kernel(w: np.ndarray) -> np.ndarray:
    """``G g GT`` of each ``[3, 3]`` kernel of ``w: [O, C, 3, 3]``: ``[4, 4, O, C]``."""
    u = np.einsum("ai,ocij,bj->aboc", G, np.asarray(w, np.float64), G)
    return u.astype(w.dtype)


def output_hw(shape: tuple[Dim, ...], padding: Sequence[int], ctx: InferCtx) -> tuple[int, int]:
    """The output height and width of a 3x3 conv of ``[N, H, W, C]`` data with ``padding``
    (top, left, bottom, right); static spatial dims only."""
    h, w = shape[1], shape[2]
    if not (isinstance(h, int) and isinstance(w, int)):
        raise ctx.shape_error(f"needs static spatial dims, got input shape {shape_str(shape)}")
    oh, ow = h + padding[0] + padding[2] - TAPS + 1, w + padding[1] + padding[3] - TAPS + 1
    if oh < 1 or ow < 1:
        raise ctx.shape_error(f"input {shape_str(shape)} with padding {tuple(padding)} is smaller than the 3x3 kernel")
    return oh, ow


def _infer_input(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    require_float(x, ctx)
    padding = _ints_attr(call, "padding", 4, ctx, 0)
    if x.ndim not in (-1, 4):
        raise ctx.shape_error(f"input must be 4-D [batch, height, width, channels], got shape {shape_str(x.shape)}")
    if x.shape is None:
        return TensorInfo(None, x.dtype, 6)
    oh, ow = output_hw(x.shape, padding, ctx)
    return TensorInfo((ALPHA, ALPHA, x.shape[0], tiles(oh), tiles(ow), x.shape[3]), x.dtype)


_TABLES = {"BT": BT, "AT": AT}


@functools.lru_cache(maxsize=None)
def _constant(name: str, dtype: str) -> Constant:
    """Coefficient table ``name`` in ``dtype``: one constant, shared by every conv's kernel."""
    return Constant.of(np.ascontiguousarray(_TABLES[name], dtype=np.dtype(dtype)))


def _table(name: str, dtype: str) -> tuple[Constant, te.Tensor]:
    return _constant(name, dtype), te.placeholder(_TABLES[name].shape, dtype, "coef")


def tables(dtype: str) -> tuple[tuple[Constant, te.Tensor], tuple[Constant, te.Tensor]]:
    """The ``BT`` and ``AT`` coefficient tables in ``dtype``: each the constant a kernel is
    called with and the placeholder its transform reads."""
    return _table("BT", dtype), _table("AT", dtype)


def input_patch(xp: te.Tensor, bt: te.Tensor) -> Callable[..., Scalar]:
    """``V[a, b, n, i, j, c]`` of the padded ``xp: [N, H, W, C]`` (``bt`` the ``BT`` table): the
    input transform's compute body, summing only the nonzero coefficients (4 terms of 16)."""

    def patch(a: Scalar, b: Scalar, n: Scalar, i: Scalar, j: Scalar, c: Scalar) -> Scalar:
        total: Scalar | None = None
        for r in _bt_nonzero(a):
            for s in _bt_nonzero(b):
                term = bt[a, r] * bt[b, s] * xp[n, i * TILE + r, j * TILE + s, c]
                total = term if total is None else total + term
        assert total is not None
        return total

    return patch


def output_gather(m: te.Tensor, at: te.Tensor, bias: te.Tensor | None) -> Callable[..., Scalar]:
    """``y[n, h, w, o]`` of the products ``m: [4, 4, N, TH, TW, O]`` (``at`` the ``AT`` table),
    plus ``bias[o]``: the output transform's compute body (9 terms of 16)."""

    def gather(n: Scalar, h: Scalar, w: Scalar, o: Scalar) -> Scalar:
        r, s = sym.floormod(h, TILE), sym.floormod(w, TILE)  # type: ignore[arg-type]
        th, tw = sym.floordiv(h, TILE), sym.floordiv(w, TILE)  # type: ignore[arg-type]
        total: Scalar | None = None if bias is None else bias[o]
        # only the nonzero coefficients: row r of AT is nonzero at r .. r + 2
        for t in range(TAPS):
            for q in range(TAPS):
                a, b = sym.add(r, t), sym.add(s, q)
                term = at[r, a] * at[s, b] * m[a, b, n, th, tw, o]
                total = term if total is None else total + term
        assert total is not None
        return total

    return gather


def _legalize_input(call: Call, ctx: "LegalizeCtx") -> Expr:
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    top, left, bottom, right = (int(p) for p in call.attrs["padding"])
    th, tw = shape[3], shape[4]
    assert isinstance(th, int) and isinstance(tw, int) and isinstance(x.shape[1], int) and isinstance(x.shape[2], int)
    # pad the bottom and right out to whole tiles: rows 2 th .. 2 th + 3 of the last tile exist
    bottom = max(bottom, TILE * th + ALPHA - TILE - x.shape[1] - top)
    right = max(right, TILE * tw + ALPHA - TILE - x.shape[2] - left)
    x_in, xp = _padded_nhwc(ctx, call.args[0], x, (top, left, bottom, right), 0.0, "winograd_pad")
    table, bt = _table("BT", dtype)
    out = te.compute(tuple(shape), input_patch(xp, bt), "winograd_input", dtype)
    return _call_gather(ctx, "winograd_input", [x_in, table], [xp, bt], [out], call.info)


register(Op("winograd_input_nhwc", _infer_input, OpPattern.OUT_EWISE_FUSABLE, attrs={"padding": None}, num_args=1, legalize=_legalize_input))


def winograd_input_nhwc(x: Expr, padding: Sequence[int]) -> Call:
    """The F(2, 3) input transform of ``x: [N, H, W, C]`` (see the module docstring)."""
    return make_call("winograd_input_nhwc", [x], padding=tuple(int(p) for p in padding))


def _infer_output(call: Call, ctx: InferCtx) -> StructInfo:
    if len(call.args) not in (1, 2):
        raise ctx.error(f"takes (m) or (m, bias), got {len(call.args)} argument(s)")
    m = tensor_arg(call, 0, ctx)
    require_float(m, ctx)
    height, width = (call.attrs.get(a) for a in ("height", "width"))
    if not (isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0):
        raise ctx.error(f"height and width must be positive ints, got {height!r} and {width!r}")
    if m.ndim not in (-1, 6):
        raise ctx.shape_error(f"m must be 6-D [4, 4, batch, tile rows, tile columns, channels], got shape {shape_str(m.shape)}")
    if len(call.args) == 2:
        bias = tensor_arg(call, 1, ctx)
        if bias.ndim not in (-1, 1):
            raise ctx.shape_error(f"bias must be 1-D [channels], got shape {shape_str(bias.shape)}")
        if bias.shape is not None and m.shape is not None:
            require_equal(bias.shape[0], m.shape[5], ctx, f"channels of bias {shape_str(bias.shape)} and m {shape_str(m.shape)} differ")
    if m.shape is None:
        return TensorInfo(None, m.dtype, 4)
    for d, want in zip(m.shape[:2], (ALPHA, ALPHA)):
        require_equal(d, want, ctx, f"m {shape_str(m.shape)} must start with {ALPHA}, {ALPHA}")
    require_equal(m.shape[3], tiles(height), ctx, f"m {shape_str(m.shape)} must hold {tiles(height)} tile rows for height {height}")
    require_equal(m.shape[4], tiles(width), ctx, f"m {shape_str(m.shape)} must hold {tiles(width)} tile columns for width {width}")
    return TensorInfo((m.shape[2], height, width, m.shape[5]), m.dtype)


def _legalize_output(call: Call, ctx: "LegalizeCtx") -> Expr:
    m = arg(call, 0, "m")
    bias = arg(call, 1, "bias") if len(call.args) == 2 else None
    shape, dtype = out_tensor(call)
    table, at = _table("AT", dtype)

    out = te.compute(tuple(shape), output_gather(m, at, bias), "winograd_output", dtype)
    inputs = [m, at] if bias is None else [m, at, bias]
    args = [call.args[0], table] if bias is None else [call.args[0], table, call.args[1]]
    return _call_gather(ctx, "winograd_output", args, inputs, [out], call.info)


register(Op("winograd_output_nhwc", _infer_output, OpPattern.OUT_EWISE_FUSABLE, attrs={"height": 0, "width": 0}, legalize=_legalize_output))


def winograd_output_nhwc(m: Expr, bias: Expr | None, height: int, width: int) -> Call:
    """The F(2, 3) output transform of ``m: [4, 4, N, TH, TW, O]`` (see the module docstring)."""
    return make_call("winograd_output_nhwc", [m] if bias is None else [m, bias], height=height, width=width)


__all__ = ["ALPHA", "AT", "BT", "G", "TAPS", "TILE", "input_patch", "output_gather", "tables", "tiles", "transformed_kernel", "winograd_input_nhwc", "winograd_output_nhwc"]
