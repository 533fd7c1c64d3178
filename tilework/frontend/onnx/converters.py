"""The ONNX converters, all of them: importing this module imports every converter module (each
registers its converters with ``registry``), and the queries here see the full table."""

from __future__ import annotations

from tilework.errors import UnsupportedError
from tilework.frontend.onnx import (  # noqa: F401  (importing registers the converters)
    convert_attention,
    convert_bitwise,
    convert_control,
    convert_linear_attention,
    convert_loss,
    convert_math,
    convert_misc_nn,
    convert_nn,
    convert_quant,
    convert_reduce,
    convert_rnn,
    convert_scan,
    convert_shape,
    convert_vision,
)
from tilework.frontend.onnx.registry import Converter, all_converters, converters_of, schema_version


def find(op_type: str, version: int) -> Converter | None:
    for c in converters_of(op_type):
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
        have = ", ".join(f"{c.lo}-{c.hi}" if c.lo != c.hi else str(c.lo) for c in sorted(converters_of(op_type), key=lambda c: c.lo))
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
    return {op: sorted((c.lo, c.hi) for c in cs) for op, cs in sorted(all_converters().items())}


__all__ = ["find", "lookup", "supported", "supported_ops", "schema_version"]
