"""Translate a ``torch.export.ExportedProgram`` into an IRModule.

The program's graph is walked once in order. Placeholders become the params of ``main``: user
tensor inputs first, then (with ``keep_params_as_inputs``) the parameters, buffers and lifted
constants, with ``attrs["num_inputs"]`` counting the user inputs; otherwise the weights become
``Constant``s. Every node that the outputs depend on is converted by the ATen converter
registered for its operator (``tilework.frontend.torch.registry``); a node whose value is a
``SymInt`` (``sym_size``, size arithmetic) needs no code: it *is* a dim, read from its
metadata. After each conversion the result is reconciled with torch's metadata: torch's dtype
wins (a cast), and where tilework could not prove torch's shape a ``match_cast`` asserts it.

A program whose graph still mutates tensors (torch.export's training dialect) is first made
functional: an in-place op that writes a tensor the graph made and nothing views becomes its
out-of-place op, read by the later readers (``functional``); any other write (to an input, a
buffer, a view) makes torch functionalize the program with ``run_decompositions({})``, which
re-traces it whole and keeps big ops such as ``linear``,
``layer_norm`` and ``scaled_dot_product_attention`` whole. Then the ops that have no converter
but a decomposition in torch's default table (``softplus``, ``mish``, ``lerp``, ``prelu``, ...)
are decomposed, those alone, into ops that may have one; what is left unconverted is refused,
naming the op.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from tilework import op
from tilework.errors import InferenceError, ShapeError, UnsupportedError
from tilework.frontend.torch import convert_create, convert_elementwise, convert_index, convert_nn, convert_reduce, convert_shape  # noqa: F401  (register converters)
from tilework.frontend.torch import convert_rnn, convert_vision  # noqa: F401  (register converters)
from tilework.frontend.torch.common import dtype_of_torch
from tilework.ir.dtype import to_torch
from tilework.frontend.torch.registry import lookup, op_names
from tilework.frontend.torch.symbolic import Bounds, SymbolTable
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Constant, Expr, GraphFunc, MatchCast, Tuple, Var, used_vars
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.ir.opdef import DimCheck
from tilework.ir.sym import Dim, SymVar
from tilework.transform.dead_code_elimination import has_effect
from tilework.transform.legalize import assert_dims_call

_WEIGHT_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")


@dataclass
class Translation:
    """A translated program: the module and what a caller needs to run it like the original.

    ``inputs`` lists the flat user inputs in ``in_spec`` order as ``(name, is_param, value)``:
    tensor inputs are params of ``main``, the others were specialized to ``value`` at export.
    ``weights`` are the trailing params of ``main`` (empty when the weights are constants).
    ``dims`` maps each sym var to where it first appears (``input_ids.1``)."""

    module: IRModule
    inputs: list[tuple[str, bool, Any]]
    weights: list[tuple[str, np.ndarray]]
    dims: dict[SymVar, str]
    in_spec: Any = None
    out_spec: Any = None
    num_outputs: int = 1


@dataclass
class Translator:
    """Translates ``ep`` (``run``). The weights are copies unless ``copy_weights`` is False and
    they are params (``keep_params_as_inputs``): then they are read-only NumPy views of the
    program's CPU tensors (their own memory: a later in-place change of the model shows through
    them), for a caller that makes the copies it keeps itself (``tilework.compile``). With
    ``prepared``, ``ep`` was made functional and decomposed already (``translate``)."""

    ep: Any
    keep_params_as_inputs: bool = True
    dim_names: Mapping[str, str] | None = None
    dim_bounds: Mapping[str, Bounds] | None = None
    func_name: str = "main"
    copy_weights: bool = True
    prepared: bool = False
    bb: BlockBuilder = field(default_factory=BlockBuilder)
    env: dict[Any, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.prepared:
            self.ep = decompose_unsupported(functional(self.ep))
        self.syms = SymbolTable(self.ep.range_constraints, self.dim_names, self.dim_bounds)
        self._permutes: dict[Expr, tuple[Expr, tuple[int, ...]]] = {}
        self._inputs: list[tuple[str, bool, Any]] = []
        self._weights: list[tuple[str, np.ndarray]] = []
        self._dims: dict[SymVar, str] = {}

    # -- the walk ----------------------------------------------------------------------------

    def run(self) -> Translation:
        graph = self.ep.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        specs = self.ep.graph_signature.input_specs
        if len(specs) != len(placeholders):
            raise UnsupportedError(f"the exported program has {len(placeholders)} placeholders but {len(specs)} input specs")
        user_params, weight_params = self._bind_placeholders(specs, placeholders)
        live = _live_nodes(graph)
        out_node = next(n for n in graph.nodes if n.op == "output")
        with self.bb.function(self.func_name, [*user_params, *weight_params], attrs={"num_inputs": len(user_params)}):
            with self.bb.dataflow():
                self._assert_input_sizes(specs, placeholders)
                for node in graph.nodes:
                    if node.op in ("get_attr", "call_module", "call_method"):
                        raise UnsupportedError(f"node %{node.name} ({node.op} {node.target}) is not supported")
                    if node.op == "call_function" and node in live:
                        self.env[node] = self._convert(node)
                outs = self._outputs(out_node)
                result = self.bb.emit_output(outs[0] if len(outs) == 1 else Tuple(tuple(outs)), name="output")
            self.bb.emit_func_output(result)
        mod = self.bb.get()
        mod = mod.with_func(self.func_name, _prune(mod.graph_func(self.func_name), mod))
        spec = getattr(self.ep, "call_spec", None)
        return Translation(mod, self._inputs, self._weights, self._dims, getattr(spec, "in_spec", None), getattr(spec, "out_spec", None), len(outs))

    def _bind_placeholders(self, specs: Sequence[Any], placeholders: Sequence[Any]) -> tuple[list[Var], list[Var]]:
        """Params for the user's tensor inputs and (kept as inputs) the weights; constants for
        the rest. Records the inputs, weights and where each dim first appears."""
        bare = _bare_symbols(specs, placeholders)
        user_params: list[Var] = []
        weight_params: list[Var] = []
        for spec, node in zip(specs, placeholders):
            kind = spec.kind.name
            val = node.meta.get("val")
            if kind in _WEIGHT_KINDS:
                data = self._weight(spec)
                if not self.keep_params_as_inputs:
                    self.env[node] = Constant.of(data, name=_ident(node.name))
                    continue
                var = Var(_ident(node.name), TensorInfo(tuple(data.shape), _np_dtype_name(data)))
                weight_params.append(var)
                self._weights.append((str(spec.target), data))
            elif kind == "TOKEN":
                effects = sorted({op_names(u.args[1])[0] for u in node.users if len(u.args) > 1})
                what = f"ATen op {effects[0]} is" if len(effects) == 1 else f"ATen ops {', '.join(effects)} are"
                raise UnsupportedError(f"{what} not supported by the torch frontend: side effects, ordered by an effect token (input {node.name} of kind TOKEN)")
            elif kind != "USER_INPUT":
                raise UnsupportedError(f"input {node.name} of kind {kind} is not supported")
            elif not _is_tensor(val):
                self.env[node] = self._value_of_scalar(val, node)
                self._inputs.append((node.name, False, self.env[node]))
                continue
            else:
                info = self._input_info(val, node, bare)
                var = Var(_ident(node.name), info)
                for axis, d in enumerate(info.shape or ()):
                    for v in sym_walk.free_vars(d):
                        self._dims.setdefault(v, f"{node.name}.{axis}")
                user_params.append(var)
                self._inputs.append((node.name, True, None))
            self.env[node] = var
        return user_params, weight_params

    def _outputs(self, out_node: Any) -> list[Expr]:
        specs = self.ep.graph_signature.output_specs
        values = list(out_node.args[0])
        outs: list[Expr] = []
        for spec, v in zip(specs, values):
            if spec.kind.name != "USER_OUTPUT":
                raise UnsupportedError(f"output {spec.arg.name} of kind {spec.kind.name} is not supported (the program mutates state)")
            val = self.env.get(v) if hasattr(v, "op") else v
            outs.append(self.tensor(val))
        if not outs:
            raise UnsupportedError("the exported program has no outputs")
        return outs

    def _convert(self, node: Any) -> Any:
        val = node.meta.get("val")
        if _is_symint(val):  # sym_size and size arithmetic: the value is a dim
            return self.syms.dim(val)
        if _is_folded(val):  # size arithmetic that torch folded
            return val
        if node.target is operator.getitem:
            seq, index = self._arg(node.args[0]), node.args[1]
            return seq[index]
        fn = lookup(node.target)
        name = op_names(node.target)[0]
        if fn is None:
            raise UnsupportedError(f"ATen op {name} (node %{node.name}) is not supported by the torch frontend")
        args = tuple(self._arg(a) for a in node.args)
        kwargs = {k: self._arg(v) for k, v in node.kwargs.items()}
        try:
            out = fn(self, node, *args, **kwargs)
            return self._reconcile(node, out)
        except (UnsupportedError, InferenceError, ShapeError) as e:
            if f"%{node.name}" in str(e):
                raise
            raise type(e)(f"{e} (in ATen op {name}, node %{node.name})") from e

    def _arg(self, a: Any) -> Any:
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        if hasattr(a, "op") and hasattr(a, "target"):  # an fx Node
            if a not in self.env:
                raise UnsupportedError(f"node %{a.name} is used before it is defined")
            return self.env[a]
        return a

    def _reconcile(self, node: Any, out: Any) -> Any:
        """``out`` with torch's dtype, and torch's shape asserted where tilework's differs."""
        val = node.meta.get("val")
        if isinstance(out, (list, tuple)) and isinstance(val, (list, tuple)):
            return tuple(self._reconcile_one(o, v, node) for o, v in zip(out, val))
        return self._reconcile_one(out, val, node)

    def _reconcile_one(self, out: Any, val: Any, node: Any) -> Any:
        if not _is_tensor(val) or not isinstance(out, Expr):
            return out
        want = self._tensor_info(val, node)
        have = out.info
        if not isinstance(have, TensorInfo):
            raise UnsupportedError(f"node %{node.name} produced {have}, torch has a tensor")
        if have.dtype != want.dtype:
            out = self.emit(op.astype(out, want.dtype or "float32"))
            have = out.info
        assert want.shape is not None
        if have.shape is not None and len(have.shape) != len(want.shape):
            raise UnsupportedError(f"node %{node.name}: tilework infers rank {len(have.shape)}, torch has shape {tuple(want.shape)}")
        if have.shape is not None and all(a is b or sym.prove_eq(a, b) for a, b in zip(have.shape, want.shape)):
            return out
        return self.bb.match_cast(out, want)

    # -- helpers for converters ------------------------------------------------------------------

    def emit(self, call: Expr) -> Var:
        """Bind ``call`` and return its var."""
        return self.bb.emit(call)

    def info(self, x: Expr) -> TensorInfo:
        info = x.info
        if not isinstance(info, TensorInfo):
            raise UnsupportedError(f"expected a tensor of known shape and dtype, got {info}")
        _known(info)
        return info

    def shape(self, x: Expr) -> tuple[Dim, ...]:
        return _known(self.info(x))[0]

    def dtype(self, x: Expr) -> str:
        return _known(self.info(x))[1]

    def out_info(self, node: Any, index: int | None = None) -> TensorInfo:
        """torch's shape and dtype of ``node``'s output (``index`` of a multi-output op)."""
        val = node.meta.get("val")
        if index is not None:
            val = val[index]
        if not _is_tensor(val):
            raise UnsupportedError(f"node %{node.name} does not produce a tensor")
        return self._tensor_info(val, node)

    def out_shape(self, node: Any, index: int | None = None) -> tuple[Dim, ...]:
        return _known(self.out_info(node, index))[0]

    def out_dtype(self, node: Any, index: int | None = None) -> str:
        return _known(self.out_info(node, index))[1]

    def used_outputs(self, node: Any) -> set[int]:
        """The indices of a multi-output node's results that other nodes read."""
        used: set[int] = set()
        for user in node.users:
            if user.target is operator.getitem:
                used.add(int(user.args[1]))
            else:
                used.update(range(8))
        return used

    def permute(self, x: Expr, perm: Sequence[int]) -> Expr:
        """``x`` with its dims permuted (output dim ``i`` is input dim ``perm[i]``). A permute
        of a permute made here becomes one permute of the original, or the original itself
        (the transposes torch puts around attention cancel tilework's layout change)."""
        perm = tuple(perm)
        src, inner = self._permutes.get(x, (x, tuple(range(len(perm)))))
        composed = tuple(inner[p] for p in perm)
        if composed == tuple(range(len(composed))):
            return src
        out = self.emit(op.permute_dims(src, composed))
        self._permutes[out] = (src, composed)
        return out

    def cast(self, x: Expr, dtype: str) -> Expr:
        return x if self.dtype(x) == dtype else self.emit(op.astype(x, dtype))

    def checked_index(self, indices: Expr, size: Dim, negative: bool = False) -> Expr:
        """``indices`` into a dim of ``size``, checked at run time where torch raises on one
        outside it (``[0, size)``, or ``[-size, size)`` when ``negative``; docs/semantics.md):
        the ops that read them would clamp it."""
        return self.emit(op.check_index(indices, size, negative))

    def require_at_least(self, d: Dim, lo: Dim, message: str) -> None:
        """``d >= lo``, where torch raises otherwise: a ``ShapeError`` now when it provably
        fails, else (unless it provably holds) an ``assert_dims`` binding that fails at run time
        with ``message``: the user's op and dim (``median: dim 1 (n) must not be empty``),
        before the ops it is lowered to, whose own checks of the same fact name themselves."""
        if sym.prove_ge(d, lo):
            return
        if isinstance(d, int) and isinstance(lo, int):
            raise ShapeError(f"{message}: {d} < {lo}")
        self.emit(assert_dims_call([DimCheck("ge", (d, lo), message)]))

    def tensor(self, v: Any, dtype: str | None = None) -> Expr:
        """``v`` as a tensor of ``dtype`` (None: its own): tensors are cast, Python numbers
        become 0-d constants, a symbolic size a 0-d int64 tensor holding its value."""
        if isinstance(v, Expr):
            return v if dtype is None else self.cast(v, dtype)
        if isinstance(v, sym.SymExpr):
            col = self.emit(op.arange(v, sym.add(v, 1), 1, dtype="int64"))
            scalar = self.emit(op.reshape(col, ()))
            return scalar if dtype is None else self.cast(scalar, dtype)
        if isinstance(v, (bool, int, float)):
            if dtype is None:
                dtype = "bool" if isinstance(v, bool) else "int64" if isinstance(v, int) else "float32"
            return self.constant(np.asarray(v), dtype)
        raise UnsupportedError(f"expected a tensor or a number, got {type(v).__name__} {v!r}")

    def constant(self, data: np.ndarray, dtype: str) -> Constant:
        from tilework.ir.dtype import np_dtype

        return Constant.of(np.asarray(data).astype(np_dtype(dtype)))

    def promote(self, *values: Any) -> str:
        """torch's type promotion of tensors and Python scalars."""
        import torch

        def rep(v: Any) -> Any:
            if isinstance(v, Expr):
                info = self.info(v)
                return torch.empty([1] * len(info.shape or ()), dtype=to_torch(info.dtype or "float32"), device="meta")
            if isinstance(v, sym.SymExpr):
                return 1
            return v

        reps = [rep(v) for v in values]
        dims = [r for r in reps if isinstance(r, torch.Tensor)]
        result = reps[0]
        for r in reps[1:]:
            dt = torch.result_type(result, r)
            ndim = max((t.dim() for t in dims), default=0)
            result = torch.empty([1] * ndim, dtype=dt, device="meta")
        if not isinstance(result, torch.Tensor):
            result = torch.empty([], dtype=torch.result_type(result, result), device="meta")
        return dtype_of_torch(result.dtype)

    def ones(self, shape: Sequence[Dim], dtype: str, value: float = 1.0) -> Expr:
        """A tensor of ``shape`` filled with ``value``: a constant when the shape is static."""
        static = [d for d in shape if isinstance(d, int)]
        if len(static) == len(shape):
            return self.constant(np.full(tuple(static), value), dtype)
        return self.emit(op.full(tuple(shape), value, dtype))

    # -- internals -----------------------------------------------------------------------------

    def _tensor_info(self, val: Any, node: Any) -> TensorInfo:
        dims = tuple(self.syms.dim(d) for d in val.shape)
        return TensorInfo(dims, dtype_of_torch(val.dtype))

    def _input_info(self, val: Any, node: Any, bare: set[str]) -> TensorInfo:
        """A user input's info; a size ``a * s + b`` whose symbol no input has bare gets a var
        of its own (see ``SymbolTable.solve_linear``)."""
        dims: list[Dim] = []
        for axis, d in enumerate(val.shape):
            expr = getattr(getattr(d, "node", None), "expr", None)
            symbols = {str(s) for s in getattr(expr, "free_symbols", ())}
            if expr is not None and not expr.is_Symbol and len(symbols) == 1 and not symbols & bare:
                solved = self.syms.solve_linear(expr, f"{_ident(node.name)}_{axis}")
                if solved is not None:
                    dims.append(solved)
                    continue
            dims.append(self.syms.dim(d))
        return TensorInfo(tuple(dims), dtype_of_torch(val.dtype))

    def _assert_input_sizes(self, specs: Sequence[Any], placeholders: Sequence[Any]) -> None:
        """Inputs whose sizes got vars of their own are cast to torch's sizes once."""
        for spec, node in zip(specs, placeholders):
            var = self.env.get(node)
            if spec.kind.name != "USER_INPUT" or not isinstance(var, Var):
                continue
            want = self._tensor_info(node.meta["val"], node)
            if var.info != want:
                self.env[node] = self.bb.match_cast(var, want)

    def _value_of_scalar(self, val: Any, node: Any) -> Any:
        if val is None or isinstance(val, (bool, int, float, str)):
            return val
        if _is_symint(val):
            raise UnsupportedError(f"input {node.name} is a symbolic int; pass sizes as tensors' shapes instead")
        raise UnsupportedError(f"input {node.name} of type {type(val).__name__} is not supported")

    def _weight(self, spec: Any) -> np.ndarray:
        from tilework.runtime.tensor import from_torch

        target = spec.target
        for table in (self.ep.state_dict, self.ep.constants):
            if target in table:
                t = table[target]
                if not _is_tensor(t):
                    raise UnsupportedError(f"weight {target} is a {type(t).__name__}, not a tensor")
                dtype_of_torch(t.dtype)
                data = from_torch(t)
                if self.copy_weights or not self.keep_params_as_inputs:
                    return np.array(data, copy=True)
                view = data.view()  # borrowed: read-only, so that nothing of tilework's writes into the model
                view.flags.writeable = False
                return view
        raise UnsupportedError(f"weight {target} is missing from the exported program's state")


