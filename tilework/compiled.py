"""``tilework.compile``: from a model to a callable compiled once for every shape.

    cm = tilework.compile(model, example_args=(ids,), dynamic_shapes=({1: Dim("seq", max=512)},))
    out = cm(ids)                  # called like the model: torch in -> torch out, NumPy -> NumPy
    cm.save("m.tw"); cm = CompiledModel.load("m.tw")
    print(cm.explain())

**Frontends** are a registry: ``compile`` asks each registered frontend, in order, whether it
accepts the model, and the first that does imports it. Built in: ``irmodule`` (an IRModule,
compiled as it is), ``torch.export`` (an ExportedProgram) and ``torch`` (a ``torch.nn.Module``,
exported with ``torch.export.export(model, args, kwargs, dynamic_shapes=...)``; the names of
its ``Dim``s name the sym vars), and ``tilework.nn`` (a ``tilework.nn.Module``; ``example_args``
is the spec of its ``forward``, ``tilework.nn.export``). Adding a frontend (ONNX) is one call::

    register_frontend("onnx", accepts=lambda m: ..., load=import_onnx)

``accepts(model)`` must not import the framework (test the type's module name or a file
suffix); ``load(model, options)`` returns an ``Imported``: the module whose ``main`` takes the
user inputs and then the weights (``attrs["num_inputs"]`` counts the inputs), the weights, and
the ``Signature`` that maps a call's arguments to those inputs and the outputs back.

**Weights** are trailing params of ``main`` by default and the CompiledModel passes them itself
(``weights="constants"`` instead bakes them into the module as constants). **The saved file**
is an executable archive (``tilework.load`` reads it as a plain ``Executable``) with three more
entries: ``compiled.json`` (the signature and the compile report), ``weights.bin`` (the weights
section, when the weights are params) and ``module.tw.txt`` (the optimized module in the text
format, unless weight constants make it large). ``CompiledModel.load`` restores a callable.
"""

from __future__ import annotations

import json
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tilework.errors import TileworkError, UnsupportedError
from tilework.ir.graph import GraphFunc
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar

FORMAT = 1
_WEIGHT_CONSTANT_LIMIT = 1 << 20  # bytes of constants above which the module text is not saved


