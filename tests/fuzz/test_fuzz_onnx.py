"""Fuzzing the ONNX importer with mutated real models: the serialized bytes cut short or with
bits flipped, and the graph itself changed (attributes, shape operands, element types, dims,
op types, wiring, opset). Every model imports to a well-formed module or raises a
``TileworkError``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.util import fuzz_settings, result_or_tilework_error
from tilework.ir.verify import verify

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tilework.frontend.onnx import from_onnx  # noqa: E402
from tilework.frontend.onnx.importer import load_model  # noqa: E402


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: dict[str, np.ndarray], opset: int = 17) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def _attention_block() -> bytes:
    """LayerNorm, projections, a head split through Shape/Gather/Concat/Reshape, softmax."""
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["h"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["h", "wq"], ["q"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["batch"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["seq"], axis=0),
        helper.make_node("Concat", ["batch", "seq", "heads", "minus1"], ["split_shape"], axis=0),
        helper.make_node("Reshape", ["q", "split_shape"], ["qh"]),
        helper.make_node("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["qt"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qt", "kt"], ["scores"]),
        helper.make_node("Div", ["scores", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "qt"], ["o"]),
        helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ot", "back_shape"], ["y0"]),
        helper.make_node("Add", ["y0", "x"], ["y"]),
    ]
    inits = {
        "g": f(8), "b": f(8), "wq": f(8, 8), "i0": np.array([0], np.int64), "i1": np.array([1], np.int64),
        "heads": np.array([2], np.int64), "minus1": np.array([-1], np.int64), "scale": np.array(2.0, np.float32),
        "back_shape": np.array([0, 0, 8], np.int64),
    }
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", 8]) for n in ("x", "y")]
    return _model(nodes, io[:1], io[1:], inits)


def _conv_net() -> bytes:
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Conv", ["x", "w", "cb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["gp"]),
        helper.make_node("Flatten", ["gp"], ["fl"], axis=1),
        helper.make_node("Gemm", ["fl", "fw", "fb"], ["y"], transB=1),
    ]
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "cb": np.zeros(4, np.float32), "fw": rng.standard_normal((5, 4)).astype(np.float32), "fb": np.zeros(5, np.float32)}
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])], inits)


def _shape_ops() -> bytes:
    """Data-dependent and constant shape arithmetic: ConstantOfShape, Expand, Slice, Where,
    ReduceSum, Cast, Range, Unsqueeze, Tile."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], value=numpy_helper.from_array(np.array([1.0], np.float32))),
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["sl"]),
        helper.make_node("Expand", ["sl", "s"], ["ex"]),
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("Where", ["pos", "ex", "ones"], ["w"]),
        helper.make_node("ReduceSum", ["w", "axes"], ["rs"], keepdims=1),
        helper.make_node("Cast", ["rs"], ["ri"], to=TensorProto.INT64),
        helper.make_node("Range", ["r0", "r1", "r2"], ["rg"]),
        helper.make_node("Cast", ["rg"], ["rf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["rf", "axes"], ["ru"]),
        helper.make_node("Tile", ["ru", "reps"], ["t"]),
        helper.make_node("Add", ["w", "rs"], ["y"]),
    ]
    inits = {
        "starts": np.array([0], np.int64), "ends": np.array([1], np.int64), "axes": np.array([1], np.int64),
        "zero": np.array(0.0, np.float32), "r0": np.array(0, np.int64), "r1": np.array(5, np.int64), "r2": np.array(2, np.int64),
        "reps": np.array([2, 1], np.int64),
    }
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "m"]), helper.make_tensor_value_info("t", TensorProto.FLOAT, [None, None]), helper.make_tensor_value_info("ri", TensorProto.INT64, [None, None])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "m"])], outs, inits)


MODELS = [_attention_block(), _conv_net(), _shape_ops()]
OPS = ["Add", "MatMul", "Reshape", "Transpose", "Softmax", "Concat", "Gather", "Slice", "Expand", "ConstantOfShape", "Range", "Tile", "Conv", "Relu", "Where", "Cast", "Shape", "Unsqueeze", "Squeeze", "Split", "ReduceMean", "Pad", "Resize", "TopK", "If", "Loop", "Identity", "Flatten", "NoSuchOp"]
INTS = st.sampled_from([0, 1, -1, 2, -2, 3, 7, 64, 2**31 - 1, -(2**31), 2**40, 2**62])
ELEM_TYPES = st.sampled_from([TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.STRING, TensorProto.UINT64, TensorProto.FLOAT8E4M3FN, TensorProto.COMPLEX64, 0, 99])


