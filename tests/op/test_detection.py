"""``non_max_suppression`` (``tilework.op.detection``): symbolic inference, and its hand-built
kernel against a NumPy greedy NMS at symbolic batch, class and box counts (0, 1 and odd ones),
with tied scores, flipped corners, centre-format boxes, no score threshold and a negative
``max_out``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
from tests.op.helpers import T, holds, infer
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, shape_at
from tilework.errors import InferenceError, ShapeError
from tilework.ir.sym import SymVar
from tilework.op import detection

b, c, n = tw.dim("b", min=0), tw.dim("c", min=0), tw.dim("n", min=0)  # any count may be 0


def test_inference() -> None:
    info, checks = infer(detection.non_max_suppression, T(b, n, 4), T(b, c, n), T(1, dtype="int64"), T(1), T(1))
    assert info == T(b, c, n, dtype="int64") and checks == []
    m = tw.dim("m")
    info, checks = infer(detection.non_max_suppression, T(b, n, 4), T(b, c, m), T(1, dtype="int64"), T(1), T(1))
    assert info == T(b, c, n, dtype="int64") and holds(checks, {b: 1, c: 1, n: 3, m: 3}) and not holds(checks, {b: 1, c: 1, n: 3, m: 4})
    with pytest.raises(ShapeError, match="must hold 4 coordinates"):
        infer(detection.non_max_suppression, T(b, n, 5), T(b, c, n), T(1, dtype="int64"), T(1), T(1))
    with pytest.raises(ShapeError, match=r"iou_threshold must have shape \(1,\)"):
        infer(detection.non_max_suppression, T(b, n, 4), T(b, c, n), T(1, dtype="int64"), T(2), T(1))
    with pytest.raises(InferenceError, match="max_out must be int64"):
        infer(detection.non_max_suppression, T(b, n, 4), T(b, c, n), T(1, dtype="int32"), T(1), T(1))


def _corners(box: np.ndarray, center: bool) -> tuple[float, float, float, float]:
    """``(y0, y1, x0, x1)`` of one box."""
    if center:
        xc, yc, w, h = (float(v) for v in box)
        return yc - h / 2, yc + h / 2, xc - w / 2, xc + w / 2
    y1, x1, y2, x2 = (float(v) for v in box)
    return min(y1, y2), max(y1, y2), min(x1, x2), max(x1, x2)


def _overlaps(p: np.ndarray, q: np.ndarray, center: bool, thr: float) -> bool:
    ay0, ay1, ax0, ax1 = _corners(p, center)
    by0, by1, bx0, bx1 = _corners(q, center)
    ih, iw = min(ay1, by1) - max(ay0, by0), min(ax1, bx1) - max(ax0, bx0)
    area_a, area_b = (ay1 - ay0) * (ax1 - ax0), (by1 - by0) * (bx1 - bx0)
    inter = ih * iw
    union = area_a + area_b - inter
    if ih <= 0 or iw <= 0 or area_a <= 0 or area_b <= 0 or union <= 0:
        return False
    return inter / union > thr


def nms_ref(boxes: np.ndarray, scores: np.ndarray, max_out: np.ndarray, iou: np.ndarray, thr: np.ndarray, center: bool = False, use_thr: bool = True) -> np.ndarray:
    nb, nc, nn = scores.shape
    out = np.full((nb, nc, nn), -1, np.int64)
    for i in range(nb):
        for k in range(nc):
            order = sorted(range(nn), key=lambda j: (-float(scores[i, k, j]), j))
            kept: list[int] = []
            for j in order:
                if len(kept) >= int(max_out[0]) or (use_thr and not scores[i, k, j] > thr[0]):
                    continue
                if not any(_overlaps(boxes[i, j], boxes[i, q], center, float(iou[0])) for q in kept):
                    kept.append(j)
            out[i, k, : len(kept)] = kept
    return out


def _inputs(max_out: int, iou: float, thr: float, center: bool = False) -> Any:
    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        nb, nc, nn = shape_at((b, c, n), env)
        lo = rng.integers(0, 6, size=(nb, nn, 2)).astype(np.float32)
        size = rng.integers(1, 5, size=(nb, nn, 2)).astype(np.float32)
        if center:
            boxes = np.concatenate([lo + size / 2, size], axis=2)[..., [1, 0, 3, 2]]
        else:
            boxes = np.concatenate([lo, lo + size], axis=2)
            flip = rng.random((nb, nn)) < 0.3  # corners given in the other order
            boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
        scores = (rng.integers(0, 5, size=(nb, nc, nn)) / 4).astype(np.float32)  # many ties
        return [boxes, scores, np.asarray([max_out], np.int64), np.asarray([iou], np.float32), np.asarray([thr], np.float32)]

    return make


ENVS = envs({b: 1, c: 1, n: 1}, {b: 2, c: 3, n: 7}, {b: 1, c: 2, n: 0}, {b: 0, c: 1, n: 3}, {b: 3, c: 1, n: 13})
INFOS = [T(b, n, 4), T(b, c, n), T(1, dtype="int64"), T(1), T(1)]
CASES = [
    Case("nms_corners", lambda *a: detection.non_max_suppression(*a), INFOS, nms_ref, ENVS, inputs=_inputs(4, 0.3, 0.2)),
    Case("nms_center_all", lambda *a: detection.non_max_suppression(*a, center_point_box=True), INFOS, lambda *a: nms_ref(*a, center=True), ENVS, inputs=_inputs(100, 0.5, 0.0, center=True)),
    Case("nms_no_threshold", lambda *a: detection.non_max_suppression(*a, use_score_threshold=False), INFOS, lambda *a: nms_ref(*a, use_thr=False), ENVS, inputs=_inputs(3, 0.0, 10.0)),
    Case("nms_negative_max", lambda *a: detection.non_max_suppression(*a), INFOS, nms_ref, ENVS, inputs=_inputs(-2, 0.5, 0.0)),
]


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [case.name for case in CASES])
def test_nms_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)
