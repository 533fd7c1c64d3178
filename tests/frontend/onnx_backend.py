"""An ``onnx.backend.base.Backend`` that runs ONNX models through tilework.

``TileworkBackend.prepare(model)`` converts the model with ``from_onnx`` and returns a rep whose
``run(inputs)`` compiles once (on the first call) and runs the VM. Two adaptations to the way the
ONNX node tests are written, both stated here and in ``docs/conformance.md``:

- Static shapes: the test's input shapes are bound into the model's input types before
  conversion (node-test models often leave dims unnamed); the compiled code stays symbolic
  wherever the model's own dims are.
- Static operands: node tests feed *every* operand as a graph input, including those a real
  model carries as initializers because they fix the result's shape (axes, target shapes, pads,
  ``k``). Inputs that feed such an operand directly (``registry.Converter.static_inputs``) are
  turned into initializers holding the test's value. Every other input stays a run-time input.
- Sequences and optionals: a sequence input's length and whether an optional input is present
  are fixed at conversion time (``from_onnx``'s ``sequence_lengths`` and ``absent_optionals``)
  from the test's inputs; a sequence's element dims that its tensors share are bound like a
  tensor's, the others are left symbolic. A sequence input is passed as a tuple of arrays, a
  sequence output comes back as a list.

``prepare_group`` converts many models and compiles them as the functions of *one* module, so
that a test run builds one kernel library instead of one per test.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import ModelProto, numpy_helper
from onnx.backend.base import Backend, BackendRep

import tilework
from tilework.errors import TileworkError
from tilework.frontend.onnx import from_onnx
from tilework.frontend.onnx.importer import default_opset
from tilework.frontend.onnx.converters import find, schema_version
from tilework.ir.graph import GraphFunc
from tilework.ir.module import IRModule


def static_input_names(model: ModelProto) -> set[str]:
    """Graph inputs consumed directly as a static operand by some node (subgraphs included)."""
    opset = default_opset(model)
    graph_inputs = {vi.name for vi in model.graph.input}
    out: set[str] = set()

    def visit(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            version = schema_version(node.op_type, opset) if node.domain in ("", "ai.onnx") else None
            conv = None if version is None else find(node.op_type, version)
            for i in conv.static_inputs if conv is not None else ():
                if i < len(node.input) and node.input[i] in graph_inputs:
                    out.add(node.input[i])
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    visit(a.g)

    visit(model.graph)
    return out


def as_array(x: Any) -> np.ndarray:
    """A test input as an array (the node tests hold some as ``TensorProto``s)."""
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


def _set_shape(t: onnx.TypeProto, arrays: Sequence[np.ndarray]) -> None:
    """The tensor type ``t`` given the dims ``arrays`` share (and unnamed dims where they differ);
    left as it is when their ranks differ."""
    if not arrays or len({a.ndim for a in arrays}) != 1 or not t.HasField("tensor_type"):
        return
    shape = t.tensor_type.shape
    shape.ClearField("dim")
    for axis in range(arrays[0].ndim):
        sizes = {a.shape[axis] for a in arrays}
        d = shape.dim.add()
        if len(sizes) == 1:
            d.dim_value = int(sizes.pop())


def _specialize_type(t: onnx.TypeProto, value: Any) -> None:
    """The tensor, sequence or optional type ``t`` given the test's value."""
    if t.HasField("optional_type"):
        if value is not None:
            _specialize_type(t.optional_type.elem_type, value)
    elif t.HasField("sequence_type"):
        _set_shape(t.sequence_type.elem_type, [as_array(x) for x in value])
    else:
        _set_shape(t, [as_array(value)])


def structure(model: ModelProto, inputs: Sequence[Any]) -> tuple[dict[str, int], list[str]]:
    """The lengths of the sequence inputs and the names of the absent optional inputs."""
    lengths: dict[str, int] = {}
    absent: list[str] = []
    for vi, x in zip(_real_inputs(model), inputs):
        if vi.type.HasField("optional_type") and x is None:
            absent.append(vi.name)
        elif isinstance(x, (list, tuple)):
            lengths[vi.name] = len(x)
    return lengths, absent


def convert(model: ModelProto, inputs: Sequence[Any]) -> IRModule:
    """``from_onnx`` of the model specialized to the test's inputs."""
    lengths, absent = structure(model, inputs)
    return from_onnx(specialize(model, inputs), sequence_lengths=lengths, absent_optionals=absent)


