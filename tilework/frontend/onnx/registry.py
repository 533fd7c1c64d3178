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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence, Union

import onnx.defs

from tilework.errors import UnsupportedError
from tilework.ir.graph import Expr

if TYPE_CHECKING:
    from tilework.frontend.onnx.context import NodeCtx
    from tilework.frontend.onnx.values import Value

Result = Union["Value", Expr, Sequence[Union["Value", Expr, None]]]
ConvertFn = Callable[["NodeCtx"], Result]


@dataclass(frozen=True)
class Converter:
    """One op's converter for schema versions ``lo..hi`` (inclusive)."""

    op_type: str
    lo: int
    hi: int
    fn: ConvertFn
    static_inputs: tuple[int, ...] = ()


_CONVERTERS: dict[str, list[Converter]] = {}


def converter(op_type: str, lo: int, hi: int, static_inputs: Sequence[int] = ()) -> Callable[[ConvertFn], ConvertFn]:
    """Register the decorated function for schema versions ``lo..hi`` of ``op_type``."""

    def deco(fn: ConvertFn) -> ConvertFn:
        for other in _CONVERTERS.get(op_type, []):
            if other.lo <= hi and lo <= other.hi:
                raise ValueError(f"converters for {op_type} overlap: versions {other.lo}-{other.hi} and {lo}-{hi}")
        _CONVERTERS.setdefault(op_type, []).append(Converter(op_type, lo, hi, fn, tuple(static_inputs)))
        return fn

    return deco


def _load_converters() -> None:
    """Import the converter modules (importing registers them)."""
    import tilework.frontend.onnx.converters  # noqa: F401


def schema_version(op_type: str, opset: int, domain: str = "") -> int | None:
    """The ``since_version`` of the schema of ``op_type`` that ``opset`` selects, or None when
    ONNX defines no such op at that opset."""
    try:
        return int(onnx.defs.get_schema(op_type, opset, domain).since_version)
    except onnx.defs.SchemaError:
        return None


def find(op_type: str, version: int) -> Converter | None:
    _load_converters()
    for c in _CONVERTERS.get(op_type, []):
        if c.lo <= version <= c.hi:
            return c
    return None


def lookup(op_type: str, opset: int, node_name: str = "", domain: str = "") -> tuple[Converter, int]:
    """The converter for ``op_type`` under ``opset`` and the schema version it selects; an
    ``UnsupportedError`` naming the op, the node and the opset when there is none."""
    where = f"node {node_name!r}" if node_name else "an unnamed node"
    if domain not in ("", "ai.onnx"):
        raise UnsupportedError(f"ONNX op {domain}.{op_type} ({where}, opset {opset}): the {domain} domain is not supported")
    version = schema_version(op_type, opset)
    if version is None:
        raise UnsupportedError(f"ONNX op {op_type} ({where}, opset {opset}): ONNX defines no such op at this opset")
    conv = find(op_type, version)
    if conv is None:
        have = ", ".join(f"{c.lo}-{c.hi}" if c.lo != c.hi else str(c.lo) for c in sorted(_CONVERTERS.get(op_type, []), key=lambda c: c.lo))
        extra = f"; converted versions: {have}" if have else "; the op is not supported"
        raise UnsupportedError(f"ONNX op {op_type} ({where}, opset {opset}): schema version {version} is not supported{extra}")
    return conv, version


def supported(op_type: str, opset: int, domain: str = "") -> bool:
    """Whether a converter handles ``op_type`` at ``opset``."""
    if domain not in ("", "ai.onnx"):
        return False
    version = schema_version(op_type, opset)
    return version is not None and find(op_type, version) is not None


def supported_ops() -> dict[str, list[tuple[int, int]]]:
    """Each converted op type with the schema version ranges it handles."""
    _load_converters()
    return {op: sorted((c.lo, c.hi) for c in cs) for op, cs in sorted(_CONVERTERS.items())}


__all__ = ["Converter", "Result", "ConvertFn", "converter", "schema_version", "find", "lookup", "supported", "supported_ops"]
