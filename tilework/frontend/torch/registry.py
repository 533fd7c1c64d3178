"""The table of ATen converters.

A converter turns one call of an ATen operator into tilework values. It is registered under
the operator's name, with or without the overload (``"add.Tensor"``, ``"add"``); lookup tries
the exact overload first, then the bare name. It is called as ``fn(t, node, *args, **kwargs)``
where ``t`` is the ``Translator`` (its helpers emit ops and make tensors of scalars), ``node``
is the fx node (for its output's shape and dtype) and the arguments are already translated:
tensors are graph values, sizes are dims, scalars stay Python numbers.
"""

from __future__ import annotations

from typing import Any, Callable

Converter = Callable[..., Any]
CONVERTERS: dict[str, Converter] = {}


def converter(*names: str) -> Callable[[Converter], Converter]:
    """Register the decorated function for each ATen op name (``"add.Tensor"`` or ``"add"``)."""

    def wrap(fn: Converter) -> Converter:
        for name in names:
            CONVERTERS[name] = fn
        return fn

    return wrap


def op_names(target: Any) -> tuple[str, str]:
    """``("add.Tensor", "add")`` for ``torch.ops.aten.add.Tensor``; Python operators (from
    ``sym_size`` arithmetic) are named after their function (``"mul"``)."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        base = schema.name.split("::", 1)[-1]
        full = f"{base}.{schema.overload_name or 'default'}"
        return full, base
    name = getattr(target, "__name__", str(target))
    return name, name


def lookup(target: Any) -> Converter | None:
    full, base = op_names(target)
    return CONVERTERS.get(full) or CONVERTERS.get(base)


__all__ = ["Converter", "CONVERTERS", "converter", "lookup", "op_names"]
