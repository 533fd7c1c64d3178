"""Converters from ONNX nodes to tilework graph bindings, keyed by op type and opset.

A converter handles a range of *schema versions* of one op: the ``since_version`` of the
operator schema that a model's opset import selects. ``ReduceSum`` at opset 17 uses the
schema of version 13 (axes as an input), at opset 11 the one of version 11 (axes as an
attribute); each range is registered separately:

    @converter("ReduceSum", 13, 13, static_inputs=(1,))
    def _reduce_sum(ctx: NodeCtx) -> Result: ...

``static_inputs`` lists the operands whose *values* fix the result's shape (axes, a target
shape, pads, ``k``): the converter reads them at conversion time. A constant or a value the
importer tracked symbolically works; anything else is lifted into fresh sym vars where the
result's rank allows it, and is an error otherwise. Test harnesses that feed every operand as
a graph input use this list to know which inputs a model would carry as initializers.

Ops of another domain than the default one (``ai.onnx.preview``'s ``FlexAttention``) are
registered with ``domain=`` and keyed by their domain-qualified name; their versions are
those of that domain's opset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence, Union

import onnx.defs

from tilework.ir.graph import Expr

if TYPE_CHECKING:
    from tilework.frontend.onnx.context import NodeCtx
    from tilework.frontend.onnx.values import AnyValue

Result = Union["AnyValue", Expr, Sequence[Union["AnyValue", Expr, None]]]
ConvertFn = Callable[["NodeCtx"], Result]


@dataclass(frozen=True)
class Converter:
    """One op's converter for schema versions ``lo..hi`` (inclusive) of ``domain``."""

    op_type: str
    lo: int
    hi: int
    fn: ConvertFn
    static_inputs: tuple[int, ...] = ()
    domain: str = ""


_CONVERTERS: dict[str, list[Converter]] = {}

DEFAULT_DOMAINS = ("", "ai.onnx")


def qualified_name(op_type: str, domain: str = "") -> str:
    """The registry key of an op: its type in the default domain, ``domain.op_type`` elsewhere."""
    return op_type if domain in DEFAULT_DOMAINS else f"{domain}.{op_type}"


def converter(op_type: str, lo: int, hi: int, static_inputs: Sequence[int] = (), domain: str = "") -> Callable[[ConvertFn], ConvertFn]:
    """Register the decorated function for schema versions ``lo..hi`` of ``op_type``."""
    key = qualified_name(op_type, domain)

    def deco(fn: ConvertFn) -> ConvertFn:
        for other in _CONVERTERS.get(key, []):
            if other.lo <= hi and lo <= other.hi:
                raise ValueError(f"converters for {key} overlap: versions {other.lo}-{other.hi} and {lo}-{hi}")
        _CONVERTERS.setdefault(key, []).append(Converter(op_type, lo, hi, fn, tuple(static_inputs), "" if domain in DEFAULT_DOMAINS else domain))
        return fn

    return deco


def converters_of(op_type: str, domain: str = "") -> list[Converter]:
    """The registered converters of ``op_type`` in ``domain`` (those of the modules imported so
    far: ``tilework.frontend.onnx.converters`` imports them all)."""
    return list(_CONVERTERS.get(qualified_name(op_type, domain), []))


def has_domain(domain: str) -> bool:
    """Whether some converter handles an op of ``domain``."""
    return domain in DEFAULT_DOMAINS or any(c.domain == domain for cs in _CONVERTERS.values() for c in cs)


def all_converters() -> dict[str, list[Converter]]:
    return {op: list(cs) for op, cs in _CONVERTERS.items()}


def schema_version(op_type: str, opset: int, domain: str = "") -> int | None:
    """The ``since_version`` of the schema of ``op_type`` that ``opset`` (of ``domain``) selects,
    or None when ONNX defines no such op at that opset."""
    try:
        return int(onnx.defs.get_schema(op_type, opset, "" if domain in DEFAULT_DOMAINS else domain).since_version)
    except onnx.defs.SchemaError:
        return None


def known_opsets(domain: str = "") -> tuple[int, int] | None:
    """The opsets of ``domain`` that the installed ``onnx`` defines schemas for, ``(first,
    last)``; None for a domain it does not define (``com.microsoft``). ``schema_version``
    answers for an opset past ``last`` with the newest schema, which says nothing of what the
    model's ops mean there: ``check_opsets`` refuses such a model."""
    versions = onnx.defs.C.schema_version_map()  # what onnx.defs.onnx_opset_version() reads, for every domain
    found = versions.get("" if domain in DEFAULT_DOMAINS else domain)
    return None if found is None else (int(found[0]), int(found[1]))


__all__ = ["Converter", "Result", "ConvertFn", "converter", "schema_version", "known_opsets", "converters_of", "all_converters", "qualified_name", "has_domain", "DEFAULT_DOMAINS"]
