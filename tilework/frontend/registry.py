"""The frontend registry: how ``tilework.compile`` turns a model into an IRModule.

``compile`` asks each registered frontend, in order, whether it accepts the model, and the first
that does imports it. The built-in frontends (``irmodule`` here, ``torch.export`` and ``torch``
in ``tilework.frontend.torch.compile``, ``tilework.nn`` in ``tilework.nn.export``, ``onnx`` in
``tilework.frontend.onnx.compile``) are registered by ``tilework.compiled``. Adding a frontend is
one call::

    register_frontend("onnx", accepts=lambda m: ..., load=import_onnx)

``accepts(model)`` must not import the framework (test the type's module name or a file
suffix); ``load(model, options)`` returns an ``Imported``: the module whose ``main`` takes the
user inputs and then the weights (``attrs["num_inputs"]`` counts the inputs), the weights, and
the ``Signature`` that maps a call's arguments to those inputs and the outputs back.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tilework.errors import TileworkError, UnsupportedError
from tilework.ir.graph import GraphFunc
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar


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
    _orders: dict[tuple[Any, ...], list[int | str]] = field(default_factory=dict, repr=False, compare=False)  # by call form (bind)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
        """The tensor inputs of ``main`` for a call ``(*args, **kwargs)``. A call whose
        arguments are all arrays or tensors takes its inputs in the order found for the first
        call of the same form (how many positional arguments, which keywords in which order):
        flattening a torch pytree spec costs ~0.1 ms a call."""
        leaves = all(_is_leaf(v) for v in args) and all(_is_leaf(v) for v in kwargs.values())
        form = (len(args), *kwargs)
        order = self._orders.get(form) if leaves else None
        if order is None and leaves:
            order = self._order_of(len(args), list(kwargs))
            if order is not None:
                self._orders[form] = order
        flat = [args[k] if isinstance(k, int) else kwargs[k] for k in order] if order is not None else self._flatten(args, kwargs)
        out = []
        for spec, value in zip(self.inputs, flat):
            if spec["tensor"]:
                out.append(value)
            elif value != spec["value"]:
                raise TileworkError(f"input {spec['name']} was fixed to {spec['value']!r} when the model was compiled, got {value!r}")
        return out

    def _order_of(self, nargs: int, keywords: list[str]) -> list[int | str] | None:
        """Where each flat input comes from in a call of ``nargs`` positional arrays and
        ``keywords`` (a position or a keyword), found by flattening stand-ins; None when such a
        call does not match (the call itself then raises, with its own values in the message)."""
        keys: list[int | str] = [*range(nargs), *keywords]
        marks = [_Mark() for _ in keys]
        where = {id(m): k for k, m in zip(keys, marks)}
        try:
            flat = self._flatten(marks[:nargs], dict(zip(keywords, marks[nargs:])))
        except TileworkError:
            return None
        if not all(id(v) in where for v in flat):
            return None
        return [where[id(v)] for v in flat]

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
        call = (tuple(args), dict(kwargs))
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
            expected = _render_call(spec, iter(names))
            called = _render_call(pytree.tree_flatten(call)[1], None, [*call[0], *call[1].values()])
            raise TileworkError(f"the call does not match the inputs the model was compiled for:\n  compiled for model{expected}\n  called as    model{called}")
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


class _Mark:
    """A stand-in argument: where it lands among the flat inputs shows the order of a call form."""

    __slots__ = ()


def _is_leaf(v: Any) -> bool:
    """An array or a tensor: a leaf of every torch pytree."""
    return isinstance(v, np.ndarray) or (type(v).__module__.startswith("torch") and type(v).__name__ in ("Tensor", "Parameter"))


_SHOWN = 4  # the items of a list or tuple a call's description shows


def _render_call(spec: Any, names: Any, values: Sequence[Any] | None = None) -> str:
    """``(x, y, mask=m)`` for a pytree spec of ``(args, kwargs)``: the leaves by ``names``, or
    described by the values in ``values`` (whose leaves are the top-level call arguments)."""
    from torch.utils import _pytree as pytree

    leaves = iter(pytree.tree_leaves(list(values or ())))

    def leaf() -> str:
        if names is not None:
            return str(next(names, "?"))
        v = next(leaves, None)
        shape = getattr(v, "shape", None)
        if shape is not None:
            return f"{type(v).__name__}{list(shape)}"
        return type(v).__name__ if v is not None else "None"

    def render(sp: Any) -> str:
        if sp.is_leaf():
            return leaf()
        kids = [render(c) for c in sp.children()]
        if sp.type is dict:
            return "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(sp.context, kids)) + "}"
        if sp.type in (list, tuple) and len(kids) > _SHOWN:  # a list of numbers: its first items and its length
            kids = [*kids[:_SHOWN], f"... {len(kids)} items"]
        if sp.type is list:
            return "[" + ", ".join(kids) + "]"
        if sp.type is tuple:
            return "(" + ", ".join(kids) + ("," if len(kids) == 1 else "") + ")"
        return f"{getattr(sp.type, '__name__', sp.type)}({', '.join(kids)})"

    arg_spec, kw_spec = spec.children()
    parts = [render(c) for c in arg_spec.children()]
    parts += [f"{k}={render(c)}" for k, c in zip(kw_spec.context or [], kw_spec.children())]
    return f"({', '.join(parts)})"


@dataclass
class Imported:
    """What a frontend gives ``compile``: see the module docstring."""

    module: IRModule
    weights: list[np.ndarray]
    signature: Signature
    source: str
    dims: dict[SymVar, str] = field(default_factory=dict)  # sym var -> where it first appears
    # the weights are read-only views of the model's own tensors (the torch frontends): compile
    # copies the ones it keeps unchanged, once, so that a later in-place change of the model
    # does not reach the compiled model (the others it lays out into new arrays anyway)
    borrowed: bool = False


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


def import_model(model: Any, options: CompileOptions) -> Imported:
    """The first registered frontend that accepts ``model`` imports it; a path may be a
    ``str`` or any ``os.PathLike`` (``pathlib.Path``)."""
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    for _, accepts, load in _FRONTENDS:
        if accepts(model):
            return load(model, options)
    if isinstance(model, str) and os.path.isdir(model):
        raise UnsupportedError(f"tilework.compile cannot compile {model!r}: it is a directory, not a model file (a .onnx file, say)")
    raise UnsupportedError(f"tilework.compile cannot compile a {type(model).__module__}.{type(model).__name__}; it accepts: {', '.join(frontends())}")


def import_irmodule(mod: IRModule, options: CompileOptions) -> Imported:
    main = mod.get("main")
    if not isinstance(main, GraphFunc):
        raise UnsupportedError("an IRModule to compile needs a graph function main")
    n = int(main.attrs.get("num_inputs", len(main.params)))
    if n != len(main.params):
        raise UnsupportedError(f"main has {len(main.params) - n} weight param(s); compile an IRModule whose main takes only inputs, or run it with tilework.build")
    inputs = [{"name": p.name, "tensor": True, "value": None} for p in main.params]
    return Imported(mod, [], Signature(inputs), "IRModule")


# Node types of the input/output structure whose modules ``_load_treespec`` imports (so that
# their pytree registrations exist): a saved model names them, and importing a module runs its
# code, so only these well-known packages are imported for a file.
TREESPEC_MODULES = ("torch", "transformers", "collections", "builtins")


def _load_treespec(text: str) -> Any:
    """A serialized pytree spec; the modules of its node types are imported first so that their
    registrations (e.g. transformers' ModelOutput classes) exist, when they belong to a package
    of ``TREESPEC_MODULES``."""
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
            if module.split(".")[0] not in TREESPEC_MODULES:
                raise TileworkError(f"the model's input/output structure uses {name}; tilework imports the modules of such types only from {', '.join(TREESPEC_MODULES)}")
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise TileworkError(f"the model's input/output structure uses {name}, which cannot be imported here: {e}") from None
    return pytree.treespec_loads(text)


__all__ = ["Signature", "Imported", "CompileOptions", "register_frontend", "frontends", "import_model", "import_irmodule"]
