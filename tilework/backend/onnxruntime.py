"""The ``onnxruntime`` backend: regions of ops compiled by ONNX Runtime.

A graph-level (``region``) backend: its capabilities claim single ops it can convert
(``onnx_export.CONVERTERS``: elementwise arithmetic and activations, matmul, linear, softmax,
layer/RMS norm, reshape, permute_dims, attention; float32), and partitioning merges adjacent
claimed ops into convex regions. A region is lowered to

    call_lib("onnxruntime.run", (model, *inputs[, shape(sym vars)]), out=...)

where ``model`` is the region's ONNX graph (symbolic dims as ``dim_param``s; base64 text, so
the executable carries it and prints with the module) and the trailing shape passes the
values of the region's sym vars at run time when a shape inside the region needs them. The
extern keeps one ``InferenceSession`` per model, created on the region's first call, and runs
it with IO binding over the VM's buffers: inputs are read and outputs written in place
(OrtValues over NumPy memory), no copies on the way in or out.
"""

from __future__ import annotations

import base64
import importlib.util
from typing import Any

import numpy as np

from tilework.backend.base import Backend, Capability, Region, lib_call, register_backend
from tilework.backend.onnx_export import CONVERTERS, export, supported
from tilework.errors import RuntimeCheckError
from tilework.ir.graph import Call, StringImm
from tilework.pattern.core import op_call
from tilework.pattern.graph import PatternMatch
from tilework.runtime.extern import register_extern

SYMBOL = "onnxruntime.run"
INTRA_OP_THREADS = 0  # threads of each session's pool; 0: onnxruntime's default (one per core)


def _available() -> tuple[bool, str]:
    missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        return False, f"{' and '.join(missing)} not installed (pip install onnx onnxruntime)"
    import onnxruntime

    return True, f"onnxruntime {onnxruntime.__version__} (CPUExecutionProvider), one session per region, IO binding"


class _Runner:
    """One region's session and IO binding."""

    def __init__(self, model_b64: str) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        so.intra_op_num_threads = INTRA_OP_THREADS
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # leave the cores to the next kernel
        self.session = ort.InferenceSession(base64.b64decode(model_b64), so, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.takes_dims = bool(self.inputs) and self.inputs[-1] == "tw_dims"
        self.io = self.session.io_binding()

    def __call__(self, args: tuple[Any, ...]) -> None:
        n_in = len(self.inputs)
        if len(args) != n_in + len(self.outputs):
            raise RuntimeCheckError(f"onnxruntime region takes {n_in} input(s) and {len(self.outputs)} output(s), got {len(args)} argument(s)")
        io = self.io
        for name, a in zip(self.inputs, args[:n_in]):
            if name == "tw_dims":
                a = np.asarray(a, dtype=np.int64)
                self._dims = a  # keep it alive through the run
            io.bind_input(name, "cpu", 0, a.dtype, a.shape, a.ctypes.data)
        for name, o in zip(self.outputs, args[n_in:]):
            io.bind_output(name, "cpu", 0, o.dtype, o.shape, o.ctypes.data)
        self.session.run_with_iobinding(io)


_RUNNERS: dict[str, _Runner] = {}


def run_region(model_b64: str, *args: Any) -> None:
    """The extern: ``(model, *inputs[, dims], *outputs)``."""
    runner = _RUNNERS.get(model_b64)
    if runner is None:
        runner = _RUNNERS[model_b64] = _Runner(model_b64)
    runner(args)


register_extern(SYMBOL, run_region, override=True)


def region_ops(model_b64: str) -> list[str]:
    """The ONNX op types of a region's model, each once in order of first use (for messages:
    the export's refusal names them); empty when the model does not decode."""
    try:
        import onnx

        model = onnx.load_from_string(base64.b64decode(model_b64))
    except Exception:  # a message helper: a model that does not decode has no ops to name
        return []
    return list(dict.fromkeys(node.op_type for node in model.graph.node))


def _ok(m: PatternMatch) -> bool:
    call = m.root_call
    return call is not None and supported(call)


def _lower(region: Region) -> Call:
    syms = region.sym_vars()
    model, takes_dims = export(region.inputs, region.bindings, region.outputs, syms, name=f"{region.func_name}.{region.outputs[0].name}")
    text = StringImm(base64.b64encode(model).decode("ascii"))
    return lib_call(SYMBOL, [text, *region.inputs], region, syms if takes_dims else None)


ONNXRUNTIME = register_backend(
    Backend(
        "onnxruntime",
        "region",
        _available,
        tuple(Capability(f"onnxruntime.{name}", op_call(name), _ok) for name in CONVERTERS),
        lower=_lower,
        max_region_size=512,
        description="ONNX Runtime sessions over exported regions (graph-level)",
    )
)

__all__ = ["ONNXRUNTIME", "SYMBOL", "run_region"]
