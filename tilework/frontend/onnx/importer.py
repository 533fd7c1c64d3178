"""The ONNX importer: a ``ModelProto`` becomes an ``IRModule`` with one graph function, main.

Graph inputs become parameters. A ``dim_param`` name becomes one ``SymVar`` shared by every
input and output that names it; an unnamed dynamic dim gets a fresh var of its own, named
``INPUT_dimAXIS``. ``dim_bounds`` sets a dim's range by its ``dim_param``, its generated name or
``INPUT.AXIS`` (as for a torch program). Initializers become ``Constant``s, or trailing
parameters (attribute ``num_inputs``) with ``keep_params_as_inputs`` — except small integer
ones, which are shape operands (axes, target shapes) and stay constants so that shapes stay
symbolic.

Nodes are converted in graph order by the converters in ``registry``; each produces
``Value``s that track constants and symbolic shape contents (see ``values``), so shape
arithmetic folds into dims and only tensor computations become bindings. The body is one
dataflow block unless the graph has control flow (``If``).

A sequence graph input is a tuple parameter of a length fixed at conversion time
(``sequence_lengths``); an optional graph input is its element, or no parameter at all when it is
given as absent (``absent_optionals``). A sequence graph output is a tuple of its tensors.
"""

from __future__ import annotations

import keyword
import os
import re
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np
import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, TypeProto, ValueInfoProto, numpy_helper

from tilework.errors import FileFormatError, InferenceError, ShapeError, SymbolicError, TileworkError, UnsupportedError
from tilework.frontend.onnx import converters
from tilework.frontend.onnx.context import NodeCtx
from tilework.frontend.onnx.registry import has_domain, known_opsets
from tilework.frontend.onnx.values import MAX_ELEMS, AnyValue, OptValue, SeqValue, Value, dtype_name, elem_type_name, kind_of
from tilework.ir.builder import BlockBuilder
from tilework.ir.dtype import INT_DTYPES
from tilework.ir.graph import Constant, Expr, ShapeExpr, Tuple, TupleGetItem, Var
from tilework.ir.info import ShapeInfo, StructInfo, TensorInfo, TupleInfo
from tilework.ir.module import IRModule
from tilework.ir.sym import Dim, SymVar
from tilework.op import manipulate
from tilework.op.shape import shape_to_tensor, tensor_to_shape

DimBounds = Mapping[str, "tuple[int | None, int | None] | int"]
DEFAULT_DIM_LO = 1


class UnknownDimError(TileworkError):
    """``dim_bounds`` names dims the model's inputs do not have. ``unknown`` are those keys,
    ``known`` the inputs' dynamic dims as text; ``for_option`` says it for the option that gave
    the bounds (``--dim`` on the command line)."""

    def __init__(self, unknown: Sequence[str], known: str, option: str = "dim_bounds") -> None:
        self.unknown, self.known = list(unknown), known
        super().__init__(f"{option} names dims the model does not have: {', '.join(self.unknown)} (its dynamic input dims: {known})")

    def for_option(self, option: str) -> "UnknownDimError":
        return UnknownDimError(self.unknown, self.known, option)


def _narrowed(old: "tuple[int | None, int | None]", b: "tuple[int | None, int | None] | int") -> "tuple[int | None, int | None]":
    """Two bounds of one dim together (``dim_bounds`` may name it twice: by name and INPUT.AXIS)."""
    lo, hi = (None, b) if isinstance(b, int) else b
    return (old[0] if lo is None else lo if old[0] is None else max(lo, old[0]), old[1] if hi is None else hi if old[1] is None else min(hi, old[1]))


def sanitize(name: str, fallback: str = "v") -> str:
    """A Python identifier made from an ONNX name."""
    s = re.sub(r"\W", "_", name).strip("_") or fallback
    if s[0].isdigit():
        s = f"{fallback}_{s}"
    if keyword.iskeyword(s):
        s += "_"
    return s


def domain_opsets(model: ModelProto) -> dict[str, int]:
    """The opset the model imports of each domain (the default domain under "")."""
    return {("" if imp.domain == "ai.onnx" else imp.domain): int(imp.version) for imp in model.opset_import}