@dataclass
class Signature:
    """How a call's arguments become ``main``'s inputs and its outputs the call's result.

    ``inputs``: the flat inputs in order, each ``{"name", "tensor": bool, "value"}`` (a
    non-tensor input was specialized at import to ``value``). ``in_spec``/``out_spec``: torch
    pytree specs (serialized) of ``(args, kwargs)`` and of the result, or None for plain
    positional inputs and a single result or a tuple."""

    inputs: list[dict[str, Any]]
    in_spec: str | None = None
    out_spec: str | None = None
    _specs: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
        """The tensor inputs of ``main`` for a call ``(*args, **kwargs)``."""
        flat = self._flatten(args, kwargs)
        out = []
        for spec, value in zip(self.inputs, flat):
            if spec["tensor"]:
                out.append(value)
            elif value != spec["value"]:
                raise TileworkError(f"input {spec['name']} was fixed to {spec['value']!r} when the model was compiled, got {value!r}")
        return out

    def _flatten(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
        names = [i["name"] for i in self.inputs]
        if self.in_spec is None:
            if len(args) > len(names):
                raise TileworkError(f"the model takes {len(names)} input(s) ({', '.join(names)}), got {len(args)}")
            given = dict(zip(names, args))
            for k, v in kwargs.items():
                if k not in names or k in given:
                    raise TileworkError(f"unexpected or repeated input {k!r}; inputs: {', '.join(names)}")
                given[k] = v
            missing = [n for n in names if n not in given]
            if missing:
                raise TileworkError(f"missing input(s) {', '.join(missing)}")
            return [given[n] for n in names]
        from torch.utils import _pytree as pytree

        spec = self._spec("in")
        arg_spec, kw_spec = spec.children()
        kw_names = list(kw_spec.context or [])
        args = list(args)
        extra = args[arg_spec.num_children :]
        args = args[: arg_spec.num_children]
        merged = dict(kwargs)
        if all(c.is_leaf() for c in arg_spec.children()):  # keywords for positional inputs
            while len(args) < arg_spec.num_children and names[len(args)] in merged:
                args.append(merged.pop(names[len(args)]))
        for name, v in zip([n for n in kw_names if n not in kwargs], extra):
            merged[name] = v  # positional arguments for keyword inputs, in order
        ordered = {k: merged[k] for k in kw_names if k in merged}
        leaves, got = pytree.tree_flatten((tuple(args), ordered))
        if got != spec or len(extra) > len(kw_names) or set(merged) - set(kw_names):
            raise TileworkError(f"the inputs do not have the structure the model was compiled for:\n  expected {spec}\n  got      {pytree.tree_flatten((tuple(args), merged))[1]}")
        return list(leaves)

    def unflatten(self, result: Any) -> Any:
        """``main``'s result as the original model's output structure."""
        if self.out_spec is None:
            return result
        from torch.utils import _pytree as pytree

        leaves = list(result) if isinstance(result, tuple) else [result]
        return pytree.tree_unflatten(leaves, self._spec("out"))

    def _spec(self, which: str) -> Any:
        if which not in self._specs:
            text = self.in_spec if which == "in" else self.out_spec
            self._specs[which] = _load_treespec(text or "")
        return self._specs[which]

    def to_json(self) -> dict[str, Any]:
        return {"inputs": [{**i, "value": i.get("value")} for i in self.inputs], "in_spec": self.in_spec, "out_spec": self.out_spec}


@dataclass
class Imported:
    """What a frontend gives ``compile``: see the module docstring."""

    module: IRModule
    weights: list[np.ndarray]
    signature: Signature
    source: str
    dims: dict[SymVar, str] = field(default_factory=dict)  # sym var -> where it first appears


@dataclass
class CompileOptions:
    """Everything ``compile`` passes to a frontend."""

    example_args: Any = None
    dynamic_shapes: Any = None
    dim_names: Mapping[str, str] | None = None
    dim_bounds: Mapping[str, tuple[int | None, int | None]] | None = None
    weights: str = "inputs"


Accepts = Callable[[Any], bool]
Loader = Callable[[Any, CompileOptions], Imported]
_FRONTENDS: list[tuple[str, Accepts, Loader]] = []


def register_frontend(name: str, accepts: Accepts, load: Loader, first: bool = False) -> None:
    """Make ``compile`` import the models ``accepts`` says yes to with ``load`` (replacing a
    frontend of the same name). ``first`` asks before the others."""
    _FRONTENDS[:] = [f for f in _FRONTENDS if f[0] != name]
    entry = (name, accepts, load)
    _FRONTENDS.insert(0, entry) if first else _FRONTENDS.append(entry)


def frontends() -> list[str]:
    return [name for name, _, _ in _FRONTENDS]


def compile(
    model: Any,
    example_args: Any = None,
    dynamic_shapes: Any = None,
    backends: Any = None,
    placement: Any = None,
    *,
    dim_names: Mapping[str, str] | None = None,
    dim_bounds: Mapping[str, tuple[int | None, int | None]] | None = None,
    weights: str = "inputs",
    passes: Sequence[Any] | None = None,
    opt_level: int = 1,
) -> "CompiledModel":
    """Compile ``model`` (a ``torch.nn.Module``, an ``ExportedProgram``, an ``IRModule``, or
    what another registered frontend accepts) once for every shape of its dynamic dims.

    ``example_args``: a tuple of positional inputs, a dict of keyword inputs, or a
    ``(args, kwargs)`` pair (torch modules only). ``dynamic_shapes`` as for
    ``torch.export.export``. ``dim_names``/``dim_bounds`` rename and narrow dynamic dims (keys:
    ``INPUT.AXIS``, a torch symbol or a dim's name; bounds ``(lo, hi)``). ``weights``:
    ``"inputs"`` (trailing params, passed by the CompiledModel) or ``"constants"``. ``passes``
    replaces ``default_graph_passes()`` and leaves out ``default_kernel_passes()`` (``[]``:
    lowering only). ``backends``: names in priority order (``["blas",
    "torch", "codegen"]`` or ``"blas,torch,codegen"``; see ``tilework.backend``): each op runs on
    the first backend that can run it, the rest on tilework's kernels. ``placement`` (the
    automatic search) must be None for now. ``opt_level=0`` compiles without graph passes, views,
    fusion or memory planning (for comparisons)."""
    if placement is not None:
        raise UnsupportedError(f"placement={placement!r}: the automatic placement search is not available yet; choose a fixed assignment with backends=[...] (pass placement=None)")
    if weights not in ("inputs", "constants"):
        raise UnsupportedError(f"weights must be 'inputs' or 'constants', got {weights!r}")
    _register_builtins()
    options = CompileOptions(example_args, dynamic_shapes, dim_names, dim_bounds, weights)
    t0 = time.perf_counter()
    imported = _import(model, options)
    t1 = time.perf_counter()
    from tilework.driver import build, default_graph_passes, default_kernel_passes, lowering_passes
    from tilework.transform.pipeline import Pipeline

    optimize = opt_level >= 1
    graph_passes = list((default_graph_passes() if optimize else []) if passes is None else passes)
    kernel_passes = default_kernel_passes() if passes is None and optimize else []
    optimized = Pipeline(graph_passes)(imported.module) if graph_passes else imported.module
    t2 = time.perf_counter()
    exe = build(optimized, passes=[], post_legalize_passes=kernel_passes, backends=backends, opt_level=opt_level)
    t3 = time.perf_counter()
    lowering = [p.name for p in lowering_passes()]
    lowering[1:1] = [p.name for p in kernel_passes]  # right after legalize
    report = {
        "source": imported.source,
        "passes": {"graph": [p.name for p in graph_passes], "lowering": lowering},
        "seconds": {"import": round(t1 - t0, 3), "optimize": round(t2 - t1, 3), "build": round(t3 - t2, 3), "total": round(t3 - t0, 3)},
        "build": {k: v for k, v in exe.meta.items() if k != "target"},
        "dims": {v.name: [v.lo, v.hi, where] for v, where in imported.dims.items()},
        "graph": _graph_summary(optimized),
        "weights": {"count": len(imported.weights), "bytes": int(sum(w.nbytes for w in imported.weights)), "as": weights},
    }
    return CompiledModel(optimized, exe, imported.weights, imported.signature, report)


class CompiledModel:
    """A compiled model: call it like the original. See the module docstring."""

    def __init__(self, module: IRModule | None, executable: Any, weights: list[np.ndarray], signature: Signature, report: dict[str, Any]) -> None:
        from tilework.runtime.vm import VM

        self.module = module
        self.executable = executable
        self.weights = weights
        self.signature = signature
        self.report = report
        self._main = VM(executable)["main"]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs = self.signature.bind(args, kwargs)
        return self.signature.unflatten(self._main(*inputs, *self.weights))

    # -- persistence ------------------------------------------------------------------------

    def save(self, path: str) -> None:
        """One file; see the module docstring for its entries."""
        self.executable.save(path)
        meta = {"format": FORMAT, "signature": self.signature.to_json(), "report": self.report}
        with zipfile.ZipFile(path, "a", zipfile.ZIP_STORED) as zf:
            zf.writestr("compiled.json", json.dumps(meta, indent=1, default=str))
            if self.weights:
                zf.writestr("weights.bin", _dump_arrays(self.weights))
            if self.module is not None and _constant_bytes(self.module) <= _WEIGHT_CONSTANT_LIMIT:
                zf.writestr("module.tw.txt", str(self.module))

    @staticmethod
    def load(path: str) -> "CompiledModel":
        """A CompiledModel saved with ``save``; nothing is recompiled."""
        from tilework.runtime.executable import Executable

        exe = Executable.load(path)
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            if "compiled.json" not in names:
                raise TileworkError(f"{path!r} is a plain executable, not a compiled model; load it with tilework.load")
            meta = json.loads(zf.read("compiled.json"))
            if meta.get("format") != FORMAT:
                raise TileworkError(f"{path!r} has compiled-model format {meta.get('format')}, this tilework reads {FORMAT}")
            weights = _load_arrays(zf.read("weights.bin")) if "weights.bin" in names else []
            text = zf.read("module.tw.txt").decode() if "module.tw.txt" in names else None
        module = None
        if text is not None:
            from tilework.text import parse

            module = parse(text)
        sig = meta["signature"]
        return CompiledModel(module, exe, weights, Signature(sig["inputs"], sig["in_spec"], sig["out_spec"]), meta["report"])

    # -- the account ------------------------------------------------------------------------

    def explain(self) -> str:
        """What was compiled and how: inputs with their symbolic dims and bounds, outputs,
        weights, the ops of the graph, kernels, passes and times."""
        r = self.report
        lines = ["tilework compiled model", f"  source: {r['source']}"]
        fn = self.module.get("main") if self.module is not None else None
        fn = fn if isinstance(fn, GraphFunc) else None
        lines.append("  inputs:")
        params = list(getattr(fn, "params", ()))
        idx = 0
        for spec in self.signature.inputs:
            if not spec["tensor"]:
                lines.append(f"    {spec['name']:<20} fixed to {spec['value']!r} at compile time")
                continue
            lines.append(f"    {spec['name']:<20} {_info_text(params[idx].info) if idx < len(params) else 'tensor'}")
            idx += 1
        dims = r.get("dims", {})
        if dims:
            lines.append("  dynamic dims:")
            for name, (lo, hi, where) in dims.items():
                rng = f"{lo} <= {name}" + (f" <= {hi}" if hi is not None else "  (no upper bound)")
                lines.append(f"    {name:<12} {rng:<28} first seen at {where}")
        else:
            lines.append("  dynamic dims: none (every shape is static)")
        if fn is not None:
            lines.append(f"  outputs: {_info_text(fn.ret_info)}")
        w = r["weights"]
        where = "trailing params of main, passed by the compiled model" if w["as"] == "inputs" else "constants inside the executable"
        lines.append(f"  weights: {w['count']} tensor(s), {w['bytes'] / 1e6:.1f} MB, as {where}")
        g = r["graph"]
        ops = ", ".join(f"{name} x{n}" for name, n in g["ops"])
        lines.append(f"  graph: {g['bindings']} bindings, {g['op_calls']} op calls ({len(g['ops'])} distinct ops): {ops}")
        stats = self.executable.stats()
        lines.append(f"  executable: {stats['kernels']} kernel(s), {stats['instructions']} VM instructions, {stats['constants']} constant(s)")
        chosen = r.get("build", {}).get("backends")
        lines.append(f"  backends: {', '.join(chosen)} (by priority; the rest on tilework's C kernels)" if chosen else "  backends: tilework C kernels for every op")
        graph_passes = ", ".join(r["passes"]["graph"]) or "none"
        lines.append(f"  passes: graph: {graph_passes}; lowering: {', '.join(r['passes']['lowering'])}")
        s, b = r["seconds"], r.get("build", {})
        parts = [f"import {s['import']:.2f} s", f"graph passes {s['optimize']:.2f} s", f"build {s['build']:.2f} s"]
        if "passes_s" in b and "codegen_s" in b:
            parts[-1] += f" = lowering {float(b['passes_s']):.2f} s + C kernels {float(b['codegen_s']):.2f} s"
        if b.get("kernel_cache_hit") is not None:
            parts.append("kernels from the cache" if b["kernel_cache_hit"] else "kernels compiled now")
        lines.append(f"  compile time: {s['total']:.2f} s ({', '.join(parts)})")
        return "\n".join(lines)

    def __repr__(self) -> str:
        names = ", ".join(i["name"] for i in self.signature.inputs)
        return f"CompiledModel({names}) from {self.report['source']}"


# -- built-in frontends --------------------------------------------------------------------------


def _register_builtins() -> None:
    if any(name == "irmodule" for name in frontends()):
        return
    register_frontend("irmodule", lambda m: isinstance(m, IRModule), _import_irmodule)
    register_frontend("torch.export", lambda m: type(m).__name__ == "ExportedProgram" and type(m).__module__.startswith("torch"), _import_exported_program)
    register_frontend("torch", _is_torch_module, _import_torch_module)
    register_frontend("tilework.nn", _is_nn_module, _import_nn_module)
    from tilework.frontend.onnx.compile import register as _register_onnx

    _register_onnx()


def _import(model: Any, options: CompileOptions) -> Imported:
    for _, accepts, load in _FRONTENDS:
        if accepts(model):
            return load(model, options)
    raise UnsupportedError(f"tilework.compile cannot compile a {type(model).__module__}.{type(model).__name__}; it accepts: {', '.join(frontends())}")


def _is_torch_module(m: Any) -> bool:
    return any(c.__module__.startswith("torch.nn") and c.__name__ == "Module" for c in type(m).__mro__)


def _is_nn_module(m: Any) -> bool:
    return any(c.__module__ == "tilework.nn.core" and c.__name__ == "Module" for c in type(m).__mro__)


def _import_nn_module(model: Any, options: CompileOptions) -> Imported:
    from tilework.nn.export import import_for_compile

    return import_for_compile(model, options)


def _import_irmodule(mod: IRModule, options: CompileOptions) -> Imported:
    main = mod.get("main")
    if not isinstance(main, GraphFunc):
        raise UnsupportedError("an IRModule to compile needs a graph function main")
    n = int(main.attrs.get("num_inputs", len(main.params)))
    if n != len(main.params):
        raise UnsupportedError(f"main has {len(main.params) - n} weight param(s); compile an IRModule whose main takes only inputs, or run it with tilework.build")
    inputs = [{"name": p.name, "tensor": True, "value": None} for p in main.params]
    return Imported(mod, [], Signature(inputs), "IRModule")


def _import_exported_program(ep: Any, options: CompileOptions) -> Imported:
    from tilework.frontend.torch import translate

    tr = translate(ep, options.weights == "inputs", dim_names=options.dim_names, dim_bounds=options.dim_bounds)
    return _imported_from_translation(tr, f"torch.export ExportedProgram ({sum(1 for n in ep.graph.nodes if n.op == 'call_function')} ATen calls)")


def _import_torch_module(model: Any, options: CompileOptions) -> Imported:
    import torch

    if options.example_args is None:
        raise UnsupportedError("compiling a torch.nn.Module needs example_args (example inputs for torch.export)")
    args, kwargs = _split_example(options.example_args)
    ep = torch.export.export(model, tuple(args), dict(kwargs), dynamic_shapes=options.dynamic_shapes, strict=False)
    names = dict(_dim_names_from_spec(ep, model, args, kwargs, options.dynamic_shapes))
    names.update(options.dim_names or {})
    from tilework.frontend.torch import translate

    tr = translate(ep, options.weights == "inputs", dim_names=names, dim_bounds=options.dim_bounds)
    calls = sum(1 for n in ep.graph.nodes if n.op == "call_function")
    return _imported_from_translation(tr, f"torch.nn.Module {type(model).__name__} via torch.export ({calls} ATen calls)")


def _imported_from_translation(tr: Any, source: str) -> Imported:
    from torch.utils import _pytree as pytree

    inputs = [{"name": name, "tensor": is_param, "value": value} for name, is_param, value in tr.inputs]
    in_spec = pytree.treespec_dumps(tr.in_spec) if tr.in_spec is not None else None
    out_spec = pytree.treespec_dumps(tr.out_spec) if tr.out_spec is not None else None
    return Imported(tr.module, [w for _, w in tr.weights], Signature(inputs, in_spec, out_spec), source, dict(tr.dims))


def _split_example(example: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(example, dict):
        return (), dict(example)
    if isinstance(example, tuple) and len(example) == 2 and isinstance(example[1], dict) and isinstance(example[0], (tuple, list)):
        return tuple(example[0]), dict(example[1])
    if isinstance(example, (tuple, list)):
        return tuple(example), {}
    return (example,), {}


def _dim_names_from_spec(ep: Any, model: Any, args: Sequence[Any], kwargs: Mapping[str, Any], dynamic_shapes: Any) -> dict[str, str]:
    """``INPUT.AXIS -> name`` for the named ``torch.export.Dim``s in ``dynamic_shapes``."""
    if dynamic_shapes is None:
        return {}
    import inspect

    from torch.utils import _pytree as pytree

    if isinstance(dynamic_shapes, dict):
        bound = inspect.signature(model.forward).bind_partial(*args, **kwargs).arguments
        pairs = [(bound[k], v) for k, v in dynamic_shapes.items() if k in bound]
    else:
        pairs = list(zip(list(args) + list(kwargs.values()), dynamic_shapes))
    by_tensor: dict[int, dict[int, str]] = {}

    def walk(value: Any, spec: Any) -> None:
        if spec is None:
            return
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            axes = spec.items() if isinstance(spec, dict) else enumerate(spec)
            by_tensor[id(value)] = {a: d.__name__ for a, d in axes if _is_named_dim(d)}
        elif isinstance(value, (list, tuple)) and isinstance(spec, (list, tuple)):
            for v, s in zip(value, spec):
                walk(v, s)
        elif isinstance(value, dict) and isinstance(spec, dict):
            for k, v in value.items():
                walk(v, spec.get(k))

    for value, spec in pairs:
        walk(value, spec)
    flat = pytree.tree_leaves((tuple(args), dict(kwargs)))
    users = [n.name for n, s in zip([n for n in ep.graph.nodes if n.op == "placeholder"], ep.graph_signature.input_specs) if s.kind.name == "USER_INPUT"]
    names: dict[str, str] = {}
    for placeholder, value in zip(users, flat):
        for axis, name in by_tensor.get(id(value), {}).items():
            names[f"{placeholder}.{axis}"] = name
    return names


def _is_named_dim(d: Any) -> bool:
    name = getattr(d, "__name__", None)
    return isinstance(name, str) and name.isidentifier() and name not in ("AUTO", "DYNAMIC", "STATIC") and hasattr(d, "min")


# -- helpers ---------------------------------------------------------------------------------------


def _load_treespec(text: str) -> Any:
    """A serialized pytree spec; the modules of its node types are imported first so that their
    registrations (e.g. transformers' ModelOutput classes) exist."""
    import importlib

    from torch.utils import _pytree as pytree

    def types(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [node["type"]] if isinstance(node.get("type"), str) else []
            for child in node.get("children_spec", []):
                found += types(child)
            return found
        return []

    data = json.loads(text)
    for name in types(data[1] if isinstance(data, list) and len(data) == 2 else data):
        module = name.rpartition(".")[0]
        if module and module != "builtins":
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise TileworkError(f"the model's input/output structure uses {name}, which cannot be imported here: {e}") from None
    return pytree.treespec_loads(text)


def _info_text(info: Any) -> str:
    from tilework.text.printer import print_info

    return print_info(info)


def _graph_summary(mod: IRModule) -> dict[str, Any]:
    from collections import Counter

    from tilework.ir.graph import Binding, Call, OpRef, bindings_of

    ops: Counter[str] = Counter()
    bindings = 0
    for _, func in mod.graph_funcs():
        for b in bindings_of(func):
            bindings += 1
            if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef):
                ops[b.value.callee.name] += 1
    return {"bindings": bindings, "op_calls": sum(ops.values()), "ops": ops.most_common()}


def _constant_bytes(mod: IRModule) -> int:
    from tilework.ir.graph import Call, Constant, Tuple, bindings_of

    total = 0

    def visit(e: Any) -> None:
        nonlocal total
        if isinstance(e, Constant):
            total += int(e.data.nbytes)
        elif isinstance(e, Call):
            for a in e.args:
                visit(a)
        elif isinstance(e, Tuple):
            for f in e.fields:
                visit(f)

    for _, func in mod.graph_funcs():
        for b in bindings_of(func):
            visit(b.value)
    return total


def _dump_arrays(arrays: Sequence[np.ndarray]) -> bytes:
    """A small header (JSON: dtype, shape, offset per array) and the raw bytes, 64-aligned."""
    from tilework.ir.dtype import dtype_name

    entries, blobs, offset = [], [], 0
    for a in arrays:
        raw = np.ascontiguousarray(a).tobytes()
        pad = (-offset) % 64
        blobs.append(b"\0" * pad)
        offset += pad
        entries.append({"dtype": dtype_name(a.dtype), "shape": list(a.shape), "offset": offset, "nbytes": len(raw)})
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(entries).encode()
    return len(head).to_bytes(8, "little") + head + b"".join(blobs)


def _load_arrays(data: bytes) -> list[np.ndarray]:
    from tilework.ir.dtype import np_dtype

    n = int.from_bytes(data[:8], "little")
    entries = json.loads(data[8 : 8 + n])
    body = memoryview(data)[8 + n :]
    out = []
    for e in entries:
        raw = body[e["offset"] : e["offset"] + e["nbytes"]]
        out.append(np.frombuffer(raw, np_dtype(e["dtype"])).reshape(e["shape"]).copy())
    return out


__all__ = ["compile", "CompiledModel", "Signature", "Imported", "CompileOptions", "register_frontend", "frontends"]
