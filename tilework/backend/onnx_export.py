"""A region of tilework ops as an ONNX graph (for the ``onnxruntime`` backend).

The graph's inputs are the region's inputs (``in0``, ``in1``, ...: tensors whose symbolic dims
are ``dim_param``s named by the dim's text, so ``3 * n`` is one name) and, when a shape inside
the region depends on sym vars, ``tw_dims``: an int64 vector with the values of the region's
sym vars, passed at run time. Its outputs are the region's outputs in order. Shapes computed
from dims (reshape targets) are built from ``tw_dims`` with ONNX integer arithmetic, mirroring
the symbolic expressions (``//`` and ``%`` of non-negative dims by positive divisors agree with
ONNX's truncating ``Div`` and ``Mod``).

``CONVERTERS`` maps an op name to its converter; ``supported(call)`` says whether a call can
be converted (dtype float32, known shapes, and the op's own conditions).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from tilework.errors import UnsupportedError
from tilework.ir import sym
from tilework.ir.graph import Call, Constant, Expr, OpRef, Var
from tilework.ir.info import StructInfo, TensorInfo
from tilework.ir.sym import Dim, FloorDiv, FloorMod, Max, Min, Poly, SymVar
from tilework.ir.dtype import DTYPE_TABLE, np_dtype, to_onnx

OPSET = 23
IR_VERSION = 10
DIMS_INPUT = "tw_dims"

UNARY = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "neg": "Neg", "abs": "Abs", "erf": "Erf"}
BINARY = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div", "maximum": "Max", "minimum": "Min", "power": "Pow"}


def _onnx() -> Any:
    import onnx

    return onnx


def _elem(dtype: str | None) -> int:
    if dtype is None or dtype not in DTYPE_TABLE:
        raise UnsupportedError(f"no ONNX element type for dtype {dtype}")
    return to_onnx(dtype)


def _op(call: Call) -> str:
    """The name of the op ``call`` applies (``supported`` admits op calls only)."""
    if not isinstance(call.callee, OpRef):
        raise UnsupportedError(f"{call!r} is not an op call")
    return call.callee.name


def _shape(e: Expr) -> tuple[Dim, ...]:
    info = e.info
    if not isinstance(info, TensorInfo) or info.shape is None:
        raise UnsupportedError(f"{e!r} has no known shape")
    return info.shape


class OnnxGraph:
    """Builds the ONNX graph of one region."""

    def __init__(self, sym_vars: tuple[SymVar, ...]) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.names: dict[int, str] = {}
        self.sym_index = {v: i for i, v in enumerate(sym_vars)}
        self.uses_dims = False
        self._count = 0
        self._consts: dict[tuple[Any, ...], str] = {}
        self._dims: dict[Dim, str] = {}

    def fresh(self, hint: str = "t") -> str:
        self._count += 1
        return f"_{hint}{self._count}"

    def name(self, e: Expr) -> str:
        if id(e) not in self.names:
            raise UnsupportedError(f"{e!r} is read inside the region but is neither an input nor bound there")
        return self.names[id(e)]

    def node(self, op: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        out = out or self.fresh(op.lower())
        self.nodes.append(_onnx().helper.make_node(op, inputs, [out], **attrs))
        return out

    # -- constants and dims -----------------------------------------------------------------

    def const(self, values: Any, dtype: str, shape: tuple[int, ...] | None = None) -> str:
        import numpy as np

        arr = np.asarray(values, dtype=np_dtype(dtype))
        if shape is not None:
            arr = arr.reshape(shape)
        key = (dtype, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = self.fresh("c")
            self.inits.append(_onnx().numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def dim(self, d: Dim) -> str:
        """An int64 ``[1]`` tensor holding the value of ``d``."""
        if isinstance(d, int):
            return self.const([d], "int64")
        if d in self._dims:
            return self._dims[d]
        if isinstance(d, SymVar):
            if d not in self.sym_index:
                raise UnsupportedError(f"sym var {d.name} is not among the region's dims")
            self.uses_dims = True
            out = self.node("Gather", [DIMS_INPUT, self.const([self.sym_index[d]], "int64")], axis=0)
        elif isinstance(d, Poly):
            out = self._poly(d)
        elif isinstance(d, (FloorDiv, FloorMod, Min, Max)):
            op = {FloorDiv: "Div", FloorMod: "Mod", Min: "Min", Max: "Max"}[type(d)]
            out = self.node(op, [self.dim(d.a), self.dim(d.b)])
        else:
            raise UnsupportedError(f"cannot express dim {sym.to_str(d)} in ONNX")
        self._dims[d] = out
        return out

    def _poly(self, d: Poly) -> str:
        acc: str | None = None
        for mono, coeff in d.terms:
            t = self.dim(mono[0])
            for atom in mono[1:]:
                t = self.node("Mul", [t, self.dim(atom)])
            if coeff != 1:
                t = self.node("Mul", [t, self.const([coeff], "int64")])
            acc = t if acc is None else self.node("Add", [acc, t])
        assert acc is not None
        return acc if d.const == 0 else self.node("Add", [acc, self.const([d.const], "int64")])

    def shape(self, dims: tuple[Dim, ...]) -> str:
        """An int64 ``[len(dims)]`` tensor holding ``dims``."""
        if sym.is_static(dims):
            return self.const(list(dims), "int64")
        return self.node("Concat", [self.dim(d) for d in dims], axis=0)


# -- converters ------------------------------------------------------------------------------

Converter = Callable[[OnnxGraph, Call, str], None]


def _unary(gr: OnnxGraph, call: Call, out: str) -> None:
    name = _op(call)
    x = gr.name(call.args[0])
    if name == "silu":
        gr.node("Mul", [x, gr.node("Sigmoid", [x])], out)
    elif name == "gelu":
        gr.node("Gelu", [x], out)
    elif name == "gelu_tanh":
        gr.node("Gelu", [x], out, approximate="tanh")
    elif name == "rsqrt":
        gr.node("Reciprocal", [gr.node("Sqrt", [x])], out)
    elif name == "square":
        gr.node("Mul", [x, x], out)
    else:
        gr.node(UNARY[name], [x], out)


def _binary(gr: OnnxGraph, call: Call, out: str) -> None:
    gr.node(BINARY[_op(call)], [gr.name(a) for a in call.args], out)


def _matmul(gr: OnnxGraph, call: Call, out: str) -> None:
    gr.node("MatMul", [gr.name(a) for a in call.args], out)


def _linear(gr: OnnxGraph, call: Call, out: str) -> None:
    x, w = call.args[0], call.args[1]
    sx, sw = _shape(x), _shape(w)
    ins = [gr.name(a) for a in call.args]
    if len(sx) == 2:
        gr.node("Gemm", ins, out, transB=1)
        return
    x2 = gr.node("Reshape", [ins[0], gr.shape((sym.product(sx[:-1]), sx[-1]))], allowzero=1)
    y = gr.node("Gemm", [x2, *ins[1:]], transB=1)
    gr.node("Reshape", [y, gr.shape((*sx[:-1], sw[0]))], out, allowzero=1)


def _softmax(gr: OnnxGraph, call: Call, out: str) -> None:
    op = "Softmax" if _op(call) == "softmax" else "LogSoftmax"
    gr.node(op, [gr.name(call.args[0])], out, axis=int(call.attrs["axis"]))


def trailing_axis(call: Call) -> int | None:
    """The first normalized axis when a norm's ``axes`` are its input's trailing axes."""
    nd = len(_shape(call.args[0]))
    axes = sorted(a + nd if a < 0 else a for a in call.attrs["axes"])
    return axes[0] if axes and axes == list(range(axes[0], nd)) else None


def _norm(gr: OnnxGraph, call: Call, out: str) -> None:
    op = "LayerNormalization" if _op(call) == "layer_norm" else "RMSNormalization"
    axis = trailing_axis(call)
    assert axis is not None
    gr.node(op, [gr.name(a) for a in call.args], out, axis=axis, epsilon=float(call.attrs["eps"]))


def _reshape(gr: OnnxGraph, call: Call, out: str) -> None:
    gr.node("Reshape", [gr.name(call.args[0]), gr.shape(_shape(call))], out, allowzero=1)


def _permute(gr: OnnxGraph, call: Call, out: str) -> None:
    axes = call.attrs["axes"]
    nd = len(_shape(call.args[0]))
    perm = list(range(nd))[::-1] if axes is None else [a + nd if a < 0 else a for a in axes]
    gr.node("Transpose", [gr.name(call.args[0])], out, perm=perm)


def _attention(gr: OnnxGraph, call: Call, out: str) -> None:
    """Scores in ``[b, heads, seq_q, seq_kv]``; grouped KV heads by folding the group into the
    query rows (``[b, kv_heads, group * seq_q, d]``), so K and V are never repeated."""
    q, k, v = call.args[:3]
    mask = call.args[3] if len(call.args) == 4 else None
    nh, nkv, hd = _shape(q)[2], _shape(k)[2], _shape(q)[3]
    scale = call.attrs["scale"]
    if scale is None:
        if not isinstance(hd, int):
            raise UnsupportedError("attention with a symbolic head size needs a scale")
        scale = 1.0 / math.sqrt(hd)
    scale = float(scale)
    qt = gr.node("Transpose", [gr.name(q)], perm=[0, 2, 1, 3])
    kt = gr.node("Transpose", [gr.name(k)], perm=[0, 2, 3, 1])
    vt = gr.node("Transpose", [gr.name(v)], perm=[0, 2, 1, 3])
    qs = gr.node("Mul", [qt, gr.const(scale, "float32")])
    grouped = nh != nkv
    fold = gr.const([0, nkv, -1, 0], "int64") if grouped else ""
    unfold = gr.const([0, nh, -1, 0], "int64") if grouped else ""
    s = gr.node("MatMul", [gr.node("Reshape", [qs, fold]) if grouped else qs, kt])
    if grouped:
        s = gr.node("Reshape", [s, unfold])
    empty_rows = False
    if mask is not None:
        if isinstance(mask.info, TensorInfo) and mask.info.dtype == "bool":
            s = gr.node("Where", [gr.name(mask), s, gr.const(-math.inf, "float32")])
            empty_rows = True
        else:
            s = gr.node("Add", [s, gr.name(mask)])
    if call.attrs["causal"]:
        sq = gr.node("Shape", [gr.name(q)], start=1, end=2)
        skv = gr.node("Shape", [gr.name(k)], start=1, end=2)
        ones = gr.node("ConstantOfShape", [gr.node("Concat", [sq, skv], axis=0)], value=_onnx().numpy_helper.from_array(_np_ones()))
        offset = gr.node("Reshape", [gr.node("Sub", [skv, sq]), gr.const([], "int64", (0,))])
        keep = gr.node("Cast", [gr.node("Trilu", [ones, offset], upper=0)], to=_elem("bool"))
        s = gr.node("Where", [keep, s, gr.const(-math.inf, "float32")])
        empty_rows = True
    p = gr.node("Softmax", [s], axis=-1)
    if empty_rows:
        p = gr.node("Where", [gr.node("IsNaN", [p]), gr.const(0.0, "float32"), p])
    o = gr.node("MatMul", [gr.node("Reshape", [p, fold]) if grouped else p, vt])
    if grouped:
        o = gr.node("Reshape", [o, unfold])
    gr.node("Transpose", [o], out, perm=[0, 2, 1, 3])


def _np_ones() -> Any:
    import numpy as np

    return np.ones((1,), np.float32)


CONVERTERS: dict[str, Converter] = {
    **{n: _unary for n in (*UNARY, "silu", "gelu", "gelu_tanh", "rsqrt", "square")},
    **{n: _binary for n in BINARY},
    "matmul": _matmul,
    "linear": _linear,
    "softmax": _softmax,
    "log_softmax": _softmax,
    "layer_norm": _norm,
    "rms_norm": _norm,
    "reshape": _reshape,
    "permute_dims": _permute,
    "attention": _attention,
}


def supported(call: Call) -> bool:
    """Whether ``call`` converts: a known op, float32 tensors (a bool attention mask too) of
    known shapes, and the op's own conditions."""
    if not isinstance(call.callee, OpRef) or call.callee.name not in CONVERTERS:
        return False
    name = call.callee.name
    tensors = [a for a in (*call.args, call) if isinstance(a.info, TensorInfo)]
    for t in tensors:
        info = t.info
        assert isinstance(info, TensorInfo)
        is_mask = name == "attention" and t is call.args[-1] and len(call.args) == 4
        if info.shape is None or info.dtype not in (("float32", "bool") if is_mask else ("float32",)):
            return False
    if name == "matmul":
        return call.attrs["out_dtype"] is None
    if name in ("layer_norm", "rms_norm"):
        return trailing_axis(call) is not None
    if name == "linear":
        return len(_shape(call.args[1])) == 2
    if name == "attention":
        q, k = _shape(call.args[0]), _shape(call.args[1])
        static_heads = q[2] == k[2] or (isinstance(q[2], int) and isinstance(k[2], int))
        return static_heads and (call.attrs["scale"] is not None or isinstance(q[3], int))
    return True


