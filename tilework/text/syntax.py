"""Pieces of the text format shared by the printer and the parser: reserved words, literals,
and the naming rule that keeps printed names unique and parseable."""

from __future__ import annotations

import json
import keyword
import math
import re
from typing import Hashable

import numpy as np

from tilework.ir.dtype import DTYPES, SUBBYTE_INT_DTYPES, np_dtype

# Names with a meaning of their own in the text: a var, sym var or buffer never takes one.
RESERVED = frozenset(
    set(keyword.kwlist)
    | set(DTYPES)
    | {
        "Any", "Prim", "Shape", "Tensor", "Tuple", "Func", "Buffer", "sym", "const", "prim", "shape",
        "extern", "op", "meta", "match_cast", "output", "dataflow", "bindings", "graph", "tensor",
        "attrs", "range", "serial", "parallel", "vectorized", "unrolled", "loop", "block", "spatial",
        "reduce", "axis", "reads", "writes", "init", "allocate", "cast", "select", "binary",
        "unary", "intrin", "min", "max", "pow", "inf", "nan", "int64",
    }
)  # fmt: skip

# Call forms of graph-level expressions; an op of one of these names prints as ``op("name")``.
GRAPH_FORMS = frozenset({"const", "prim", "shape", "extern", "op", "meta", "match_cast"})

LOOP_KIND_SYNTAX = {"serial": "range", "parallel": "parallel", "vectorized": "vectorized", "unrolled": "unrolled"}
LOOP_SYNTAX_KIND = {"range": "serial", "serial": "serial", "parallel": "parallel", "vectorized": "vectorized", "unrolled": "unrolled"}

INLINE_CONST_LIMIT = 16  # constants with more elements go to the metadata section

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_]")


def quote(s: str) -> str:
    """A double-quoted string literal the lexer reads back to ``s``."""
    return json.dumps(s, ensure_ascii=False)


def float_str(x: float) -> str:
    """Exact text of a float: ``repr`` round-trips every finite double."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


def to_python_list(arr: np.ndarray) -> object:
    """The values of ``arr`` as (nested lists of) Python bools, ints or floats."""
    if arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer):
        return arr.tolist()
    if arr.dtype.name in SUBBYTE_INT_DTYPES:
        return arr.astype(np.int64).tolist()
    return arr.astype(np.float64).tolist()


def array_from_list(values: object, dtype: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """The array of ``dtype`` holding ``values`` (nested lists), reshaped to ``shape`` if given."""
    dt = np_dtype(dtype)
    if dt == np.bool_ or np.issubdtype(dt, np.integer):
        arr = np.array(values, dtype=dt)
    elif dtype in SUBBYTE_INT_DTYPES:
        arr = np.array(values, dtype=np.int64).astype(dt)
    else:
        arr = np.array(values, dtype=np.float64).astype(dt)
    return arr.reshape(shape) if shape is not None else arr


class Namer:
    """Assigns each object (var, sym var, buffer) a unique identifier, deterministically: the
    object's own name when free, else the name with the smallest free ``_k`` suffix."""

    def __init__(self, taken: frozenset[str] | set[str] = frozenset()) -> None:
        self._names: dict[Hashable, str] = {}
        self._used: set[str] = set()
        self._taken = taken

    def __contains__(self, obj: Hashable) -> bool:
        return obj in self._names

    def name(self, obj: Hashable, hint: str) -> str:
        got = self._names.get(obj)
        if got is not None:
            return got
        base = _BAD_CHARS.sub("_", hint) or "v"
        if base[0].isdigit():
            base = "v" + base
        candidate = base
        k = 1
        while candidate in self._used or candidate in RESERVED or candidate in self._taken:
            candidate = f"{base}_{k}"
            k += 1
        self._used.add(candidate)
        self._names[obj] = candidate
        return candidate
