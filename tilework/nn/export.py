"""``tilework.nn`` modules for ``tilework.compile``: ``forward`` becomes ``main``, the parameter
values at compile time are the weights the compiled model passes itself. ``register()`` adds the
frontend (``tilework.compiled`` calls it).
"""

from __future__ import annotations

from typing import Any

from tilework.errors import SpecError, UnsupportedError
from tilework.frontend.registry import CompileOptions, Imported, Signature, register_frontend
from tilework.nn import spec as spec_mod
from tilework.nn.module import Module, export_methods, require_values


def import_for_compile(model: Module, options: CompileOptions) -> Imported:
    """The ``tilework.compile`` frontend for tilework.nn modules: ``example_args`` is the spec
    of ``forward`` (or the module's ``default_spec()``), ``dim_bounds`` bounds its named dims."""
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
    arrays = [] if weights == "constants" else list(model.state_dict().values())  # in parameter order
    signature = Signature([{"name": n, "tensor": True, "value": None} for n in out.inputs["main"]])
    source = f"tilework.nn {type(model).__name__} ({len(out.param_names)} parameters)"
    return Imported(out.module, arrays, signature, source, dict(out.dims))


def is_nn_module(m: Any) -> bool:
    return isinstance(m, Module)


def register() -> None:
    """Make ``tilework.compile`` accept tilework.nn modules."""
    register_frontend("tilework.nn", is_nn_module, import_for_compile)


__all__ = ["import_for_compile", "is_nn_module", "register"]