def _real_inputs(model: ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def _runtime_value(x: Any) -> Any:
    """A test input as the VM takes it: a sequence as a tuple of arrays."""
    return tuple(as_array(a) for a in x) if isinstance(x, (list, tuple)) else as_array(x)


def _as_output(x: Any) -> Any:
    """A VM result as the tests compare it: a sequence (a tuple) as a list of arrays."""
    return [_as_output(a) for a in x] if isinstance(x, tuple) else np.asarray(x)


def specialize(model: ModelProto, inputs: Sequence[Any]) -> ModelProto:
    """``model`` with input shapes set from ``inputs`` and static operands made initializers."""
    m = ModelProto()
    m.CopyFrom(model)
    real = _real_inputs(m)
    if len(real) != len(inputs):
        raise TileworkError(f"the model has {len(real)} inputs, the test gives {len(inputs)}")
    static = static_input_names(m)
    keep = []
    for vi, x in zip(real, inputs):
        if vi.name in static:
            m.graph.initializer.append(numpy_helper.from_array(as_array(x), vi.name))
            continue
        _specialize_type(vi.type, x)
        keep.append(vi)
    del m.graph.input[:]
    m.graph.input.extend(keep)
    return m


def _dynamic_inputs(model: ModelProto, inputs: Sequence[Any]) -> list[Any]:
    static = static_input_names(model)
    return [_runtime_value(a) for vi, a in zip(_real_inputs(model), inputs) if vi.name not in static and a is not None]


class TileworkRep(BackendRep):
    """A model prepared for running; compiles on the first ``run`` (its inputs fix the static
    shapes and operands)."""

    def __init__(self, model: ModelProto) -> None:
        self.model = model
        self.vm: Any = None
        self.fn = "main"

    def bind(self, vm: Any, fn: str) -> None:
        self.vm, self.fn = vm, fn

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        arrays = list(inputs.values()) if isinstance(inputs, dict) else list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if self.vm is None:
            mod = convert(self.model, arrays)
            self.vm = tilework.VM(tilework.build(mod))
        out = self.vm[self.fn](*_dynamic_inputs(self.model, arrays))
        outs = (out,) if len(self.model.graph.output) == 1 else out
        return tuple(_as_output(o) for o in outs)


class TileworkBackend(Backend):
    """ONNX backend API over tilework (CPU only)."""

    _prepared: dict[str, TileworkRep] = {}

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"

    @classmethod
    def prepare(cls, model: ModelProto, device: str = "CPU", **kwargs: Any) -> TileworkRep:
        key = model_key(model)
        rep = cls._prepared.get(key)
        return rep if rep is not None else TileworkRep(model)

    @classmethod
    def run_model(cls, model: ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU", outputs_info: Any = None, **kwargs: Any) -> tuple[np.ndarray, ...]:
        raise TileworkError("run_node is not supported: tilework compiles whole models (use run_model)")

    @classmethod
    def prepare_group(cls, cases: Sequence[tuple[str, ModelProto, Sequence[np.ndarray]]]) -> dict[str, str]:
        """Convert every ``(name, model, inputs)`` and compile the ones that convert as functions
        of one module; later ``prepare`` calls of those models return the compiled reps. Returns
        the conversion or build error of each case that failed (by name)."""
        errors: dict[str, str] = {}
        funcs: dict[str, tuple[GraphFunc, ModelProto]] = {}
        for name, model, inputs in cases:
            try:
                mod = convert(model, inputs)
            except Exception as e:  # noqa: BLE001 - recorded per case, raised again by its test
                errors[name] = f"{type(e).__name__}: {e}"
                continue
            main = mod["main"]
            assert isinstance(main, GraphFunc)
            funcs[_fn_name(name)] = (main, model)
        if not funcs:
            return errors
        vms = _build_all({k: f for k, (f, _) in funcs.items()}, errors)
        for fn, (_, model) in funcs.items():
            if fn in vms:
                rep = TileworkRep(model)
                rep.bind(vms[fn], fn)
                cls._prepared[model_key(model)] = rep
        return errors


def _fn_name(test: str) -> str:
    return "f_" + "".join(c if c.isalnum() else "_" for c in test)


def _build_all(funcs: dict[str, GraphFunc], errors: dict[str, str]) -> dict[str, Any]:
    """One build for all functions; when it fails, halve the group to isolate the culprits."""
    try:
        vm = tilework.VM(tilework.build(IRModule(funcs)))
        return {name: vm for name in funcs}
    except Exception as e:  # noqa: BLE001
        if len(funcs) == 1:
            errors[next(iter(funcs))] = f"{type(e).__name__}: {e}"
            return {}
    names = list(funcs)
    half = len(names) // 2
    out = _build_all({n: funcs[n] for n in names[:half]}, errors)
    out.update(_build_all({n: funcs[n] for n in names[half:]}, errors))
    return out


def model_key(model: ModelProto) -> str:
    return hashlib.sha1(model.SerializeToString()).hexdigest()


__all__ = ["TileworkBackend", "TileworkRep", "specialize", "convert", "structure", "static_input_names", "model_key"]