def functional(ep: Any) -> Any:
    """``ep`` with a graph free of in-place ops (see the module docstring). Where every in-place
    op writes a tensor that the graph made itself and that nothing views (T5's ``add_`` on an
    intermediate, ``x.clone().index_put_(...)``), each becomes its out-of-place op and later
    reads of the tensor read that op's result (``_rebind_inplace``): that is what
    functionalization does there, without re-tracing the whole program. Otherwise (a write to an
    input, a buffer or a view) ``run_decompositions({})`` makes it functional."""
    sig = ep.graph_signature
    if getattr(sig, "buffers_to_mutate", {}) or getattr(sig, "user_inputs_to_mutate", {}):
        return ep.run_decompositions({})
    if not any(_is_inplace(n) for n in ep.graph.nodes):
        return ep
    rebound = _rebind_inplace(ep)
    return rebound if rebound is not None else ep.run_decompositions({})


def _is_inplace(node: Any) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def _aliased_args(node: Any) -> list[Any]:
    """The fx nodes among ``node``'s args that its results may share storage with: those its
    schema annotates (``Tensor(a) self`` of a view, ``Tensor(a!) self`` of an in-place op,
    ``Tensor(a -> *) self`` of ``split``); [] for an op whose results are new tensors."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    out: list[Any] = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None:
            continue
        v = node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
        out.extend(x for x in (v if isinstance(v, (list, tuple)) else [v]) if hasattr(x, "op"))
    return out


def _out_of_place(target: Any) -> Any:
    """The out-of-place twin of the in-place ATen op ``target`` (``aten.add_.Tensor`` ->
    ``aten.add.Tensor``): same arguments, ``self`` the only one written, one new tensor out;
    None where there is none."""
    import torch

    schema = target._schema
    args = schema.arguments
    if not args or args[0].alias_info is None or not args[0].alias_info.is_write or any(a.alias_info is not None for a in args[1:]):
        return None
    if len(schema.returns) != 1 or schema.returns[0].alias_info is None or schema.returns[0].alias_info.after_set != args[0].alias_info.after_set:
        return None
    base, overload = schema.name.split("::")[-1], schema.overload_name or "default"
    if not base.endswith("_") or base.startswith("_"):
        return None
    packet = getattr(torch.ops.aten, base[:-1], None)
    twin = getattr(packet, overload, None) if packet is not None else None
    ts = getattr(twin, "_schema", None)
    if ts is None or ts.is_mutable or len(ts.returns) != 1 or ts.returns[0].alias_info is not None:
        return None
    same = len(ts.arguments) == len(args) and all((a.name, str(a.type), a.kwarg_only) == (b.name, str(b.type), b.kwarg_only) for a, b in zip(ts.arguments, args))
    return twin if same else None


def _rebind_inplace(ep: Any) -> Any:
    """A copy of ``ep`` whose in-place ops are out-of-place ops whose results the later readers
    of the written tensor read (``x.add_(y)`` -> ``x2 = add(x, y)``, reads of ``x`` or of the
    ``add_``'s result after it read ``x2``); the user's ``ep`` is left as it is. None unless
    every in-place op has an out-of-place twin and writes a tensor that an op of the graph
    made as a new one (not an input, buffer, view or op result that aliases another), whose
    only aliases are the in-place ops' results, and whose readers are all ATen ops or the
    output: then no write can be seen through another name, and rebinding is exact."""
    import torch
    from torch.export import ExportedProgram
    from torch.export.graph_signature import TensorArgument

    nodes = list(ep.graph.nodes)
    base: dict[Any, Any] = {}  # node -> the node whose storage it shares (itself when new)
    twins: dict[Any, Any] = {}
    viewed: set[Any] = set()
    for n in nodes:
        base[n] = n
        if n.op != "call_function":
            continue
        aliased = _aliased_args(n)
        if _is_inplace(n):
            twin = _out_of_place(n.target)
            if twin is None or not aliased:
                return None
            twins[n] = twin
            base[n] = base[aliased[0]]
        elif aliased:
            base[n] = base[aliased[0]]
            viewed.update(base[a] for a in aliased)
    written = {base[n] for n in twins}
    for b in written:
        if b.op != "call_function" or b in viewed or _aliased_args(b) or (b.target is operator.getitem and _aliased_args(b.args[0])):
            return None
        if b.target is not operator.getitem and getattr(b.target, "_schema", None) is None:
            return None
    for n in nodes:
        if base[n] in written and any(u.op != "output" and getattr(u.target, "_schema", None) is None for u in n.users):
            return None

    graph = torch.fx.Graph()
    copies: dict[Any, Any] = {}
    out_args = graph.graph_copy(ep.graph, copies)
    old_out = next(n for n in reversed(nodes) if n.op == "output")
    out_node = graph.output(out_args)
    out_node.meta = dict(old_out.meta)
    copies[old_out] = out_node
    old_of = {c: o for o, c in copies.items()}
    latest: dict[Any, Any] = {}  # written base -> the copy's node holding its value now

    def read(a: Any) -> Any:
        return latest.get(base[old_of[a]], a)

    for n in nodes:
        if n.op not in ("call_function", "output"):
            continue
        c = copies[n]
        c.args = torch.fx.map_arg(c.args, read)
        c.kwargs = torch.fx.map_arg(c.kwargs, read)
        if n in twins:
            c.target = twins[n]
            latest[base[n]] = c
    gm = torch.fx.GraphModule(ep.graph_module, graph)
    outs = list(out_node.args[0])
    specs = [replace(s, arg=TensorArgument(name=v.name)) if isinstance(s.arg, TensorArgument) and hasattr(v, "name") else s for s, v in zip(ep.graph_signature.output_specs, outs)]
    sig = replace(ep.graph_signature, output_specs=specs)
    return ExportedProgram(root=gm, graph=gm.graph, graph_signature=sig, state_dict=ep.state_dict, range_constraints=ep.range_constraints,
                           module_call_graph=ep.module_call_graph, example_inputs=ep.example_inputs, constants=ep.constants, verifiers=list(ep.verifiers))


def _is_folded(val: Any) -> bool:
    return isinstance(val, (bool, int, float))


def _converted(node: Any) -> bool:
    """Whether ``Translator._convert`` gives ``node`` to a converter: an ATen op whose value is
    not a dim or a folded number (``sym_size`` and size arithmetic need none)."""
    val = node.meta.get("val")
    return node.op == "call_function" and hasattr(node.target, "_schema") and not _is_symint(val) and not _is_folded(val)


def decompose_unsupported(ep: Any, rounds: int = 4) -> Any:
    """``ep`` with each op that has no converter replaced by torch's default decomposition of
    it, where torch has one (repeated: a decomposition may use another such op)."""
    from torch.export import default_decompositions

    table = None  # built only when needed (~80 ms)
    for _ in range(rounds):
        missing = {n.target for n in ep.graph.nodes if _converted(n) and lookup(n.target) is None}
        if not missing:
            break
        table = table if table is not None else default_decompositions()
        todo = {t: table[t] for t in missing if t in table}
        if not todo:
            break
        decomposed = ep.run_decompositions(todo)
        if _effects(decomposed) and not _effects(ep):
            raise _effect_error(ep, decomposed, todo)
        ep = decomposed
    return ep


def _effects(ep: Any) -> list[Any]:
    """The ``with_effects`` nodes of ``ep``: ops with side effects, ordered by an effect token
    (an input of kind TOKEN) that tilework does not thread."""
    return [n for n in ep.graph.nodes if n.op == "call_function" and getattr(n.target, "__name__", "") == "with_effects"]


def _effect_error(ep: Any, decomposed: Any, todo: Mapping[Any, Any]) -> UnsupportedError:
    """The ops of ``ep`` whose decomposition brought side effects (``linalg_inv``'s checks its
    result with ``_linalg_check_errors``), named with the effectful ops."""
    candidates = {n.name: n for n in ep.graph.nodes if n.op == "call_function" and n.target in todo}
    culprits: dict[str, set[str]] = {}
    for n in _effects(decomposed):
        effect = op_names(n.args[1])[0] if len(n.args) > 1 else str(n.args)
        sources = [candidates[src.name] for src in n.meta.get("from_node") or () if getattr(src, "name", None) in candidates]
        for src in sources or candidates.values():
            culprits.setdefault(f"ATen op {op_names(src.target)[0]} (node %{src.name})", set()).add(effect)
    return UnsupportedError("; ".join(f"{op} is not supported by the torch frontend: its decomposition has side effects ({', '.join(sorted(effects))}, ordered by an effect token)" for op, effects in culprits.items()))


def _known(info: TensorInfo) -> tuple[tuple[Dim, ...], str]:
    """The shape and dtype of a tensor info that has both."""
    if info.shape is None or info.dtype is None:
        raise UnsupportedError(f"expected a tensor of known shape and dtype, got {info}")
    return info.shape, info.dtype


def _prune(func: GraphFunc, mod: IRModule) -> GraphFunc:
    """``func`` without the bindings nothing uses (values a converter made and a later one
    bypassed, such as a transpose folded into attention's layout). Every binding the
    translator makes is pure but its checks; match_casts and checks are kept."""
    used: set[Var] = set(used_vars(func.body.body))
    blocks = []
    for block in reversed(func.body.blocks):
        kept = []
        for b in reversed(block.bindings):
            if isinstance(b, MatchCast) or b.var in used or has_effect(b.value, mod):
                kept.append(b)
                used.update(used_vars(b.value))
        blocks.append(replace(block, bindings=tuple(reversed(kept))))
    body = replace(func.body, blocks=tuple(b for b in reversed(blocks) if b.bindings))
    return replace(func, body=body)


def _bare_symbols(specs: Sequence[Any], placeholders: Sequence[Any]) -> set[str]:
    """The symbols that are a whole size of some user input."""
    out: set[str] = set()
    for spec, node in zip(specs, placeholders):
        val = node.meta.get("val")
        if spec.kind.name != "USER_INPUT" or not _is_tensor(val):
            continue
        for d in val.shape:
            expr = getattr(getattr(d, "node", None), "expr", None)
            if expr is not None and getattr(expr, "is_Symbol", False):
                out.add(str(expr))
    return out


def _dim_places(ep: Any) -> dict[str, str]:
    """``INPUT.AXIS`` -> torch symbol for each user-input dim that is a bare symbol."""
    places: dict[str, str] = {}
    nodes = [n for n in ep.graph.nodes if n.op == "placeholder"]
    for spec, node in zip(ep.graph_signature.input_specs, nodes):
        val = node.meta.get("val")
        if spec.kind.name != "USER_INPUT" or not _is_tensor(val):
            continue
        for axis, d in enumerate(val.shape):
            expr = getattr(getattr(d, "node", None), "expr", None)
            if expr is not None and getattr(expr, "is_Symbol", False):
                places[f"{node.name}.{axis}"] = str(expr)
    return places


def resolve_dim_refs(ep: Any, names: Mapping[str, str], bounds: Mapping[str, Bounds]) -> tuple[dict[str, str], dict[str, Bounds]]:
    """``names`` and ``bounds`` re-keyed by torch symbol; a key may be a symbol (``s53``),
    ``INPUT.AXIS`` (``input_ids.1``) or, for ``bounds``, a name given in ``names``."""
    symbols = {str(s) for s in ep.range_constraints}
    places = _dim_places(ep)

    def resolve(ref: str, extra: Mapping[str, str]) -> str:
        if ref in symbols:
            return ref
        if ref in places:
            return places[ref]
        if ref in extra:
            return extra[ref]
        known = ", ".join(f"{p} ({s})" for p, s in sorted(places.items())) or "none"
        raise UnsupportedError(f"no dynamic dim {ref!r} in the exported program; its dynamic input dims: {known}")

    by_symbol: dict[str, str] = {}
    for ref, name in names.items():
        if not name.isidentifier():
            raise UnsupportedError(f"dim name {name!r} is not an identifier")
        by_symbol[resolve(ref, {})] = name
    if len(set(by_symbol.values())) != len(by_symbol):
        raise UnsupportedError(f"two dynamic dims share a name: {by_symbol}")
    at = {s: p for p, s in reversed(list(places.items()))}  # a symbol's first INPUT.AXIS
    for symbol, name in by_symbol.items():
        if name != symbol and name in symbols and name not in by_symbol:  # the other keeps its torch name
            other = f"{name} ({at[name]})" if name in at else name
            raise UnsupportedError(f"two dynamic dims share a name: {name!r} given to {at.get(symbol, symbol)} ({symbol}) is the name of the dynamic dim {other}; choose another name, or rename that dim too")
    named = {v: k for k, v in by_symbol.items()}
    return by_symbol, {resolve(ref, named): b for ref, b in bounds.items()}


def _live_nodes(graph: Any) -> set[Any]:
    """The nodes the outputs depend on."""
    out = next(n for n in graph.nodes if n.op == "output")
    live: set[Any] = set()
    stack = [out]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(n.all_input_nodes)
    return live


def _is_tensor(v: Any) -> bool:
    return type(v).__name__ in ("FakeTensor", "Tensor", "Parameter") or (hasattr(v, "shape") and hasattr(v, "dtype") and hasattr(v, "device"))


def _is_symint(v: Any) -> bool:
    return type(v).__name__ == "SymInt"


def _np_dtype_name(a: np.ndarray) -> str:
    from tilework.ir.dtype import dtype_name

    return dtype_name(a.dtype)


def _ident(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else f"v_{out}"


__all__ = ["Translator", "Translation", "functional", "resolve_dim_refs"]
