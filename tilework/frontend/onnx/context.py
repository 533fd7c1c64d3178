"""``NodeCtx``: what a converter sees of the node it converts and of the importer.

A converter reads attributes (``ctx.attr``), operands at the level it needs them — the
``Value`` (``ctx.value``), a graph expression (``ctx.expr``), a compile-time array
(``ctx.const``), static ints (``ctx.ints``) or symbolic dims (``ctx.dims``) — and emits
bindings with ``ctx.emit``. Errors name the op, the node and the opset (``ctx.unsupported``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import onnx
from onnx import NodeProto

from tilework.errors import UnsupportedError
from tilework.frontend.onnx.values import AnyValue, Elem, SeqValue, Value, dtype_name, elem_type_name, kind_of
from tilework.ir import sym
from tilework.ir.graph import Expr, Var
from tilework.ir.info import ShapeInfo, TensorInfo
from tilework.ir.sym import Dim, SymExpr, SymVar

if TYPE_CHECKING:
    from tilework.frontend.onnx.importer import Importer

_MISSING = object()


class NodeCtx:
    """The node being converted; ``version`` is the op's schema version under the model's opset."""

    def __init__(self, imp: "Importer", node: NodeProto, version: int, opset: int) -> None:
        self.imp = imp
        self.node = node
        self.version = version
        self.opset = opset
        self.op_type = node.op_type
        self.name = node.name
        self._attrs = {a.name: a for a in node.attribute}

    # -- errors ---------------------------------------------------------------------------

    def where(self) -> str:
        node = f"node {self.name!r}" if self.name else f"the node producing {list(self.node.output)}"
        return f"ONNX op {self.op_type} ({node}, opset {self.opset})"

    def unsupported(self, message: str) -> UnsupportedError:
        return UnsupportedError(f"{self.where()}: {message}")

    # -- attributes -----------------------------------------------------------------------

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def attr(self, name: str, default: Any = _MISSING) -> Any:
        """An attribute's value (bytes decoded to str, lists as tuples, tensors as arrays)."""
        a = self._attrs.get(name)
        if a is None:
            if default is _MISSING:
                raise self.unsupported(f"required attribute {name!r} is missing")
            return default
        if a.type == onnx.AttributeProto.GRAPH:
            return a.g
        if a.type == onnx.AttributeProto.TENSOR:
            return self.imp.tensor_array(a.t, self)
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, list):
            return tuple(x.decode() if isinstance(x, bytes) else x for x in v)
        return v

    def dtype_attr(self, name: str, default: Any = _MISSING) -> str:
        elem = self.attr(name, default)
        dt = dtype_name(int(elem))
        if dt is None:
            raise self.unsupported(f"element type {elem_type_name(int(elem))} is not supported")
        return dt

    # -- operands -------------------------------------------------------------------------

    @property
    def num_inputs(self) -> int:
        return len(self.node.input)

    def has_input(self, i: int) -> bool:
        """Operand ``i`` is given (optional operands may be absent or named '')."""
        return i < len(self.node.input) and self.node.input[i] != ""

    def value(self, i: int) -> Value:
        if not self.has_input(i):
            raise self.unsupported(f"operand {i} is required")
        return self.imp.lookup(self.node.input[i], self)

    def any_value(self, i: int) -> AnyValue:
        """Operand ``i`` as it is: a tensor, a sequence or an optional."""
        if not self.has_input(i):
            raise self.unsupported(f"operand {i} is required")
        return self.imp.lookup_any(self.node.input[i], self)

    def seq(self, i: int) -> SeqValue:
        """Operand ``i``, which must be a sequence."""
        v = self.any_value(i)
        if not isinstance(v, SeqValue):
            raise self.unsupported(f"operand {i} ({self.node.input[i]!r}) must be a sequence, got {kind_of(v)}")
        return v

    def expr(self, i: int) -> Expr:
        """Operand ``i`` as a graph expression (materialized if needed)."""
        return self.imp.materialize(self.value(i))

    def info(self, i: int) -> TensorInfo:
        return self.value(i).info

    def known_shape(self, i: int) -> tuple[Dim, ...]:
        """The (symbolic) shape of operand ``i``; an error when even its rank is unknown."""
        shape = self.value(i).info.shape
        if shape is None:
            raise self.unsupported(f"the shape of operand {i} ({self.node.input[i]!r}) is not known")
        return shape

    def shape_of(self, e: Expr) -> tuple[Dim, ...]:
        """The (symbolic) shape of a graph expression the converter built; an error when it
        is not a tensor of known rank."""
        info = e.info
        if not isinstance(info, TensorInfo) or info.shape is None:
            raise self.unsupported(f"the shape of an intermediate value is not known ({info})")
        return info.shape

    def rank(self, i: int) -> int:
        return len(self.known_shape(i))

    def dtype(self, i: int) -> str:
        dt = self.value(i).info.dtype
        if dt is None:
            raise self.unsupported(f"the dtype of operand {i} ({self.node.input[i]!r}) is not known")
        return dt

    def const(self, i: int) -> np.ndarray | None:
        """Operand ``i``'s contents when known at conversion time."""
        if not self.has_input(i):
            return None
        return self.value(i).const

    def static(self, i: int, what: str) -> np.ndarray:
        """Operand ``i``'s contents, which must be known at conversion time."""
        c = self.const(i)
        if c is None:
            raise self.unsupported(f"{what} (operand {i}, {self.node.input[i]!r}) must be a constant: an initializer, a Constant node or a value computed from shapes")
        return c

    def ints(self, i: int, what: str) -> tuple[int, ...]:
        """Operand ``i`` as static ints (axes, pads, ...)."""
        return tuple(int(v) for v in self.static(i, what).reshape(-1))

    def opt_ints(self, i: int, what: str) -> tuple[int, ...] | None:
        return self.ints(i, what) if self.has_input(i) else None

    def elems(self, i: int) -> tuple[Elem, ...] | None:
        return self.value(i).elems if self.has_input(i) else None

    def dims(self, i: int, what: str) -> tuple[Dim, ...]:
        """Operand ``i`` (a 0-d or 1-D integer tensor) as dims: static, tracked symbolically,
        or lifted at run time into fresh sym vars bound by a ``match_cast``."""
        v = self.value(i)
        if v.elems is not None and not any(isinstance(e, bool) for e in v.elems):
            return tuple(v.elems)
        return self.imp.lift_dims(v, what, self)

    def scalar(self, i: int, what: str) -> Dim:
        d = self.dims(i, what)
        if len(d) != 1:
            raise self.unsupported(f"{what} must hold one value, got {len(d)}")
        return d[0]

    # -- emitting -------------------------------------------------------------------------

    def emit(self, expr: Expr) -> Var:
        return self.imp.emit(expr)

    def refine(self, expr: Expr) -> Expr:
        """``expr`` with unknown dims of a known rank bound to fresh sym vars (a match_cast)."""
        return self.imp.refine(expr, self.op_type.lower())

    def fresh_dim(self, hint: str) -> SymVar:
        return self.imp.fresh_var(hint)


def is_static_dims(dims: Sequence[Dim]) -> bool:
    return all(isinstance(d, int) for d in dims)


def dim_known_nonneg(d: Dim) -> bool:
    return isinstance(d, int) and d >= 0 or isinstance(d, SymExpr) and sym.prove_ge(d, 0)


__all__ = ["NodeCtx", "is_static_dims", "dim_known_nonneg", "ShapeInfo"]