def check_opsets(model: ModelProto, what: str = "the ONNX model") -> None:
    """Refuse (``UnsupportedError`` naming ``what``, the domain and both opsets) a model that
    imports an opset outside those the installed ``onnx`` defines, of the default domain or
    of another that tilework converts ops of: past them, an op's meaning is unknown (its
    schema may have changed since), and the newest schema ``onnx`` would answer with could
    convert it wrongly. The ops of any other domain are refused one by one, whatever its opset."""
    for imp in model.opset_import:
        domain = "ai.onnx" if imp.domain in ("", "ai.onnx") else imp.domain
        if domain != "ai.onnx" and not has_domain(domain):
            continue
        known = known_opsets(domain)
        if known is None or known[0] <= imp.version <= known[1]:
            continue
        span = f"opset {known[0]}" if known[0] == known[1] else f"opsets {known[0]} to {known[1]}"
        hint = f": export the model at opset {known[1]} or lower, or install a newer onnx" if imp.version > known[1] else ""
        raise UnsupportedError(
            f"{what} imports opset {imp.version} of domain {domain}, which the installed onnx {onnx.__version__} does not define "
            f"(it knows {span} of that domain){hint}"
        )


def default_opset(model: ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise UnsupportedError("the model imports no opset of the default ONNX domain")


def has_control_flow(graph: GraphProto) -> bool:
    return any(n.op_type in ("If", "Loop", "Scan") for n in graph.node)


def small_int(arr: np.ndarray) -> bool:
    """A shape operand rather than a weight: a small integer tensor of rank <= 1."""
    return arr.ndim <= 1 and arr.size <= MAX_ELEMS and (str(arr.dtype) in INT_DTYPES or arr.dtype == np.bool_)


class _Scope:
    """ONNX names visible while converting a graph (a subgraph sees its parents' names)."""

    def __init__(self, parent: "_Scope | None" = None) -> None:
        self.parent = parent
        self.values: dict[str, AnyValue] = {}

    def get(self, name: str) -> AnyValue | None:
        scope: _Scope | None = self
        while scope is not None:
            v = scope.values.get(name)
            if v is not None:
                return v
            scope = scope.parent
        return None


def _target(key: str, params: Collection[str], axes: Mapping[str, Any]) -> tuple[str, ...]:
    """What a ``dim_bounds`` key names: ``("param", P)``, a ``dim_param`` (by its name or by
    ``INPUT.AXIS``); ``("axis", INPUT, AXIS)``, an unnamed dim of a tensor input; else
    ``("name", KEY)``, maybe the generated name of an unnamed dim (``x_dim0``)."""
    if key in params:
        return ("param", key)
    head, _, tail = key.rpartition(".")
    dims = axes.get(head)
    if dims is None or not tail.isdigit() or int(tail) >= len(dims):
        return ("name", key)
    d = dims[int(tail)]
    if d.HasField("dim_param") and d.dim_param:
        return ("param", d.dim_param)
    if d.HasField("dim_value") and d.dim_value >= 0:
        raise UnsupportedError(f"{key} is a static dim of input {head} (size {d.dim_value}); only a dynamic dim takes bounds")
    return ("axis", head, tail)


class Importer:
    """Converts one model; use ``from_onnx``."""

    def __init__(
        self,
        model: ModelProto,
        dim_bounds: DimBounds | None = None,
        keep_params_as_inputs: bool = False,
        sequence_lengths: Mapping[str, int] | None = None,
        absent_optionals: Collection[str] = (),
    ) -> None:
        self.model = model
        self.sequence_lengths = dict(sequence_lengths or {})
        self.absent_optionals = set(absent_optionals)
        self._inputs: list[tuple[str, Expr, Callable[[Expr], AnyValue]]] = []  # sequence inputs, unpacked in the body
        self.opset = default_opset(model)
        self.opsets = domain_opsets(model)
        self.dim_bounds = dict(dim_bounds or {})
        self._bounds: dict[tuple[str, ...], tuple[int | None, int | None]] = {}  # a _target -> its bounds
        self._targets: dict[str, tuple[str, ...]] = {}  # a dim_bounds key -> ("param", P), ("axis", INPUT, AXIS) or ("name", N)
        self._bounded: set[tuple[str, ...]] = set()  # the targets made, with their bounds
        self._input_dims: dict[str, str] = {}  # a dynamic input dim's name -> its first INPUT.AXIS
        self.keep_params = keep_params_as_inputs
        self.bb = BlockBuilder()
        self.syms: dict[str, SymVar] = {}
        self.used_names: set[str] = set()
        self.scope = _Scope()
        self.depth = 0  # > 0 inside an If branch: nothing emitted there may be cached outside
        self.dataflow = False

    # -- sym vars -------------------------------------------------------------------------

    def _unique(self, base: str) -> str:
        name, i = base, 1
        while name in self.used_names:
            name = f"{base}_{i}"
            i += 1
        self.used_names.add(name)
        return name

    def fresh_var(self, hint: str, lo: int = 0) -> SymVar:
        return SymVar(self._unique(sanitize(hint, "d")), lo)

    def _named_dim(self, param: str) -> SymVar:
        v = self.syms.get(param)
        if v is None:
            lo: int | None = DEFAULT_DIM_LO
            hi: int | None = None
            if ("param", param) in self._bounds:
                lo, hi = self._bounds[("param", param)]
                self._bounded.add(("param", param))
            v = SymVar(self._unique(sanitize(param, "d")), DEFAULT_DIM_LO if lo is None else lo, hi)
            self.syms[param] = v
        return v

    def value_info(self, vi: ValueInfoProto, what: str) -> TensorInfo:
        if not vi.type.HasField("tensor_type"):
            kind = vi.type.WhichOneof("value")
            raise UnsupportedError(f"{what} {vi.name!r}: {kind} values are not supported (only tensors)")
        return self._tensor_info(vi.type, vi.name, what)

    def _tensor_info(self, t: TypeProto, name: str, what: str) -> TensorInfo:
        tt = t.tensor_type
        dtype = dtype_name(tt.elem_type)
        if dtype is None:
            raise UnsupportedError(f"{what} {name!r}: element type {elem_type_name(tt.elem_type)} is not supported")
        if not tt.HasField("shape"):
            raise UnsupportedError(f"{what} {name!r}: its rank is not given; tilework needs the rank of every input")
        dims: list[Dim] = []
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(self._named_dim(d.dim_param))
                self._input_dims.setdefault(d.dim_param, f"{name}.{i}" if what == "graph input" else what)
            else:
                dims.append(self._unnamed_dim(name, i, what))
        return TensorInfo(tuple(dims), dtype)

    def _unnamed_dim(self, name: str, axis: int, what: str) -> SymVar:
        """A fresh var for an input's unnamed dim, with the bounds ``dim_bounds`` gives it by
        ``INPUT.AXIS`` or by the name it gets."""
        var_name = self._unique(sanitize(f"{name}_dim{axis}", "d"))
        lo, hi = self._bounds.get(("axis", name, str(axis)), (None, None))
        lo, hi = _narrowed((lo, hi), self._bounds.get(("name", var_name), (None, None)))
        self._bounded.update((("axis", name, str(axis)), ("name", var_name)))
        self._input_dims[var_name] = f"{name}.{axis}" if what == "graph input" else what
        return SymVar(var_name, DEFAULT_DIM_LO if lo is None else lo, hi)

    def _resolve_bounds(self, inputs: Sequence[ValueInfoProto]) -> None:
        """Sort ``dim_bounds`` by what its keys name (see ``_target``), two keys of one dim
        narrowing it together."""
        params: set[str] = set()
        axes: dict[str, Any] = {}
        for vi in inputs:
            t = vi.type.optional_type.elem_type if vi.type.WhichOneof("value") == "optional_type" else vi.type
            if t.WhichOneof("value") == "sequence_type":
                t = t.sequence_type.elem_type
            elif t.WhichOneof("value") == "tensor_type":
                axes[vi.name] = t.tensor_type.shape.dim
            params.update(d.dim_param for d in t.tensor_type.shape.dim if d.HasField("dim_param") and d.dim_param)
        for key, b in self.dim_bounds.items():
            target = self._targets[key] = _target(key, params, axes)
            self._bounds[target] = _narrowed(self._bounds.get(target, (None, None)), b)

    def input_info(self, vi: ValueInfoProto) -> tuple[StructInfo | None, Callable[[Expr], AnyValue]]:
        """A graph input's parameter type (None: no parameter, an absent optional) and how its
        value is made from the parameter (inside the function: a sequence's items are emitted)."""
        if vi.type.WhichOneof("value") != "optional_type":
            return self._seq_or_tensor_info(vi.type, vi.name)
        if vi.name in self.absent_optionals:
            return None, lambda _: OptValue(None)
        info, make = self._seq_or_tensor_info(vi.type.optional_type.elem_type, vi.name)

        def make_opt(e: Expr) -> AnyValue:
            elem = make(e)
            assert not isinstance(elem, OptValue)
            return OptValue(elem)

        return info, make_opt

    def _seq_or_tensor_info(self, t: TypeProto, name: str) -> tuple[StructInfo, Callable[[Expr], AnyValue]]:
        kind = t.WhichOneof("value")
        if kind == "tensor_type":
            return self._tensor_info(t, name, "graph input"), Value.of_expr
        elem = t.sequence_type.elem_type
        if kind != "sequence_type" or elem.WhichOneof("value") != "tensor_type":
            inner = f" of {elem.WhichOneof('value')} values" if kind == "sequence_type" else ""
            raise UnsupportedError(f"graph input {name!r}: {kind} values{inner} are not supported (only tensors, sequences of tensors and optionals of those)")
        n = self.sequence_lengths.get(name)
        if n is None:
            raise UnsupportedError(f"graph input {name!r} is a sequence, whose length tilework fixes at conversion time: give it with sequence_lengths={{{name!r}: n}}")
        dtype = dtype_name(elem.tensor_type.elem_type)
        infos = tuple(self._tensor_info(elem, f"{name}_{i}", f"element {i} of graph input") for i in range(n))

        def make(e: Expr) -> AnyValue:
            return SeqValue(tuple(Value.of_expr(self.emit(TupleGetItem(e, i))) for i in range(n)), dtype)

        return TupleInfo(infos), make

    # -- arrays ---------------------------------------------------------------------------

    def tensor_array(self, t: TensorProto, ctx: NodeCtx | None = None) -> np.ndarray:
        if dtype_name(t.data_type) is None:
            msg = f"tensor {t.name!r} has element type {elem_type_name(t.data_type)}, which is not supported"
            raise ctx.unsupported(msg) if ctx is not None else UnsupportedError(msg)
        try:
            return np.asarray(numpy_helper.to_array(t))
        except (ValueError, TypeError) as e:  # data that does not fit its dims and type
            msg = f"tensor {t.name!r} (dims {list(t.dims)}) cannot be read: {e}"
            raise ctx.unsupported(msg) if ctx is not None else UnsupportedError(msg) from None

    # -- values ---------------------------------------------------------------------------

    def lookup_any(self, name: str, ctx: NodeCtx | None = None) -> AnyValue:
        v = self.scope.get(name)
        if v is None:
            msg = f"value {name!r} is used before it is defined"
            raise ctx.unsupported(msg) if ctx is not None else UnsupportedError(msg)
        return v

    def lookup(self, name: str, ctx: NodeCtx | None = None) -> Value:
        """The tensor ``name``; an error when it is a sequence or an optional."""
        v = self.lookup_any(name, ctx)
        if not isinstance(v, Value):
            msg = f"value {name!r} is {kind_of(v)} where a tensor is expected"
            raise ctx.unsupported(msg) if ctx is not None else UnsupportedError(msg)
        return v

    def emit(self, expr: Expr) -> Var:
        return self.bb.emit(expr)

    def materialize(self, v: Value) -> Expr:
        """``v`` as a graph expression: its own, a Constant, or a tensor built from its elems."""
        if v.expr is not None:
            return v.expr
        if v.const is not None:
            v.expr = Constant.of(v.const)
            return v.expr
        if v.elems is None or v.info.dtype is None:
            raise UnsupportedError("internal: a value with neither an expression nor known contents")
        dims = tuple(v.elems)
        e: Expr = self.emit(shape_to_tensor(ShapeExpr(dims), v.info.dtype))
        if v.info.ndim == 0:
            e = self.emit(manipulate.reshape(e, ()))
        if self.depth == 0:
            v.expr = e
        return e

    def carry(self, v: AnyValue) -> Expr:
        """``v`` as one graph expression: a tensor, a tuple of a sequence's tensors, an optional's
        element (an empty tuple when it has none); ``unpack`` reads it back."""
        if isinstance(v, Value):
            return self.materialize(v)
        if isinstance(v, SeqValue):
            return self.emit(Tuple(tuple(self.materialize(item) for item in v.items)))
        return Tuple(()) if v.elem is None else self.carry(v.elem)

    def unpack(self, e: Expr, like: AnyValue, hint: str) -> AnyValue:
        """The value ``carry`` made ``e`` from, given one of the same layout (``layout_of``)."""
        if isinstance(like, Value):
            return Value.of_expr(self.refine(e, hint))
        if isinstance(like, SeqValue):
            items = tuple(Value.of_expr(self.refine(self.emit(TupleGetItem(e, i)), hint)) for i in range(len(like.items)))
            return SeqValue(items, like.dtype)
        inner = None if like.elem is None else self.unpack(e, like.elem, hint)
        assert not isinstance(inner, OptValue)  # an optional holds a tensor or a sequence
        return OptValue(inner)

    def lift_dims(self, v: Value, what: str, ctx: NodeCtx) -> tuple[Dim, ...]:
        """The values of a small integer tensor known only at run time, as fresh sym vars."""
        info = v.info
        if info.dtype not in INT_DTYPES:
            raise ctx.unsupported(f"{what} must be an integer tensor, got {info.dtype}")
        if info.shape is None or len(info.shape) > 1 or (info.shape and not isinstance(info.shape[0], int)):
            raise ctx.unsupported(f"{what} must be a 0-d or 1-D tensor of static length to be used as dims, got shape {info.shape}")
        n = info.shape[0] if info.shape else 1
        assert isinstance(n, int)
        s = self.emit(tensor_to_shape(self.materialize(v)))
        hint = sanitize(f"{ctx.op_type.lower()}_{what.split()[0]}", "d")
        dims = tuple(self.fresh_var(f"{hint}{i}") for i in range(n))
        self.bb.match_cast(s, ShapeInfo(dims))
        if self.depth == 0:
            v.elems = dims
        return dims

    def refine(self, expr: Expr, hint: str) -> Expr:
        info = expr.info
        if not isinstance(info, TensorInfo) or info.ndim < 0 or info.shape is not None:
            return expr
        dims = tuple(self.fresh_var(f"{hint}{i}") for i in range(info.ndim))
        return self.bb.match_cast(expr, TensorInfo(dims, info.dtype))

    # -- conversion -----------------------------------------------------------------------

    def convert_node(self, node: NodeProto) -> None:
        if not isinstance(node.op_type, str) or not isinstance(node.domain, str):  # not UTF-8 in the file
            raise UnsupportedError(f"a node ({node.name!r}) has an op type or domain that is not text: {node.op_type!r}, {node.domain!r}")
        opset = self.opset if node.domain in ("", "ai.onnx") else self.opsets.get(node.domain, 0)
        conv, version = converters.lookup(node.op_type, opset, node.name, node.domain)
        ctx = NodeCtx(self, node, version, opset)
        try:
            result = conv.fn(ctx)
        except (InferenceError, ShapeError, SymbolicError) as e:
            raise type(e)(f"{ctx.where()}: {e}") from e
        except TileworkError:
            raise
        except (IndexError, KeyError, ValueError, TypeError, ArithmeticError, AttributeError) as e:
            # the model is untrusted data: an operand a converter does not expect (an index out of
            # range, a negative size, a malformed attribute) names the node rather than crashing
            raise ctx.unsupported(f"cannot convert it: {type(e).__name__}: {e}") from e
        outs: Sequence[Any] = result if isinstance(result, (list, tuple)) else [result]
        for i, name in enumerate(node.output):
            if not name:
                continue
            if i >= len(outs) or outs[i] is None:
                raise ctx.unsupported(f"output {i} ({name!r}) is not produced by the converter")
            out = outs[i]
            self.scope.values[name] = out if isinstance(out, (Value, SeqValue, OptValue)) else Value.of_expr(out)

    def convert_nodes(self, graph: GraphProto) -> None:
        for t in graph.initializer:
            self.scope.values[t.name] = Value.of_const(self.tensor_array(t))
        for node in graph.node:
            self.convert_node(node)

    def convert_subgraph(self, graph: GraphProto, inputs: Sequence[AnyValue] = (), ctx: NodeCtx | None = None) -> list[Value]:
        """Convert a subgraph (an If branch, a Loop body) in a nested scope, its inputs bound to
        ``inputs``; its outputs as Values, which must be tensors. ``ctx``: the node it belongs
        to, for errors."""
        outs = self.convert_subgraph_any(graph, inputs, ctx)
        for o, v in zip(graph.output, outs):
            if not isinstance(v, Value):
                msg = f"subgraph {graph.name!r}: output {o.name!r} is {kind_of(v)} where a tensor is expected"
                raise ctx.unsupported(msg) if ctx is not None else UnsupportedError(msg)
        return [v for v in outs if isinstance(v, Value)]

    def convert_subgraph_any(self, graph: GraphProto, inputs: Sequence[AnyValue] = (), ctx: NodeCtx | None = None) -> list[AnyValue]:
        """``convert_subgraph`` whose outputs may be sequences and optionals too."""
        if len(graph.input) != len(inputs):
            msg = f"subgraph {graph.name!r} takes {len(graph.input)} input(s), the node gives {len(inputs)}"
            raise ctx.unsupported(msg) if ctx is not None else UnsupportedError(msg)
        self.scope = _Scope(self.scope)
        self.depth += 1
        try:
            for vi, v in zip(graph.input, inputs):
                if vi.type.HasField("optional_type") and not isinstance(v, OptValue):
                    v = OptValue(v)  # a Loop's carried sequence entering a body input typed optional
                self.scope.values[vi.name] = v
            self.convert_nodes(graph)
            return [self.lookup_any(o.name, ctx) for o in graph.output]
        finally:
            assert self.scope.parent is not None
            self.scope = self.scope.parent
            self.depth -= 1

    def run(self) -> IRModule:
        graph = self.model.graph
        inits = {t.name: t for t in graph.initializer}
        params: list[Var] = []
        self._resolve_bounds([vi for vi in graph.input if vi.name not in inits])
        for vi in graph.input:
            if vi.name in inits:
                continue  # an initializer listed as an input (older IR versions): a constant
            info, make = self.input_info(vi)
            if info is None:
                self.scope.values[vi.name] = make(Tuple(()))
                continue
            var = Var(self._unique(sanitize(vi.name, "input")), info)
            params.append(var)
            if isinstance(info, TensorInfo):
                self.scope.values[vi.name] = make(var)
            else:  # made in the body: a sequence's items are bindings
                self._inputs.append((vi.name, var, make))
        unknown = sorted(k for k, t in self._targets.items() if t not in self._bounded)
        if unknown:
            known = ", ".join(f"{n} ({at})" for n, at in self._input_dims.items()) or "none"
            raise UnknownDimError(unknown, known)
        self._bounds = {}  # the input dims are made: no dim made later takes bounds
        num_inputs = len(params)
        for name, t in inits.items():
            arr = self.tensor_array(t)
            if self.keep_params and not small_int(arr):
                var = Var(self._unique(sanitize(name, "param")), TensorInfo(tuple(int(d) for d in arr.shape), str(arr.dtype)))
                params.append(var)
                self.scope.values[name] = Value.of_expr(var)
            else:
                self.scope.values[name] = Value.of_const(arr)
        attrs = {"num_inputs": num_inputs} if self.keep_params else {}
        self.dataflow = not has_control_flow(graph)
        with self.bb.function("main", params, attrs):
            if self.dataflow:
                with self.bb.dataflow():
                    outputs = self._body(graph)
                    outputs = [self.bb.emit_output(o) for o in outputs]
            else:
                outputs = self._body(graph)
            self.bb.emit_func_output(outputs[0] if len(outputs) == 1 else outputs)
        return self.bb.get()

    def _body(self, graph: GraphProto) -> list[Expr]:
        for name, var, make in self._inputs:
            self.scope.values[name] = make(var)
        for node in graph.node:
            self.convert_node(node)
        if not graph.output:
            raise UnsupportedError("the graph has no outputs")
        for vi in graph.output:
            kind = vi.type.WhichOneof("value")
            if kind not in (None, "tensor_type", "sequence_type", "optional_type"):
                raise UnsupportedError(f"graph output {vi.name!r}: {kind} values are not supported (only tensors, sequences and optionals)")
        outputs = [self.lookup_any(vi.name) for vi in graph.output]
        for vi, v in zip(graph.output, outputs):
            if isinstance(v, OptValue) and v.elem is None:
                raise UnsupportedError(f"graph output {vi.name!r} is an empty optional: tilework returns tensors and sequences, not absent values")
        return [self.carry(v) for v in outputs]


def load_model(model_or_path: ModelProto | str | os.PathLike[str] | bytes) -> ModelProto:
    """A ``ModelProto`` as is, serialized bytes, or the model at a path (external data too).
    A file that is not an ONNX model (empty, truncated, another kind) is a FileFormatError
    naming it; a model of an opset the installed onnx does not define, an UnsupportedError
    (``check_opsets``)."""
    if isinstance(model_or_path, ModelProto):
        check_opsets(model_or_path)
        return model_or_path
    from google.protobuf.message import DecodeError

    what = "the model bytes" if isinstance(model_or_path, bytes) else os.fspath(model_or_path)
    try:
        if isinstance(model_or_path, bytes):
            model = onnx.load_from_string(model_or_path)
        elif os.path.isfile(what) and os.path.getsize(what) == 0:
            raise FileFormatError(f"{what} is empty: not an ONNX model")
        else:
            model = onnx.load(what)
    except OSError as e:
        raise FileFormatError(f"cannot read {e.filename or what}: {e.strerror or e}") from None
    except DecodeError:
        raise FileFormatError(f"{what} is not an ONNX model: it does not decode as one (truncated, or another kind of file?)") from None
    except (ValueError, TypeError, RuntimeError, onnx.checker.ValidationError) as e:  # onnx's external-data and protobuf checks
        raise FileFormatError(_missing_external_data(what) or f"{what}: cannot load the ONNX model ({type(e).__name__}: {e})") from None
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise FileFormatError(f"{what} is not an ONNX model: it has no IR version or no graph (truncated, or another kind of file?)")
    check_opsets(model, what)
    return model


def _missing_external_data(path: str) -> str | None:
    """Which external-data file of the model at ``path`` is missing, as an error message (None
    when each is there, or the model does not read without them either)."""
    try:
        from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data  # (every tensor, subgraphs' too)

        model = onnx.load(path, load_external_data=False)
    except Exception:
        return None
    base = os.path.dirname(path)
    for tensor in _get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        location = ExternalDataInfo(tensor).location
        if not os.path.isfile(os.path.join(base, location)):
            return f"{path}: external data file {location} for tensor {tensor.name} is missing (looked for {os.path.join(base, location)})"
    return None


def from_onnx(
    model_or_path: ModelProto | str | os.PathLike[str],
    dim_bounds: DimBounds | None = None,
    keep_params_as_inputs: bool = False,
    sequence_lengths: Mapping[str, int] | None = None,
    absent_optionals: Collection[str] = (),
) -> IRModule:
    """The IRModule of an ONNX model (a ``ModelProto`` or a path to a ``.onnx`` file).

    ``dim_bounds`` maps dims to ``(lo, hi)`` (either may be None) or to an upper bound:
    ``{"seq": (1, 512)}``. A key is a ``dim_param``, ``INPUT.AXIS`` (``"x.0"``) or the name an
    unnamed dim gets (``"x_dim0"``); two keys of one dim narrow it together. Dynamic input dims
    default to ``>= 1``; a key that names no dynamic input dim raises ``UnknownDimError``. With
    ``keep_params_as_inputs``, weights are trailing parameters of ``main`` (in initializer
    order; ``param_arrays`` gives their values) and ``num_inputs`` counts the real inputs.

    ``sequence_lengths`` fixes the length of each sequence graph input (also one inside an
    optional), which becomes a tuple parameter; ``absent_optionals`` names the optional graph
    inputs that are empty (no parameter); the other optionals are given their element.
    """
    model = load_model(model_or_path)
    try:
        return Importer(model, dim_bounds, keep_params_as_inputs, sequence_lengths, absent_optionals).run()
    except TileworkError:
        raise
    except (IndexError, KeyError, ValueError, TypeError, ArithmeticError, AttributeError) as e:
        # the model is untrusted data; a node's problems are named by convert_node, this is the
        # rest (a graph input or output that is not what its type says, a name that is not text)
        raise UnsupportedError(f"the ONNX model cannot be imported: {type(e).__name__}: {e}") from e


def param_arrays(model_or_path: ModelProto | str | os.PathLike[str]) -> list[np.ndarray]:
    """The values of the trailing parameters ``from_onnx(..., keep_params_as_inputs=True)``
    adds, in order."""
    model = load_model(model_or_path)
    out = []
    for t in model.graph.initializer:
        arr = np.asarray(numpy_helper.to_array(t))
        if not small_int(arr):
            out.append(arr)
    return out


__all__ = ["Importer", "UnknownDimError", "from_onnx", "param_arrays", "load_model", "sanitize", "check_opsets", "default_opset", "domain_opsets"]
