"""Object detection: ``non_max_suppression``, greedy non-maximum suppression per image and class.

``non_max_suppression(boxes, scores, max_out, iou_threshold, score_threshold, center_point_box,
use_score_threshold)``:

- ``boxes: [B, N, 4]`` corners ``(y1, x1, y2, x2)`` in either order, or with
  ``center_point_box`` ``(x_center, y_center, width, height)``;
- ``scores: [B, C, N]`` a score per image, class and box;
- ``max_out``, ``iou_threshold``, ``score_threshold``: one-element tensors (int64, float,
  float): the most boxes kept per image and class (negative counts as 0), the overlap above
  which a box is suppressed, the score a box must exceed (only with ``use_score_threshold``).

The result ``[B, C, N]`` (int64) holds, for each image and class, the kept box indices in the
order they were kept, then -1s: boxes are visited by descending score (ties: the lower index
first); a box is kept when its score passes the threshold, fewer than ``max_out`` boxes are
kept so far, and its intersection over union with every kept box is at most
``iou_threshold`` (boxes that do not overlap, or have no area, never suppress each other).
This is ONNX's NonMaxSuppression with its data-dependent ``[n, 3]`` result left to the
caller: the positions of the entries that are not -1, in row-major order, are exactly ONNX's
selected ``(batch, class, rank)`` triples in order.

Legalization: a hand-built kernel, parallel over images; per image and class it ranks the
boxes by counting (quadratic in ``N``) and then visits them in order, comparing each with the
boxes kept before it (quadratic again) — meant for the few hundred or thousand boxes of a
detector's head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, shape_str
from tilework.ir.loop import Allocate, Buffer, For, IfThenElse, Load, PExpr, Scalar, Stmt, Store, TensorFunc
from tilework.ir.sym import SymVar
from tilework.op.base import InferCtx, Op, OpPattern, bool_attr, make_call, register, require_equal, require_float, tensor_arg
from tilework.op.calls import call_tensor
from tilework.op.kernel import block, compute_dtype, free_syms, hand_kernel, known_tensor, seq, serial_var

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

_ARGS = ("boxes", "scores", "max_out", "iou_threshold", "score_threshold")


def _infer_nms(call: Call, ctx: InferCtx) -> StructInfo:
    if len(call.args) != len(_ARGS):
        raise ctx.error(f"takes ({', '.join(_ARGS)}), got {len(call.args)} argument(s)")
    boxes, scores, max_out, iou, thr = (tensor_arg(call, i, ctx) for i in range(len(_ARGS)))
    bool_attr(call, "center_point_box", ctx)
    bool_attr(call, "use_score_threshold", ctx)
    for name, t in (("boxes", boxes), ("scores", scores), ("iou_threshold", iou), ("score_threshold", thr)):
        require_float(t, ctx, name)
    if max_out.dtype not in (None, "int64"):
        raise ctx.error(f"max_out must be int64, got {max_out.dtype}")
    for name, t in (("max_out", max_out), ("iou_threshold", iou), ("score_threshold", thr)):
        if t.shape is not None and (len(t.shape) != 1 or not sym.prove_eq(t.shape[0], 1)):
            raise ctx.shape_error(f"{name} must have shape (1,), got {shape_str(t.shape)}")
    for name, t, rank in (("boxes", boxes, 3), ("scores", scores, 3)):
        if t.ndim not in (-1, rank):
            raise ctx.shape_error(f"{name} must be {rank}-D, got shape {shape_str(t.shape)}")
    if boxes.shape is None or scores.shape is None:
        return TensorInfo(None, "int64", 3)
    b, n, four = boxes.shape
    require_equal(four, 4, ctx, f"boxes {shape_str(boxes.shape)} must hold 4 coordinates per box")
    require_equal(scores.shape[0], b, ctx, f"scores {shape_str(scores.shape)} and boxes {shape_str(boxes.shape)} must have one batch size")
    require_equal(scores.shape[2], n, ctx, f"scores {shape_str(scores.shape)} and boxes {shape_str(boxes.shape)} must have one box count")
    return TensorInfo((b, scores.shape[1], n), "int64")


# -- legalization ---------------------------------------------------------------------------


def _ld(buf: Buffer, *idx: Scalar) -> Load:
    return Load(buf, tuple(idx))


class _Kernel:
    """The statements of one ``non_max_suppression`` kernel (see the module docstring)."""

    def __init__(self, call: Call, bufs: dict[str, Buffer], out: Buffer) -> None:
        self.bufs, self.out = bufs, out
        self.center = bool(call.attrs["center_point_box"])
        self.use_thr = bool(call.attrs["use_score_threshold"])
        self.batch, self.classes, self.n = out.shape
        self.acc = compute_dtype(bufs["boxes"].dtype)
        self.order = Buffer("nms_order", (self.n,), "int64")
        self.kept = Buffer("nms_kept", (self.n,), "int64")
        self.count = Buffer("nms_count", (1,), "int64")
        self.hit = Buffer("nms_hit", (1,), "int64")

    def f(self, x: Scalar) -> PExpr:
        return te.cast(x, self.acc)

    def score(self, b: SymVar, c: SymVar, i: Scalar) -> PExpr:
        return self.f(_ld(self.bufs["scores"], b, c, i))

    def extent(self, b: SymVar, i: Scalar, axis: int) -> tuple[Scalar, Scalar]:
        """``(lo, hi)`` of box ``i`` along y (``axis`` 0) or x (1)."""
        boxes = self.bufs["boxes"]
        if self.center:
            mid, half = self.f(_ld(boxes, b, i, 1 - axis)), self.f(_ld(boxes, b, i, 3 - axis)) / 2.0
            return mid - half, mid + half
        p, q = self.f(_ld(boxes, b, i, axis)), self.f(_ld(boxes, b, i, axis + 2))
        return te.minimum(p, q), te.maximum(p, q)

    def suppresses(self, b: SymVar, i: Scalar, j: Scalar) -> Scalar:
        """Whether boxes ``i`` and ``j`` overlap by more than the IoU threshold."""
        (ay0, ay1), (ax0, ax1) = self.extent(b, i, 0), self.extent(b, i, 1)
        (by0, by1), (bx0, bx1) = self.extent(b, j, 0), self.extent(b, j, 1)
        ih = te.minimum(ay1, by1) - te.maximum(ay0, by0)
        iw = te.minimum(ax1, bx1) - te.maximum(ax0, bx0)
        inter = ih * iw
        area_a, area_b = (ay1 - ay0) * (ax1 - ax0), (by1 - by0) * (bx1 - bx0)
        union = area_a + area_b - inter
        safe = te.if_then_else(te.gt(union, 0.0), union, te.constant(1.0, self.acc))
        over = te.gt(inter / safe, self.f(_ld(self.bufs["iou_threshold"], 0)))
        return te.all(te.gt(ih, 0.0), te.gt(iw, 0.0), te.gt(area_a, 0.0), te.gt(area_b, 0.0), te.gt(union, 0.0), over)

    def rank(self, b: SymVar, c: SymVar) -> Stmt:
        """``order[r]``: the box of rank ``r`` (descending score, ties by index). Slots start
        as the identity so that ranks made equal by NaN scores still leave valid indices."""
        n = self.n
        i, q = serial_var("nms_i", n), serial_var("nms_q", n)
        beats = te.any(te.gt(self.score(b, c, q), self.score(b, c, i)), te.logical_and(te.eq(self.score(b, c, q), self.score(b, c, i)), te.lt(q, i)))
        count = seq([
            Store(self.count, (0,), 0),
            For(q, n, IfThenElse(beats, Store(self.count, (0,), _ld(self.count, 0) + 1))),
            Store(self.order, (_ld(self.count, 0),), i),
        ])  # fmt: skip
        r = serial_var("nms_r0", n)
        return seq([For(r, n, block("nms_order_init", Store(self.order, (r,), r))), For(i, n, block("nms_rank", count))])

    def visit(self, b: SymVar, c: SymVar) -> Stmt:
        """Visit the boxes by rank; keep each that passes and no kept box suppresses."""
        n = self.n
        r, j = serial_var("nms_r", n), serial_var("nms_j", n)
        box = _ld(self.order, r)
        conds: list[Scalar] = [te.lt(_ld(self.count, 0), _ld(self.bufs["max_out"], 0))]
        if self.use_thr:
            conds.append(te.gt(self.score(b, c, box), self.f(_ld(self.bufs["score_threshold"], 0))))
        earlier = te.all(te.lt(j, r), te.eq(_ld(self.kept, j), 1), self.suppresses(b, _ld(self.order, j), box))
        keep = seq([
            Store(self.kept, (r,), 1),
            Store(self.out, (b, c, _ld(self.count, 0)), box),
            Store(self.count, (0,), _ld(self.count, 0) + 1),
        ])  # fmt: skip
        step = seq([
            Store(self.kept, (r,), 0),
            Store(self.hit, (0,), 0),
            IfThenElse(te.all(*conds), For(j, n, IfThenElse(earlier, Store(self.hit, (0,), 1)))),
            IfThenElse(te.all(*conds, te.eq(_ld(self.hit, 0), 0)), keep),
        ])  # fmt: skip
        return seq([Store(self.count, (0,), 0), For(r, n, block("nms_visit", step))])

    def body(self) -> Stmt:
        b, c, k = serial_var("nms_b", self.batch), serial_var("nms_c", self.classes), serial_var("nms_k", self.n)
        per_class = seq([
            For(k, self.n, block("nms_clear", Store(self.out, (b, c, k), -1))),
            self.rank(b, c),
            self.visit(b, c),
        ])  # fmt: skip
        per_image: Stmt = For(c, self.classes, per_class)
        for scratch in (self.order, self.kept, self.count, self.hit):
            per_image = Allocate(scratch, per_image)
        return For(b, self.batch, per_image, "parallel")


def _legalize_nms(call: Call, ctx: "LegalizeCtx") -> Expr:
    bufs = {}
    for i, name in enumerate(_ARGS):
        shape, dtype = known_tensor(call.args[i].info, call, name)
        bufs[name] = Buffer(name, shape, dtype)
    out = Buffer("selected", *known_tensor(call.info, call, "the result"))
    body = _Kernel(call, bufs, out).body()
    buffers = [*bufs.values(), out]
    func: TensorFunc = hand_kernel([*buffers, *free_syms(body, buffers)], body, "opaque")
    gv = ctx.add_kernel("non_max_suppression", func)
    return call_tensor(gv, list(call.args), call.info, tuple(func.sym_params))


register(Op("non_max_suppression", _infer_nms, OpPattern.OPAQUE, attrs={"center_point_box": False, "use_score_threshold": True}, legalize=_legalize_nms))


def non_max_suppression(
    boxes: Expr, scores: Expr, max_out: Expr, iou_threshold: Expr, score_threshold: Expr,
    center_point_box: bool = False, use_score_threshold: bool = True,
) -> Call:  # fmt: skip
    """The kept box indices per image and class, in order, padded with -1 (see the module
    docstring); ``max_out``, ``iou_threshold`` and ``score_threshold`` have shape ``(1,)``."""
    args = [boxes, scores, max_out, iou_threshold, score_threshold]
    return make_call("non_max_suppression", args, center_point_box=bool(center_point_box), use_score_threshold=bool(use_score_threshold))


__all__ = ["non_max_suppression"]
