"""The ONNX converters, all of them: importing this module imports every converter module (each
registers its converters with ``registry``), and the queries here see the full table."""

from __future__ import annotations

from tilework.errors import UnsupportedError
from tilework.frontend.onnx import (  # noqa: F401  (importing registers the converters)
    convert_attention,
    convert_bitwise,
    convert_control,
    convert_detection,
    convert_linalg,
    convert_linear_attention,
    convert_loss,
    convert_math,
    convert_misc_nn,
    convert_nn,
    convert_quant,
    convert_reduce,
    convert_rnn,
    convert_scan,
    convert_sequence,
    convert_shape,
    convert_signal,
    convert_vision,
)
from tilework.frontend.onnx.registry import Converter, all_converters, converters_of, has_domain, qualified_name, schema_version


def find(op_type: str, version: int, domain: str = "") -> Converter | None:
    for c in converters_of(op_type, domain):
        if c.lo <= version <= c.hi:
            return c
    return None


def lookup(op_type: str, opset: int, node_name: str = "", domain: str = "") -> tuple[Converter, int]:
    """The converter for ``op_type`` of ``domain`` under ``opset`` (the model's opset of that
    domain) and the schema version it selects; an ``UnsupportedError`` naming the op, the node
    and the opset when there is none."""
    where = f"node {node_name!r}" if node_name else "an unnamed node"
    if not has_domain(domain):
        raise UnsupportedError(f"ONNX op {domain}.{op_type} ({where}, opset {opset}): the {domain} domain is not supported")
    name = qualified_name(op_type, domain)
    version = schema_version(op_type, opset, domain)
    if version is None:
        raise UnsupportedError(f"ONNX op {name} ({where}, opset {opset}): ONNX defines no such op at this opset")
    conv = find(op_type, version, domain)
    if conv is None:
        have = ", ".join(f"{c.lo}-{c.hi}" if c.lo != c.hi else str(c.lo) for c in sorted(converters_of(op_type, domain), key=lambda c: c.lo))
        extra = f"; converted versions: {have}" if have else "; the op is not supported"
        raise UnsupportedError(f"ONNX op {name} ({where}, opset {opset}): schema version {version} is not supported{extra}")
    return conv, version


def supported(op_type: str, opset: int, domain: str = "") -> bool:
    """Whether a converter handles ``op_type`` of ``domain`` at ``opset`` (of that domain)."""
    if not has_domain(domain):
        return False
    version = schema_version(op_type, opset, domain)
    return version is not None and find(op_type, version, domain) is not None


def supported_ops() -> dict[str, list[tuple[int, int]]]:
    """Each converted op type with the schema version ranges it handles."""
    return {op: sorted((c.lo, c.hi) for c in cs) for op, cs in sorted(all_converters().items())}


__all__ = ["find", "lookup", "supported", "supported_ops", "schema_version"]
