"""The printer's shared machinery: lines with highlighting, names, dims, struct info, attrs
and the metadata section for large constants."""

from __future__ import annotations

import base64
import math
from typing import Any, Mapping

import numpy as np

from tilework.ir import sym
from tilework.ir.graph import Constant
from tilework.ir.info import AnyInfo, FuncInfo, PrimInfo, ShapeInfo, StructInfo, TensorInfo, TupleInfo
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.ir.dtype import encode_array
from tilework.text.syntax import INLINE_CONST_LIMIT, Namer, array_from_list, float_str, quote, to_python_list

INDENT = "    "


class Meta:
    """The large constants of a module, referenced as ``meta[i]`` and printed at its end."""

    def __init__(self) -> None:
        self.consts: list[Constant] = []
        self._index: dict[Constant, int] = {}

    def ref(self, c: Constant) -> str:
        i = self._index.get(c)
        if i is None:
            i = len(self.consts)
            self._index[c] = i
            self.consts.append(c)
        return f"meta[{i}]"

    def lines(self, full: bool) -> list[str]:
        """Entries with the data as base64 of the raw little-endian bytes
        (``tilework.ir.dtype.encode_array``), or, when not ``full``, a one-line summary comment
        per constant."""
        out: list[str] = []
        for i, c in enumerate(self.consts):
            dtype, dims, raw = encode_array(c.data)
            shape = dims_text(dims, str)
            if not full:
                out.append(f"# meta[{i}]: {dtype} {shape}")
                continue
            data = base64.b64encode(raw).decode("ascii")
            name = f", name={quote(c.name)}" if c.name else ""
            out.append(f"meta[{i}] = const(dtype={quote(dtype)}, shape={shape}, data={quote(data)}{name})")
        return out


def dims_text(values: tuple[Any, ...], show: Any) -> str:
    """A Python tuple literal: ``()``, ``(n,)``, ``(n, 4)``."""
    if len(values) == 1:
        return f"({show(values[0])},)"
    return "(" + ", ".join(show(v) for v in values) + ")"


def nested_list_text(values: object) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(nested_list_text(v) for v in values) + "]"
    if isinstance(values, bool):
        return "True" if values else "False"
    if isinstance(values, float):
        return float_str(values)
    return str(values)


def _as_read_back(values: object) -> object:
    """The values the parser gets from their text: every NaN is the default quiet NaN."""
    if isinstance(values, list):
        return [_as_read_back(v) for v in values]
    if isinstance(values, float) and math.isnan(values):
        return math.nan
    return values


def inline_const(c: Constant) -> str | None:
    """``const([...], "dtype")`` when the array is small and its text is exact, else None."""
    arr = np.asarray(c.data)
    if arr.size > INLINE_CONST_LIMIT:
        return None
    values = to_python_list(arr)
    dtype = str(arr.dtype)
    try:
        back = array_from_list(_as_read_back(values), dtype, tuple(arr.shape))
    except (TypeError, ValueError):
        return None
    if back.tobytes() != np.ascontiguousarray(arr).tobytes():
        return None  # e.g. a NaN payload that lists do not carry
    parts = [nested_list_text(values), quote(dtype)]
    if arr.size == 0:
        parts.append("shape=" + dims_text(tuple(int(d) for d in arr.shape), str))
    if c.name:
        parts.append(f"name={quote(c.name)}")
    return "const(" + ", ".join(parts) + ")"


def sym_decl(name: str, v: SymVar) -> str:
    args = []
    if v.lo != 0:
        args.append(f"lo={v.lo}")
    if v.hi is not None:
        args.append(f"hi={v.hi}")
    return f"{name} = sym({', '.join(args)})"


class BasePrinter:
    """Holds the output lines of one function and the names in scope there."""

    def __init__(self, meta: Meta, taken: frozenset[str] | set[str] = frozenset(), highlight: object = None, note: str | None = None) -> None:
        self.meta = meta
        self.namer = Namer(taken)
        self.lines: list[str] = []
        self.highlight = highlight
        self.note = note

    def emit(self, depth: int, text: str, node: object = None) -> None:
        self.lines.append(INDENT * depth + text)
        if node is not None and node is self.highlight:
            caret = INDENT * depth + "^" * max(len(text), 1)
            self.lines.append(caret + (f" {self.note}" if self.note else ""))

    # -- names and dims -------------------------------------------------------------------

    def sym_name(self, v: SymVar) -> str:
        return self.namer.name(v, v.name)

    def dim(self, d: Dim) -> str:
        return sym.to_str(d, self.sym_name)

    def dims(self, values: tuple[Dim, ...]) -> str:
        return dims_text(values, self.dim)

    # -- struct info ----------------------------------------------------------------------

    def info(self, i: StructInfo) -> str:
        if isinstance(i, AnyInfo):
            return "Any"
        if isinstance(i, PrimInfo):
            dtype = "None" if i.dtype is None else quote(i.dtype)
            return f"Prim({dtype})" if i.value is None else f"Prim({dtype}, value={self.dim(i.value)})"
        if isinstance(i, ShapeInfo):
            if i.values is not None:
                return f"Shape({self.dims(i.values)})"
            return "Shape()" if i.ndim == -1 else f"Shape(ndim={i.ndim})"
        if isinstance(i, TensorInfo):
            return self._tensor_info(i)
        if isinstance(i, TupleInfo):
            return "Tuple(" + ", ".join(self.info(f) for f in i.fields) + ")"
        if isinstance(i, FuncInfo):
            params = "None" if i.params is None else "[" + ", ".join(self.info(p) for p in i.params) + "]"
            pure = "" if i.pure else ", pure=False"
            return f"Func({params}, {self.info(i.ret)}{pure})"
        return f"<{type(i).__name__}>"

    def _tensor_info(self, i: TensorInfo) -> str:
        if i.shape is not None:
            dtype = "" if i.dtype is None else f", {quote(i.dtype)}"
            return f"Tensor({self.dims(i.shape)}{dtype})"
        parts = []
        if i.ndim != -1:
            parts.append(f"ndim={i.ndim}")
        if i.dtype is not None:
            parts.append(f"dtype={quote(i.dtype)}")
        return f"Tensor({', '.join(parts)})"

    # -- attributes -----------------------------------------------------------------------

    def attr_value(self, v: Any) -> str:
        if isinstance(v, np.generic):
            v = v.item()
        if v is None or isinstance(v, bool):
            return str(v)
        if isinstance(v, int):
            return str(int(v))
        if isinstance(v, float):
            return float_str(v)
        if isinstance(v, str):
            return quote(v)
        if isinstance(v, SymExpr):
            return self.dim(v)
        if isinstance(v, (tuple, list)):
            return "[" + ", ".join(self.attr_value(x) for x in v) + "]"
        if isinstance(v, Mapping):
            return self.attrs_dict(v)
        if isinstance(v, StructInfo):
            return self.info(v)
        return f"<{type(v).__name__} {v!r}>"

    def attrs_dict(self, attrs: Mapping[str, Any]) -> str:
        items = ", ".join(f"{quote(str(k))}: {self.attr_value(v)}" for k, v in attrs.items())
        return "{" + items + "}"
