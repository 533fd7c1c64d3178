"""``Module`` and ``ModuleList`` of ``tilework.nn``, and exporting modules to an IRModule.

A ``Module`` finds its parameters and sub-modules by walking its attributes in assignment order
(``ModuleList``, lists and tuples of modules included; attributes whose names start with ``_``
are private and skipped), so a subclass need not call ``super().__init__()``. Names are attribute
paths, ``layers.0.self_attn.q_proj.weight``; a parameter reachable by two paths (tied weights)
is one parameter, named by the first. Calling a module inside an export runs its ``forward``; a
``ShapeError`` or ``InferenceError`` raised inside is re-raised once, by the innermost module,
with the module's class, path and argument shapes in front of the message.

``export(module, spec, dim_bounds)`` traces each method named in the spec once, on Tensors
wrapping the method's graph params, into a graph function of the same name. The function takes
the method's inputs (in the method's argument order) and then every parameter of the module (in
``named_parameters`` order, named after its path with ``_`` for ``.``); its ``num_inputs``
attribute counts the inputs. The body is one dataflow block; the method returns a Tensor or a
tuple of Tensors. With ``weights="constants"`` the parameters are baked in as constants instead
(every one needs a value then) and the function takes only the inputs.

``module.compile(spec)`` calls the compiler that ``tilework.compiled`` registers here
(``register_compiler``; ``import tilework`` does it): ``tilework.compile(module, spec)``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import numpy as np

from tilework.errors import InferenceError, ParameterError, ShapeError, SpecError, TileworkError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Constant, Expr, Tuple, Var
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar
from tilework.nn import spec as spec_mod
from tilework.nn.core import Parameter, Tensor, Trace, current_trace, describe, tracing

if TYPE_CHECKING:
    from tilework.compiled import CompiledModel
    from tilework.nn.spec import DimBounds, Spec


# -- Module ----------------------------------------------------------------------------------

M = TypeVar("M", bound="Module")


def _modules_in(value: object) -> list["Module"] | None:
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Module) for v in value):
        return list(value)
    return None


class Module:
    """Base of tilework.nn modules; see the module docstring. A subclass defines ``forward``."""

    def members(self) -> Iterator[tuple[str, "Parameter | Module"]]:
        """Direct parameters and sub-modules in attribute order (lists of modules expanded)."""
        for name, value in vars(self).items():
            if name.startswith("_"):
                continue
            if isinstance(value, (Parameter, Module)):
                yield name, value
                continue
            listed = _modules_in(value)
            for i, m in enumerate(listed or []):
                yield f"{name}.{i}", m

    def named_modules(self) -> list[tuple[str, "Module"]]:
        """Every module (this one first, as ``""``) with its path; each once."""
        out: list[tuple[str, Module]] = []
        seen: set[int] = set()

        def visit(m: Module, path: str) -> None:
            if id(m) in seen:
                return
            seen.add(id(m))
            out.append((path, m))
            for name, v in m.members():
                if isinstance(v, Module):
                    visit(v, f"{path}.{name}" if path else name)

        visit(self, "")
        return out

    def named_parameters(self) -> list[tuple[str, Parameter]]:
        """Every parameter with its path, in attribute order; a shared one once."""
        out: list[tuple[str, Parameter]] = []
        seen: set[int] = set()

        def visit(m: Module, prefix: str) -> None:
            if id(m) in seen:
                return
            seen.add(id(m))
            for name, v in m.members():
                if isinstance(v, Module):
                    visit(v, f"{prefix}{name}.")
                elif id(v) not in seen:
                    seen.add(id(v))
                    out.append((prefix + name, v))

        visit(self, "")
        return out

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    # -- values ------------------------------------------------------------------------------

    def missing_parameters(self) -> list[str]:
        """Names of the parameters that have no value yet."""
        return [name for name, p in self.named_parameters() if p.data is None]

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every parameter's value by name; a parameter without one is an error."""
        require_values(self)
        return {name: p.data for name, p in self.named_parameters() if p.data is not None}

    def ignored_state_keys(self, keys: Iterable[str]) -> set[str]:
        """Keys of a state dict that name no parameter yet are expected (buffers a checkpoint
        carries, a tied weight stored twice); ``load_state_dict`` skips them. None by default."""
        return set()

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Set parameter values from ``{name: array}`` (NumPy arrays or torch tensors). With
        ``strict``, every parameter must be given and every key must name a parameter (or be
        one of ``ignored_state_keys``). Values are checked (``Parameter.checked_value``) before
        any is set."""
        params = dict(self.named_parameters())
        ignored = self.ignored_state_keys(state.keys())
        unexpected = [k for k in state if k not in params and k not in ignored]
        missing = [k for k in params if k not in state]
        if strict and (unexpected or missing):
            parts = []
            if missing:
                parts.append(f"missing {_names(missing)}")
            if unexpected:
                parts.append(f"unexpected {_names(unexpected)}")
            raise ParameterError(f"{type(self).__name__}.load_state_dict: {'; '.join(parts)}")
        values = {k: params[k].checked_value(v, k) for k, v in state.items() if k in params}
        for k, a in values.items():
            params[k].data = a

    def init_random(self: M, seed: int = 0, scale: float = 0.02) -> M:
        """Give every parameter a random value by its ``init``; returns the module."""
        rng = np.random.default_rng(seed)
        for _, p in self.named_parameters():
            p.data = p.random_value(rng, scale)
        return self

    # -- calling, exporting ------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward = getattr(self, "forward", None)
        if not callable(forward):
            raise TileworkError(f"{type(self).__name__} defines no forward method")
        return self.run_method(forward, args, kwargs)

    def run_method(self, method: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """``method(*args, **kwargs)`` in the current trace, as this module (for naming and for
        the context errors get)."""
        trace = current_trace()
        path = trace.paths.get(id(self), "")
        trace.scope.append(path)
        try:
            return method(*args, **kwargs)
        except (ShapeError, InferenceError) as e:
            if e.nn_module is not None:
                raise
            raise _with_context(e, self, path, method, args, kwargs) from e
        finally:
            trace.scope.pop()

    def export(self, spec: "Spec", dim_bounds: "DimBounds | None" = None, weights: str = "params") -> tuple["IRModule", list[str]]:
        """The module's methods as graph functions, see ``export``."""
        return export(self, spec, dim_bounds, weights=weights)

    def compile(self, spec: "Spec | None" = None, dim_bounds: "DimBounds | None" = None, weights: str = "inputs") -> "CompiledModel":
        """``forward`` compiled once for every shape the spec allows; the result is called with
        arrays (NumPy or torch) and passes the parameter values itself, as they are now."""
        return compile_module(self, spec, dim_bounds, weights)

    def default_spec(self) -> "Spec | None":
        """The input spec ``compile`` uses when none is given; None: one must be given."""
        return None


