"""``NonMaxSuppression``, ``RoiAlign``, ``DeformConv``, ``TensorScatter`` and ``FlexAttention``
(domain ``ai.onnx.preview``) imported with symbolic dims (``dim_param``), compiled once and run
at several sizes, 0, 1 and odd ones included, against ONNX's reference evaluator. RoiAlign's
default run takes two of its four mode x sampling-ratio combinations (each mode and each
sampling once); the other two run only in the long tier (TILEWORK_LONG_TESTS=1)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.frontend.onnx_util import assert_matches_reference, tensor
from tests.long import long_only
from tilework.errors import UnsupportedError
from tilework.frontend.onnx import from_onnx

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(0)


def _model(nodes: Sequence[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outs: list[onnx.ValueInfoProto], opset: int, inits: Sequence[tuple[str, np.ndarray]] = (), domain: str = "") -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", inputs, outs, [numpy_helper.from_array(a, n) for n, a in inits])
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    m = helper.make_model(graph, opset_imports=opsets, producer_name="tilework-tests")
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m


def _check(m: onnx.ModelProto, runs: Sequence[Sequence[np.ndarray]], tol: float = 1e-5, **kw: object) -> None:
    assert_matches_reference(m, runs, rtol=tol, atol=tol, **kw)


def _boxes(b: int, n: int) -> np.ndarray:
    lo = RNG.integers(0, 6, size=(b, n, 2)).astype(np.float32)
    return np.concatenate([lo, lo + RNG.integers(1, 5, size=(b, n, 2))], axis=2).astype(np.float32)


def test_non_max_suppression_symbolic() -> None:
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "thr"], ["sel"])
    ins = [tensor("boxes", F, ["b", "n", 4]), tensor("scores", F, ["b", "c", "n"]), tensor("max_out", I64, [1]), tensor("iou", F, [1]), tensor("thr", F, [1])]
    m = _model([node], ins, [tensor("sel", I64, ["k", 3])], 11)

    def run(b: int, c: int, n: int, max_out: int, thr: float) -> list[np.ndarray]:
        scores = (RNG.integers(0, 5, size=(b, c, n)) / 4).astype(np.float32)
        return [_boxes(b, n), scores, np.asarray([max_out], np.int64), np.asarray([0.3], np.float32), np.asarray([thr], np.float32)]

    _check(m, [run(1, 1, 1, 5, 0.0), run(2, 3, 7, 3, 0.1), run(3, 1, 13, 100, 0.0), run(1, 2, 0, 4, 0.0), run(2, 2, 5, 4, 2.0)], dim_bounds={"n": (0, None)})


def _check_roi_align(outs: Sequence[str]) -> None:
    """The ``outs`` of four RoiAlign nodes (avg or max, a fixed or an adaptive sampling ratio
    (``...0``), half_pixel or output_half_pixel coordinates (max)) in one model."""
    attrs: dict[str, Any] = dict(output_height=3, output_width=2, sampling_ratio=2, spatial_scale=0.5)
    adaptive: dict[str, Any] = dict(attrs, sampling_ratio=0)  # ceil(bin size) points per bin: a count per ROI
    nodes = {
        "avg": helper.make_node("RoiAlign", ["x", "rois", "idx"], ["avg"], **attrs),
        "max": helper.make_node("RoiAlign", ["x", "rois", "idx"], ["max"], mode="max", coordinate_transformation_mode="output_half_pixel", **attrs),
        "avg0": helper.make_node("RoiAlign", ["x", "rois", "idx"], ["avg0"], **adaptive),
        "max0": helper.make_node("RoiAlign", ["x", "rois", "idx"], ["max0"], mode="max", coordinate_transformation_mode="output_half_pixel", **adaptive),
    }
    ins = [tensor("x", F, ["n", 3, "h", "w"]), tensor("rois", F, ["r", 4]), tensor("idx", I64, ["r"])]
    m = _model([nodes[o] for o in outs], ins, [tensor(o, F, ["r", 3, 3, 2]) for o in outs], 16)

    def run(n: int, h: int, w: int, r: int) -> list[np.ndarray]:
        x = RNG.standard_normal((n, 3, h, w)).astype(np.float32)
        lo = RNG.uniform(-3, 2 * max(h, w), size=(r, 2))  # some ROIs reach outside the image
        rois = np.concatenate([lo, lo + RNG.uniform(-1, 3 * max(h, w), size=(r, 2))], axis=1).astype(np.float32)
        return [x, rois, RNG.integers(0, n, size=r).astype(np.int64)]

    _check(m, [run(1, 1, 1, 1), run(2, 7, 5, 5), run(3, 4, 9, 0)], tol=1e-4, dim_bounds={"r": (0, None)})


def test_roi_align_symbolic() -> None:
    """Avg with a fixed sampling ratio and max with an adaptive one (and output_half_pixel):
    each mode, each sampling and each coordinate transformation once."""
    _check_roi_align(["avg", "max0"])


@long_only("the other two combinations of mode and sampling ratio")
def test_roi_align_other_combinations_symbolic() -> None:
    _check_roi_align(["max", "avg0"])


def test_deform_conv_symbolic() -> None:
    node = helper.make_node("DeformConv", ["x", "w", "offset", "b", "mask"], ["y"], group=2, offset_group=2, strides=[2, 1], pads=[1, 1, 1, 0], dilations=[1, 2])
    w = RNG.standard_normal((6, 2, 3, 2)).astype(np.float32)
    bias = RNG.standard_normal(6).astype(np.float32)
    ins = [tensor("x", F, ["n", 4, "h", "wd"]), tensor("offset", F, ["n", 24, "oh", "ow"]), tensor("mask", F, ["n", 12, "oh", "ow"])]
    m = _model([node], ins, [tensor("y", F, ["n", 6, "oh", "ow"])], 19, inits=[("w", w), ("b", bias)])

    def run(n: int, h: int, wd: int) -> list[np.ndarray]:
        oh, ow = (h + 2 - 3) // 2 + 1, wd + 1 - 3 + 1
        x = RNG.standard_normal((n, 4, h, wd)).astype(np.float32)
        offset = RNG.uniform(-2, 2, size=(n, 24, oh, ow)).astype(np.float32)
        return [x, offset, RNG.uniform(0, 1, size=(n, 12, oh, ow)).astype(np.float32)]

    _check(m, [run(1, 2, 2), run(2, 5, 7), run(1, 8, 3)], tol=1e-4)  # the reference divides by h - 1 and w - 1


def test_tensor_scatter_symbolic() -> None:
    nodes = [
        helper.make_node("TensorScatter", ["past", "update", "at"], ["linear"]),
        helper.make_node("TensorScatter", ["past", "update", "at"], ["circular"], mode="circular"),
        helper.make_node("TensorScatter", ["past", "update"], ["front"], axis=2),
    ]
    ins = [tensor("past", F, ["b", 2, "m", 3]), tensor("update", F, ["b", 2, "s", 3]), tensor("at", I64, ["b"])]
    m = _model(nodes, ins, [tensor(o, F, ["b", 2, "m", 3]) for o in ("linear", "circular", "front")], 24)

    def run(b: int, mm: int, s: int) -> list[np.ndarray]:
        past, update = RNG.standard_normal((b, 2, mm, 3)).astype(np.float32), RNG.standard_normal((b, 2, s, 3)).astype(np.float32)
        return [past, update, RNG.integers(0, mm - s + 1, size=b).astype(np.int64)]

    _check(m, [run(1, 1, 1), run(3, 5, 2), run(2, 7, 7), run(0, 3, 1)], dim_bounds={"b": (0, None)})


def _causal_score_mod() -> onnx.GraphProto:
    """Scores of keys after the query (bottom-right aligned) become -inf."""
    nodes = [
        helper.make_node("Shape", ["s"], ["shape"]),
        helper.make_node("Gather", ["shape", "i2"], ["queries"]),
        helper.make_node("Gather", ["shape", "i3"], ["keys"]),
        helper.make_node("Range", ["zero", "queries", "one"], ["qi"]),
        helper.make_node("Range", ["zero", "keys", "one"], ["ki"]),
        helper.make_node("Sub", ["keys", "queries"], ["shift"]),
        helper.make_node("Add", ["qi", "shift"], ["qpos"]),
        helper.make_node("Unsqueeze", ["qpos", "ax1"], ["qcol"]),
        helper.make_node("GreaterOrEqual", ["qcol", "ki"], ["keep"]),
        helper.make_node("Where", ["keep", "s", "ninf"], ["out"]),
    ]
    consts: list[tuple[str, np.ndarray]] = [("i2", np.asarray(2, np.int64)), ("i3", np.asarray(3, np.int64)), ("zero", np.asarray(0, np.int64)), ("one", np.asarray(1, np.int64)), ("ax1", np.asarray([1], np.int64)), ("ninf", np.asarray(-np.inf, np.float32))]
    return helper.make_graph(nodes, "causal", [tensor("s", F, ["B", "H", "L", "S"])], [tensor("out", F, ["B", "H", "L", "S"])], [numpy_helper.from_array(a, n) for n, a in consts])


def test_flex_attention_symbolic() -> None:
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview", score_mod=_causal_score_mod())
    ins = [tensor("q", F, ["b", 4, "l", 8]), tensor("k", F, ["b", 2, "s", 8]), tensor("v", F, ["b", 2, "s", 5])]
    m = _model([node], ins, [tensor("y", F, ["b", 4, "l", 5])], 26, domain="ai.onnx.preview")

    def run(b: int, lq: int, s: int) -> list[np.ndarray]:
        return [RNG.standard_normal(shape).astype(np.float32) for shape in ((b, 4, lq, 8), (b, 2, s, 8), (b, 2, s, 5))]

    _check(m, [run(1, 1, 1), run(2, 3, 7), run(1, 5, 5)], tol=1e-5)
    # a symbolic head size works with a given scale (the default one needs the size)
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview", scale=0.3)
    ins = [tensor("q", F, ["b", 2, "l", "e"]), tensor("k", F, ["b", 2, "s", "e"]), tensor("v", F, ["b", 2, "s", "e"])]
    m = _model([node], ins, [tensor("y", F, ["b", 2, "l", "e"])], 26, domain="ai.onnx.preview")
    _check(m, [[RNG.standard_normal((b, 2, n, e)).astype(np.float32) for n in (lq, s, s)] for b, lq, s, e in ((1, 1, 1, 1), (2, 3, 4, 5))])


def test_unsupported_forms_are_named() -> None:
    node = helper.make_node("DeformConv", ["x", "w", "offset"], ["y"])
    m = _model([node], [tensor("x", F, [1, 1, 4, 4, 4]), tensor("w", F, [1, 1, 2, 2, 2]), tensor("offset", F, [1, 24, 3, 3, 3])], [tensor("y", F, [1, 1, 3, 3, 3])], 19)
    with pytest.raises(UnsupportedError, match="DeformConv.*only 2-D deformable convolution"):
        from_onnx(m)
    other = helper.make_node("FlexAttention", ["q", "q", "q"], ["y"], domain="com.example")
    m = _model([other], [tensor("q", F, [1, 1, 2, 4])], [tensor("y", F, [1, 1, 2, 4])], 26, domain="com.example")
    with pytest.raises(UnsupportedError, match="com.example domain is not supported"):
        from_onnx(m)
