"""Exporting ``tilework.nn`` modules to an IRModule, and compiling them.

``export(module, spec, dim_bounds)`` traces each method named in the spec once, on Tensors
wrapping the method's graph params, into a graph function of the same name. The function takes
the method's inputs (in the method's argument order) and then every parameter of the module (in
``named_parameters`` order, named after its path with ``_`` for ``.``); its ``num_inputs``
attribute counts the inputs. The body is one dataflow block; the method returns a Tensor or a
tuple of Tensors. With ``weights="constants"`` the parameters are baked in as constants instead
(every one needs a value then) and the function takes only the inputs.

``tilework.compile(module, spec)`` (and ``module.compile(spec)``) go through
``import_for_compile``: ``forward`` becomes ``main``, and the parameter values at compile time are
the weights the compiled model passes itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from tilework.errors import SpecError, TileworkError, UnsupportedError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Constant, Expr, Tuple, Var
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar
from tilework.nn import spec as spec_mod
from tilework.nn.core import Module, Parameter, Tensor, Trace, require_values, tracing

if TYPE_CHECKING:
    from tilework.compiled import CompiledModel, CompileOptions, Imported

WEIGHTS = ("params", "constants")


@dataclass
class Exported:
    """What ``export`` produced, with the details ``compile`` needs."""

    module: IRModule
    param_names: list[str]
    inputs: dict[str, list[str]]  # function name -> input argument names
    dims: dict[SymVar, str]  # sym var -> where it first appears


def param_var_name(path: str) -> str:
    return path.replace(".", "_")


def export(module: Module, spec: "spec_mod.Spec", dim_bounds: "spec_mod.DimBounds | None" = None, weights: str = "params") -> tuple[IRModule, list[str]]:
    """An IRModule with one graph function per method of ``spec`` (see the module docstring),
    and the parameter names in the order the functions take them."""
    out = export_methods(module, spec_mod.normalize(spec), dim_bounds, weights)
    return out.module, out.param_names


def export_methods(
    module: Module,
    methods: Mapping[str, Mapping[str, spec_mod.Tensor]],
    dim_bounds: "spec_mod.DimBounds | None",
    weights: str = "params",
    func_names: Mapping[str, str] | None = None,
) -> Exported:
    if not isinstance(module, Module):
        raise SpecError(f"export needs a tilework.nn Module, got {type(module).__name__}")
    if weights not in WEIGHTS:
        raise SpecError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    bounds = spec_mod.normalize_bounds(dim_bounds)
    unknown = sorted(set(bounds) - spec_mod.used_dim_names(methods))
    if unknown:
        raise SpecError(f"dim_bounds names dim(s) no input has: {', '.join(unknown)}")
    if weights == "constants":
        require_values(module)
    named = module.named_parameters()
    paths = {id(m): path for path, m in module.named_modules()}
    owner = type(module).__name__
    bb = BlockBuilder()
    inputs: dict[str, list[str]] = {}
    dims: dict[SymVar, str] = {}
    for method_name, args in methods.items():
        method = getattr(module, method_name, None)
        if not callable(method) or method_name.startswith("_"):
            raise SpecError(f"{owner} has no method {method_name!r} to export")
        ins = spec_mod.method_inputs(owner, method, method_name, args, bounds)
        fname = (func_names or {}).get(method_name, method_name)
        bound, weight_params = _bind_parameters(named, weights)
        with tracing(Trace(bb, paths, bound)):
            with bb.function(fname, [*ins.params, *weight_params], attrs={"num_inputs": len(ins.params)}):
                with bb.dataflow():
                    tensors = [Tensor(p) for p in ins.params]
                    pos = [t for t, positional in zip(tensors, ins.positional) if positional]
                    kw = {n: t for n, t, positional in zip(ins.names, tensors, ins.positional) if not positional}
                    result = module.run_method(method, pos, kw)
                    out = _outputs(bb, result, f"{owner}.{method_name}")
                bb.emit_func_output(out)
        inputs[fname] = ins.names
        for v, where in ins.dims.items():
            dims.setdefault(v, where)
    return Exported(bb.get(), [name for name, _ in named], inputs, dims)


def _bind_parameters(named: list[tuple[str, Parameter]], weights: str) -> tuple[dict[int, Expr], list[Var]]:
    """What each parameter stands for in one function: a fresh param var, or its constant."""
    bound: dict[int, Expr] = {}
    params: list[Var] = []
    for name, p in named:
        if weights == "constants":
            assert p.data is not None
            bound[id(p)] = Constant(p.data, TensorInfo(tuple(p.data.shape), p.dtype), name)
            continue
        v = Var(param_var_name(name), p.info)
        bound[id(p)] = v
        params.append(v)
    return bound, params


def _outputs(bb: BlockBuilder, result: object, where: str) -> Expr:
    if isinstance(result, Tensor):
        return bb.emit_output(result.expr, "out")
    if isinstance(result, (tuple, list)) and result and all(isinstance(t, Tensor) for t in result):
        return Tuple(tuple(bb.emit_output(t.expr, f"out{i}") for i, t in enumerate(result)))
    raise TileworkError(f"{where} must return an nn.Tensor or a tuple of them, got {type(result).__name__}")


# -- compiling -------------------------------------------------------------------------------


def import_for_compile(model: Module, options: "CompileOptions") -> "Imported":
    """The ``tilework.compile`` frontend for tilework.nn modules: ``example_args`` is the spec
    of ``forward`` (or the module's ``default_spec()``), ``dim_bounds`` bounds its named dims."""
    from tilework.compiled import Imported, Signature

    if options.dynamic_shapes is not None:
        raise UnsupportedError("a tilework.nn module takes its input specs as example_args ({'x': nn.spec.Tensor(['n', 64])}); dynamic_shapes is for torch models")
    if options.dim_names:
        raise UnsupportedError("dim_names is for torch models; name a tilework.nn module's dims in its spec")
    spec = options.example_args if options.example_args is not None else model.default_spec()
    if spec is None:
        raise SpecError(f"compiling {type(model).__name__} needs the spec of its inputs: tilework.compile(module, {{'x': nn.spec.Tensor(['n', 64], 'float32')}})")
    methods = spec_mod.normalize(spec)
    if set(methods) != {"forward"}:
        raise SpecError(f"tilework.compile compiles forward only, the spec names {', '.join(methods)}; export other methods with module.export")
    weights = "constants" if options.weights == "constants" else "params"
    require_values(model)
    out = export_methods(model, methods, options.dim_bounds, weights, {"forward": "main"})
    arrays = [] if weights == "constants" else [p.data for p in model.parameters()]
    signature = Signature([{"name": n, "tensor": True, "value": None} for n in out.inputs["main"]])
    source = f"tilework.nn {type(model).__name__} ({len(out.param_names)} parameters)"
    return Imported(out.module, arrays, signature, source, dict(out.dims))  # type: ignore[arg-type]


def compile_module(model: Module, spec: "spec_mod.Spec | None", dim_bounds: "spec_mod.DimBounds | None", weights: str = "inputs", **kw: Any) -> "CompiledModel":
    """``tilework.compile`` of a tilework.nn module (``Module.compile``)."""
    from tilework.compiled import compile as tw_compile

    bounds = spec_mod.normalize_bounds(dim_bounds) if dim_bounds is not None else None
    return tw_compile(model, spec, dim_bounds=bounds, weights=weights, **kw)


__all__ = ["export", "export_methods", "Exported", "import_for_compile", "compile_module", "param_var_name"]
