"""Helpers for the ONNX frontend tests: build small models, run them through tilework and
onnxruntime."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import tilework
from tilework.frontend.onnx import from_onnx

DTYPE = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("int64"): TensorProto.INT64, np.dtype("bool"): TensorProto.BOOL}


def tensor(name: str, elem: int, shape: Sequence[int | str | None]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[tuple[str, np.ndarray]] = (),
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), [numpy_helper.from_array(a, n) for n, a in initializers])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tilework-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def ort_run(m: onnx.ModelProto, *inputs: np.ndarray) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return [np.asarray(o) for o in sess.run(None, dict(zip(names, inputs)))]


def compile_onnx(m: onnx.ModelProto, **kw: Any) -> Any:
    """The VM function ``main`` of the compiled model."""
    return tilework.VM(tilework.build(from_onnx(m, **kw)))["main"]


def outputs(result: Any) -> list[np.ndarray]:
    return [np.asarray(r) for r in (result if isinstance(result, tuple) else (result,))]


def assert_matches_reference(m: onnx.ModelProto, runs: Sequence[Sequence[np.ndarray]], rtol: float = 1e-5, atol: float = 1e-5, **kw: Any) -> None:
    """Compile ``m`` once (``kw`` to ``from_onnx``) and compare with onnx's reference evaluator
    on every input set of ``runs`` (for ops and opsets onnxruntime does not have)."""
    from onnx.reference import ReferenceEvaluator

    fn = compile_onnx(m, **kw)
    ref = ReferenceEvaluator(m)
    names = [i.name for i in m.graph.input]
    for inputs in runs:
        got = outputs(fn(*inputs))
        want = [np.asarray(w) for w in ref.run(None, dict(zip(names, inputs)))]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def assert_matches_ort(m: onnx.ModelProto, runs: Sequence[Sequence[np.ndarray]], rtol: float = 1e-5, atol: float = 1e-6, **kw: Any) -> None:
    """Compile ``m`` once and compare with onnxruntime on every input set of ``runs``."""
    fn = compile_onnx(m, **kw)
    for inputs in runs:
        got = outputs(fn(*inputs))
        want = ort_run(m, *inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