def _import(data: bytes) -> None:
    mod = result_or_tilework_error(lambda: from_onnx(load_model(data)))
    if mod is not None:
        verify(mod)  # an import that succeeds gives a well-formed module


@fuzz_settings(60)
@given(st.sampled_from(MODELS), st.data())
def test_damaged_bytes(data: bytes, draw: st.DataObject) -> None:
    kind = draw.draw(st.sampled_from(["truncate", "flip", "splice"]))
    buf = bytearray(data)
    if kind == "truncate":
        buf = buf[: draw.draw(st.integers(0, len(buf) - 1))]
    elif kind == "flip":
        for _ in range(draw.draw(st.integers(1, 8))):
            i = draw.draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << draw.draw(st.integers(0, 7))
    else:
        i = draw.draw(st.integers(0, len(buf)))
        buf[i:i] = draw.draw(st.binary(max_size=16))
    _import(bytes(buf))


def _mutate(m: Any, draw: st.DataObject) -> None:
    g = m.graph
    kind = draw.draw(st.sampled_from(["attr", "init", "elem", "dim", "op", "wire", "drop", "opset", "output"]))
    node = g.node[draw.draw(st.integers(0, len(g.node) - 1))]
    if kind == "attr" and node.attribute:
        a = node.attribute[draw.draw(st.integers(0, len(node.attribute) - 1))]
        if a.type == onnx.AttributeProto.INT:
            a.i = draw.draw(INTS)
        elif a.type == onnx.AttributeProto.INTS:
            a.ints[:] = draw.draw(st.lists(INTS, max_size=5))
        elif a.type == onnx.AttributeProto.FLOAT:
            a.f = draw.draw(st.floats(allow_nan=True, allow_infinity=True, width=32))
    elif kind == "init" and g.initializer:
        t = g.initializer[draw.draw(st.integers(0, len(g.initializer) - 1))]
        arr = numpy_helper.to_array(t)
        if arr.dtype.kind in "iu":
            new = np.array(draw.draw(st.lists(INTS, min_size=0, max_size=5)), dtype=arr.dtype) if draw.draw(st.booleans()) else np.full(arr.shape, draw.draw(INTS)).astype(arr.dtype)
        else:
            new = arr.reshape(-1)[: draw.draw(st.integers(0, arr.size))]
        t.CopyFrom(numpy_helper.from_array(new, t.name))
    elif kind == "elem":
        vi = draw.draw(st.sampled_from(list(g.input) + list(g.output)))
        vi.type.tensor_type.elem_type = draw.draw(ELEM_TYPES)
    elif kind == "dim":
        vi = draw.draw(st.sampled_from(list(g.input) + list(g.output)))
        dims = vi.type.tensor_type.shape.dim
        if dims:
            d = dims[draw.draw(st.integers(0, len(dims) - 1))]
            if draw.draw(st.booleans()):
                d.dim_value = draw.draw(st.sampled_from([0, 1, 2, 5, 2**40]))
            else:
                d.dim_param = draw.draw(st.sampled_from(["n", "m", "seq", "", "1x", "a b"]))
        elif draw.draw(st.booleans()):
            vi.type.tensor_type.ClearField("shape")
    elif kind == "op":
        node.op_type = draw.draw(st.sampled_from(OPS))
    elif kind == "wire" and node.input:
        names = [v.name for v in g.input] + [t.name for t in g.initializer] + [o for n in g.node for o in n.output] + ["", "undefined"]
        node.input[draw.draw(st.integers(0, len(node.input) - 1))] = draw.draw(st.sampled_from(names))
    elif kind == "drop":
        del g.node[draw.draw(st.integers(0, len(g.node) - 1))]
    elif kind == "opset":
        m.opset_import[0].version = draw.draw(st.integers(-1, 30))
    elif kind == "output":
        g.output[0].name = draw.draw(st.sampled_from(["x", "missing", g.node[0].output[0]]))


@fuzz_settings(120)
@given(st.sampled_from(MODELS), st.data())
def test_mutated_graphs(data: bytes, draw: st.DataObject) -> None:
    m = onnx.ModelProto()
    m.ParseFromString(data)
    for _ in range(draw.draw(st.integers(1, 3))):
        if not m.graph.node:
            break
        _mutate(m, draw)
    _import(m.SerializeToString())


def test_models_import() -> None:
    for data in MODELS:
        verify(from_onnx(load_model(data)))