def export(inputs: tuple[Expr, ...], bindings: tuple[Any, ...], outputs: tuple[Var, ...], sym_vars: tuple[SymVar, ...], name: str = "region") -> tuple[bytes, bool]:
    """The serialized ONNX model of a region and whether it takes ``tw_dims``."""
    onnx = _onnx()
    helper = onnx.helper
    gr = OnnxGraph(sym_vars)
    graph_inputs = []
    for i, e in enumerate(inputs):
        if not isinstance(e, (Var, Constant)) or not isinstance(e.info, TensorInfo):
            raise UnsupportedError(f"region input {e!r} is not a tensor")
        gr.names[id(e)] = f"in{i}"
        graph_inputs.append(_value_info(f"in{i}", e.info))
    for b in bindings:
        gr.names[id(b.var)] = f"v.{b.var.name}"
    for b in bindings:
        call = b.value
        if not isinstance(call, Call) or not supported(call):
            raise UnsupportedError(f"%{b.var.name} = {call!r} has no ONNX conversion")
        CONVERTERS[_op(call)](gr, call, gr.names[id(b.var)])
    if gr.uses_dims:
        graph_inputs.append(helper.make_tensor_value_info(DIMS_INPUT, to_onnx("int64"), [len(sym_vars)]))
    graph_outputs = [_value_info(gr.names[id(v)], v.info) for v in outputs]
    graph = helper.make_graph(gr.nodes, name, graph_inputs, graph_outputs, initializer=gr.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tilework")
    model.ir_version = IR_VERSION
    return model.SerializeToString(), gr.uses_dims


def _value_info(name: str, info: StructInfo) -> Any:
    if not isinstance(info, TensorInfo) or info.shape is None:
        raise UnsupportedError(f"region value {name} is not a tensor of known shape ({info})")
    dims = [d if isinstance(d, int) else sym.to_str(d) for d in info.shape]
    return _onnx().helper.make_tensor_value_info(name, _elem(info.dtype), dims)


__all__ = ["CONVERTERS", "OPSET", "DIMS_INPUT", "OnnxGraph", "export", "supported", "trailing_axis"]
