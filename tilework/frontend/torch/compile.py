"""torch for ``tilework.compile``: ``torch.nn.Module``s (exported with ``torch.export``) and
``ExportedProgram``s.

A module is exported with ``torch.export.export(model, args, kwargs, dynamic_shapes=...)``;
the names of its ``Dim``s name the sym vars. ``register()`` adds both frontends.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tilework.errors import UnsupportedError
from tilework.frontend.registry import CompileOptions, Imported, Signature, register_frontend


def is_torch_module(m: Any) -> bool:
    return any(c.__module__.startswith("torch.nn") and c.__name__ == "Module" for c in type(m).__mro__)


def import_exported_program(ep: Any, options: CompileOptions) -> Imported:
    from tilework.frontend.torch import translate

    tr = translate(ep, options.weights == "inputs", dim_names=options.dim_names, dim_bounds=options.dim_bounds, copy_weights=False)
    return _imported_from_translation(tr, f"torch.export ExportedProgram ({sum(1 for n in ep.graph.nodes if n.op == 'call_function')} ATen calls)")


def import_torch_module(model: Any, options: CompileOptions) -> Imported:
    import torch

    if options.example_args is None:
        raise UnsupportedError("compiling a torch.nn.Module needs example_args (example inputs for torch.export)")
    args, kwargs = _split_example(options.example_args)
    try:
        ep = torch.export.export(model, tuple(args), dict(kwargs), dynamic_shapes=options.dynamic_shapes, strict=False)
    except Exception as e:  # torch.export refuses a model with many exception types; its own is the cause
        raise UnsupportedError(f"torch.export cannot export {type(model).__name__} with these example_args and dynamic_shapes: {type(e).__name__}: {_explanation(e)}") from e
    names = dict(_dim_names_from_spec(ep, model, args, kwargs, options.dynamic_shapes))
    names.update(options.dim_names or {})
    from tilework.frontend.torch import translate

    tr = translate(ep, options.weights == "inputs", dim_names=names, dim_bounds=options.dim_bounds, copy_weights=False)
    calls = sum(1 for n in ep.graph.nodes if n.op == "call_function")
    return _imported_from_translation(tr, f"torch.nn.Module {type(model).__name__} via torch.export ({calls} ATen calls)")


def _explanation(e: Exception, max_lines: int = 16, max_chars: int = 3000) -> str:
    """torch's message without its blank lines, cut to ``max_lines`` lines and about
    ``max_chars`` characters: its first line is often only a summary ("Constraints violated
    (h)!"), the lines after it say which guard failed and suggest fixes."""
    lines = [line.rstrip() for line in str(e).splitlines() if line.strip()]
    kept: list[str] = []
    size = 0
    for line in lines[:max_lines]:
        if kept and size + len(line) > max_chars:
            break
        kept.append(line if len(line) <= max_chars else line[:max_chars] + " ...")
        size += len(line) + 1
    if len(kept) < len(lines):
        kept.append(f"... ({len(lines) - len(kept)} more line(s) of torch's message)")
    return "\n".join(kept)


def _imported_from_translation(tr: Any, source: str) -> Imported:
    inputs = [{"name": name, "tensor": is_param, "value": value} for name, is_param, value in tr.inputs]
    in_spec = _dumps(tr.in_spec) if tr.in_spec is not None else None
    out_spec = _dumps(tr.out_spec) if tr.out_spec is not None else None
    # the live specs serve this process (their node types exactly); the text, a saved model
    live = {k: v for k, v in (("in", tr.in_spec), ("out", tr.out_spec)) if v is not None}
    # the weights are views of the model's tensors: compile copies those it keeps as they are
    return Imported(tr.module, [w for _, w in tr.weights], Signature(inputs, in_spec, out_spec, _specs=live), source, dict(tr.dims), borrowed=True)


def _dumps(spec: Any) -> str:
    """A pytree spec as text. A node type that torch cannot name in text (``torch.return_types``
    such as ``topk``'s and ``max``'s, a namedtuple registered without a serialized name) is
    written as a tuple of the same children: a model loaded from a file returns a plain tuple
    there, the compiled model itself the original type."""
    from torch.utils import _pytree as pytree

    try:
        return pytree.treespec_dumps(spec)
    except NotImplementedError:
        return pytree.treespec_dumps(_as_tuples(spec))


def _as_tuples(spec: Any) -> Any:
    from torch.utils import _pytree as pytree

    if spec.is_leaf():
        return spec
    children = [_as_tuples(c) for c in spec.children()]
    leaf = pytree.tree_flatten(0)[1]
    try:
        pytree.treespec_dumps(pytree.TreeSpec(spec.type, spec.context, [leaf] * len(children)))
    except NotImplementedError:
        return pytree.TreeSpec(tuple, None, children)
    return pytree.TreeSpec(spec.type, spec.context, children)


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


def register() -> None:
    """Make ``tilework.compile`` accept ExportedPrograms and torch modules."""
    register_frontend("torch.export", lambda m: type(m).__name__ == "ExportedProgram" and type(m).__module__.startswith("torch"), import_exported_program)
    register_frontend("torch", is_torch_module, import_torch_module)


__all__ = ["import_exported_program", "import_torch_module", "is_torch_module", "register"]