class ModuleList(Module):
    """A list of modules, named ``0``, ``1``, ... under the attribute that holds the list."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        self._items: list[Module] = []
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> None:
        if not isinstance(module, Module):
            raise TileworkError(f"ModuleList holds modules, got {type(module).__name__}")
        self._items.append(module)

    def members(self) -> Iterator[tuple[str, Parameter | Module]]:
        for i, m in enumerate(self._items):
            yield str(i), m

    def __getitem__(self, i: int) -> Module:
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._items)


# -- helpers ---------------------------------------------------------------------------------


def _names(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def require_values(module: Module) -> None:
    missing = module.missing_parameters()
    if missing:
        raise ParameterError(
            f"{type(module).__name__}: parameter(s) without a value: {_names(missing)}; "
            "set them with module.load_state_dict({name: array}) or module.init_random(seed)"
        )


def _arguments(method: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    try:
        bound = inspect.signature(method).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    return list(bound.arguments.items())


def _with_context(e: TileworkError, module: Module, path: str, method: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> TileworkError:
    """``e`` again (same class) with the module and its argument shapes in front."""
    where = f"{type(module).__name__} '{path}'" if path else f"{type(module).__name__} (the exported module)"
    name = getattr(method, "__name__", "forward")
    call = ", ".join(f"{k}: {describe(v)}" for k, v in _arguments(method, args, kwargs))
    msg = f"in {where}.{name}({call}): {e}"
    try:
        new = type(e)(msg)
    except TypeError:
        new = ShapeError(msg) if isinstance(e, ShapeError) else InferenceError(msg)
    new.nn_module = path
    return new




# -- exporting -------------------------------------------------------------------------------

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


def compile_module(model: Module, spec: "spec_mod.Spec | None", dim_bounds: "spec_mod.DimBounds | None", weights: str = "inputs", **kw: Any) -> "CompiledModel":
    """``tilework.compile`` of a tilework.nn module (``Module.compile``)."""
    if not _COMPILER:
        raise TileworkError("no compiler is registered: import tilework (tilework.compiled registers tilework.compile)")
    bounds = spec_mod.normalize_bounds(dim_bounds) if dim_bounds is not None else None
    return _COMPILER[0](model, spec, dim_bounds=bounds, weights=weights, **kw)


_COMPILER: list[Callable[..., Any]] = []


def register_compiler(fn: Callable[..., Any]) -> None:
    """Make ``Module.compile`` compile with ``fn`` (``tilework.compile``, registered by the
    layer above)."""
    _COMPILER[:] = [fn]


__all__ = ["Module", "ModuleList", "require_values", "export", "export_methods", "Exported", "param_var_name", "compile_module", "register_compiler"]
