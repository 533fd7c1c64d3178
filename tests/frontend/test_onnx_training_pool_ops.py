"""ONNX ops whose less common forms tilework converts: BatchNormalization in training mode
(batch statistics and the running-statistics outputs), MaxPool's Indices output, Unique along an axis, GatherND with batch dims and Resize's antialias and
tf_crop_and_resize forms. Each model has symbolic dims, is compiled once and runs at sizes
including 1 and odd ones against ONNX's reference evaluator or onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.frontend.onnx_util import assert_matches_ort, assert_matches_reference, compile_onnx, model, outputs, tensor

F, I64 = TensorProto.FLOAT, TensorProto.INT64
rng = np.random.default_rng(0)


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# -- BatchNormalization in training mode ----------------------------------------------------


def test_batch_norm_training_mode() -> None:
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["y", "rmean", "rvar"], training_mode=1, momentum=0.8, epsilon=1e-3)
    vec = [tensor(n, F, [3]) for n in ("s", "b", "mean", "var")]
    m = model([node], [tensor("x", F, ["n", 3, "h"]), *vec], [tensor("y", F, ["n", 3, "h"]), tensor("rmean", F, [3]), tensor("rvar", F, [3])], opset=15)
    params = [randn(3), randn(3), randn(3), np.abs(randn(3))]
    assert_matches_reference(m, [[randn(1, 3, 1), *params], [randn(2, 3, 5), *params], [randn(3, 3, 7), *params]])


# -- GatherND with batch dims ---------------------------------------------------------------


@pytest.mark.parametrize("batch_dims", [1, 2])
def test_gather_nd_batch_dims(batch_dims: int) -> None:
    dshape = [2, 3, 4, 5][: batch_dims + 2] if batch_dims == 2 else [3, 4, 5]
    k = 2 if batch_dims == 1 else 1
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)
    ishape: list[int | str] = [*dshape[:batch_dims], "m", k]
    m = model([node], [tensor("x", F, dshape), tensor("i", I64, ishape)], [tensor("y", F, [*dshape[:batch_dims], "m", *dshape[batch_dims + k :]])], opset=13)

    def index(rows: int) -> np.ndarray:
        lead = dshape[batch_dims : batch_dims + k]
        cols = [rng.integers(-d, d, size=(*dshape[:batch_dims], rows)) for d in lead]
        return np.stack(cols, axis=-1).astype(np.int64)

    assert_matches_reference(m, [[randn(*dshape), index(r)] for r in (1, 3, 4)])


# -- MaxPool's Indices ----------------------------------------------------------------------


def test_max_pool_indices_storage_orders_and_1d() -> None:
    nodes = [
        helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=(2, 3), strides=(2, 1), pads=(1, 1, 0, 1), ceil_mode=1),
        helper.make_node("MaxPool", ["x"], ["y2", "i2"], kernel_shape=(3, 2), pads=(1, 0, 1, 1), storage_order=1),
        helper.make_node("MaxPool", ["v"], ["y3", "i3"], kernel_shape=(3,), strides=(2,), pads=(1, 1)),
    ]
    outs = [tensor(o, F if o[0] == "y" else I64, ["n", 3, None, None]) for o in ("y", "i", "y2", "i2")]
    outs += [tensor("y3", F, ["n", 3, None]), tensor("i3", I64, ["n", 3, None])]
    m = model(nodes, [tensor("x", F, ["n", 3, "h", "w"]), tensor("v", F, ["n", 3, "l"])], outs, opset=12)
    # onnxruntime: the reference evaluator transposes the input of storage_order=1
    assert_matches_ort(m, [[randn(n, 3, h, w), randn(n, 3, ln)] for n, h, w, ln in ((1, 1, 1, 1), (2, 5, 4, 6), (1, 4, 7, 9))])


# -- Unique along an axis -------------------------------------------------------------------


@pytest.mark.parametrize("is_sorted", [1, 0])
def test_unique_along_an_axis(is_sorted: int) -> None:
    """Columns (axis -1) of a ``[n, w]`` input, both dims symbolic, against NumPy (the reference
    evaluator takes the unsorted slices along axis 0)."""
    node = helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], axis=-1, sorted=is_sorted)
    outs = [tensor("y", F, ["n", "u"]), tensor("first", I64, ["u"]), tensor("inverse", I64, ["w"]), tensor("counts", I64, ["u"])]
    fn = compile_onnx(model([node], [tensor("x", F, ["n", "w"])], outs, opset=11))
    cols = rng.integers(0, 2, size=(3, 4)).astype(np.float32)
    for x in (cols[:1, :1], cols[:, [1, 0, 1, 3, 2, 0, 0]], cols[:2, [3, 3, 3]]):
        u, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=-1)
        if not is_sorted:  # in order of first occurrence
            order = np.argsort(first, kind="stable")
            u, first, counts, inverse = u[:, order], first[order], counts[order], np.argsort(order)[inverse]
        for g, w in zip(outputs(fn(x)), (u, first, inverse.reshape(-1), counts)):
            np.testing.assert_array_equal(g, w)


# -- Resize: antialias and tf_crop_and_resize -----------------------------------------------


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias(mode: str) -> None:
    """A shrink by scales of symbolic dims (the antialiased kernel spans 1/scale taps) and one to
    static sizes with exclude_outside."""
    consts = [("scales", np.array([1.0, 1.0, 0.5, 0.75], np.float32)), ("sizes", np.array([3, 2], np.int64))]
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, antialias=1),
        helper.make_node("Resize", ["z", "", "", "sizes"], ["y2"], mode=mode, antialias=1, exclude_outside=1, axes=[2, 3], cubic_coeff_a=-0.5),
    ]
    m = model(nodes, [tensor("x", F, ["n", 2, "h", "w"]), tensor("z", F, [1, 3, 7, 5])], [tensor("y", F, ["n", 2, None, None]), tensor("y2", F, [1, 3, 3, 2])], consts, opset=19)
    assert_matches_reference(m, [[randn(n, 2, h, w), randn(1, 3, 7, 5)] for n, h, w in ((1, 2, 5), (2, 9, 10), (1, 6, 11))])


def test_resize_tf_crop_and_resize() -> None:
    """Boxes partly outside the input (the extrapolation value there), on symbolic dims."""
    consts = [
        ("roi", np.array([0.2, -0.1, 0.9, 1.3], np.float32)),
        ("sizes", np.array([4, 1], np.int64)),
        ("roi2", np.array([0, 0, 0.1, 0.3, 1, 1, 0.6, 0.7], np.float32)),
        ("sizes2", np.array([1, 2, 5, 3], np.int64)),
    ]
    nodes = [
        helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="linear", coordinate_transformation_mode="tf_crop_and_resize", axes=[2, 3], extrapolation_value=-3.0),
        helper.make_node("Resize", ["x", "roi2", "", "sizes2"], ["y2"], mode="nearest", coordinate_transformation_mode="tf_crop_and_resize"),
    ]
    m = model(nodes, [tensor("x", F, [1, 2, "h", "w"])], [tensor("y", F, [1, 2, 4, 1]), tensor("y2", F, [1, 2, 5, 3])], consts, opset=19)
    assert_matches_reference(m, [[randn(1, 2, h, w)] for h, w in ((1, 1), (4, 5), (7, 3))])
