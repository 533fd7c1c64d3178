"""Struct info: the static facts the compiler knows about a value.

A lattice with ``AnyInfo`` at the top. Unknown parts are allowed (a tensor of unknown rank or
dtype): the compiler never claims what it cannot prove, it erases. Facts are checked at run time
at function boundaries and ``match_cast``, and assumed inside a function body.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping, Union

from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.dtype import DTYPES
from tilework.ir.sym import Dim, SymVar



def check_dtype(dtype: str) -> str:
    from tilework.errors import InferenceError

    if dtype not in DTYPES:
        raise InferenceError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return dtype


@dataclass(frozen=True, slots=True)
class StructInfo:
    """Base of struct info. Instances are immutable and compare structurally."""

    def replace(self, **changes: object) -> "StructInfo":
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class AnyInfo(StructInfo):
    """Nothing known: the top of the lattice."""


@dataclass(frozen=True, slots=True)
class PrimInfo(StructInfo):
    """A scalar of ``dtype``; ``value`` is its symbolic value when known (a shape-level int)."""

    dtype: str | None = "int64"
    value: Dim | None = None


@dataclass(frozen=True, slots=True)
class ShapeInfo(StructInfo):
    """A shape value: ``values`` when known, else only its rank ``ndim`` (-1: unknown)."""

    values: tuple[Dim, ...] | None = None
    ndim: int = -1

    def __post_init__(self) -> None:
        if self.values is not None and self.ndim != len(self.values):
            object.__setattr__(self, "ndim", len(self.values))


@dataclass(frozen=True, slots=True)
class TensorInfo(StructInfo):
    """A tensor; ``shape`` None means only ``ndim`` is known (-1: unknown); dtype None: unknown."""

    shape: tuple[Dim, ...] | None = None
    dtype: str | None = None
    ndim: int = -1

    def __post_init__(self) -> None:
        if self.shape is not None and self.ndim != len(self.shape):
            object.__setattr__(self, "ndim", len(self.shape))


@dataclass(frozen=True, slots=True)
class TupleInfo(StructInfo):
    fields: tuple[StructInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class FuncInfo(StructInfo):
    """A function; ``params`` None means the signature is opaque (any arguments)."""

    params: tuple[StructInfo, ...] | None = None
    ret: StructInfo = AnyInfo()
    pure: bool = True


Info = Union[AnyInfo, PrimInfo, ShapeInfo, TensorInfo, TupleInfo, FuncInfo]


def tensor(shape: Iterable[Dim] | None, dtype: str | None = "float32", ndim: int = -1) -> TensorInfo:
    return TensorInfo(None if shape is None else tuple(shape), dtype, ndim)


# -- the base check -----------------------------------------------------------------------


class Check(enum.Enum):
    """Outcome of asking whether a value with info D always satisfies info B."""

    PASS = "pass"  # proved statically
    RUNTIME = "runtime"  # may hold; needs a run-time check
    FAIL = "fail"  # provably never holds


def _dims_check(base: Dim, derived: Dim) -> Check:
    if sym.prove_eq(base, derived):
        return Check.PASS
    if sym.prove_ne(base, derived):
        return Check.FAIL
    return Check.RUNTIME


def _worst(checks: Iterable[Check]) -> Check:
    out = Check.PASS
    for c in checks:
        if c is Check.FAIL:
            return Check.FAIL
        if c is Check.RUNTIME:
            out = Check.RUNTIME
    return out


def _dtype_check(base: str | None, derived: str | None) -> Check:
    if base is None or base == derived:
        return Check.PASS
    return Check.RUNTIME if derived is None else Check.FAIL


def _ndim_check(base: int, derived: int) -> Check:
    if base == -1 or base == derived:
        return Check.PASS
    return Check.RUNTIME if derived == -1 else Check.FAIL


def base_check(base: StructInfo, derived: StructInfo) -> Check:
    """Whether every value described by ``derived`` is described by ``base``."""
    if isinstance(base, AnyInfo):
        return Check.PASS
    if isinstance(derived, AnyInfo):
        return Check.RUNTIME
    if type(base) is not type(derived):
        return Check.FAIL
    if isinstance(base, TensorInfo):
        assert isinstance(derived, TensorInfo)
        checks = [_dtype_check(base.dtype, derived.dtype), _ndim_check(base.ndim, derived.ndim)]
        if base.shape is not None:
            if derived.shape is None:
                checks.append(Check.RUNTIME)
            elif len(base.shape) == len(derived.shape):
                checks.extend(_dims_check(b, d) for b, d in zip(base.shape, derived.shape))
        return _worst(checks)
    if isinstance(base, ShapeInfo):
        assert isinstance(derived, ShapeInfo)
        checks = [_ndim_check(base.ndim, derived.ndim)]
        if base.values is not None:
            if derived.values is None:
                checks.append(Check.RUNTIME)
            elif len(base.values) == len(derived.values):
                checks.extend(_dims_check(b, d) for b, d in zip(base.values, derived.values))
        return _worst(checks)
    if isinstance(base, PrimInfo):
        assert isinstance(derived, PrimInfo)
        checks = [_dtype_check(base.dtype, derived.dtype)]
        if base.value is not None:
            checks.append(Check.RUNTIME if derived.value is None else _dims_check(base.value, derived.value))
        return _worst(checks)
    if isinstance(base, TupleInfo):
        assert isinstance(derived, TupleInfo)
        if len(base.fields) != len(derived.fields):
            return Check.FAIL
        return _worst(base_check(b, d) for b, d in zip(base.fields, derived.fields))
    if isinstance(base, FuncInfo):
        assert isinstance(derived, FuncInfo)
        if base.pure and not derived.pure:
            return Check.FAIL
        checks = [base_check(base.ret, derived.ret)]
        if base.params is not None:
            if derived.params is None:
                checks.append(Check.RUNTIME)
            elif len(base.params) != len(derived.params):
                return Check.FAIL
            else:  # params are contravariant
                checks.extend(base_check(d, b) for b, d in zip(base.params, derived.params))
        return _worst(checks)
    return Check.FAIL


def is_base_of(base: StructInfo, derived: StructInfo) -> bool:
    """True when ``base`` statically covers ``derived``."""
    return base_check(base, derived) is Check.PASS


# -- least common ancestor ----------------------------------------------------------------


def lca(a: StructInfo, b: StructInfo) -> StructInfo:
    """The most precise info that covers both ``a`` and ``b`` (used to join If branches)."""
    if a == b:
        return a
    if type(a) is not type(b) or isinstance(a, AnyInfo):
        return AnyInfo()
    if isinstance(a, TensorInfo):
        assert isinstance(b, TensorInfo)
        dtype = a.dtype if a.dtype == b.dtype else None
        ndim = a.ndim if a.ndim == b.ndim else -1
        shape = None
        if a.shape is not None and b.shape is not None and ndim != -1:
            if all(sym.prove_eq(x, y) for x, y in zip(a.shape, b.shape)):
                shape = a.shape
        return TensorInfo(shape, dtype, ndim)
    if isinstance(a, ShapeInfo):
        assert isinstance(b, ShapeInfo)
        ndim = a.ndim if a.ndim == b.ndim else -1
        values = None
        if a.values is not None and b.values is not None and ndim != -1:
            if all(sym.prove_eq(x, y) for x, y in zip(a.values, b.values)):
                values = a.values
        return ShapeInfo(values, ndim)
    if isinstance(a, PrimInfo):
        assert isinstance(b, PrimInfo)
        dtype = a.dtype if a.dtype == b.dtype else None
        value = a.value if a.value is not None and b.value is not None and sym.prove_eq(a.value, b.value) else None
        return PrimInfo(dtype, value)
    if isinstance(a, TupleInfo):
        assert isinstance(b, TupleInfo)
        if len(a.fields) != len(b.fields):
            return AnyInfo()
        return TupleInfo(tuple(lca(x, y) for x, y in zip(a.fields, b.fields)))
    if isinstance(a, FuncInfo):
        assert isinstance(b, FuncInfo)
        params = a.params if a.params == b.params else None
        return FuncInfo(params, lca(a.ret, b.ret), a.pure and b.pure)
    return AnyInfo()


# -- traversal of the dims inside an info -------------------------------------------------


def map_dims(info: StructInfo, f: Callable[[Dim], Dim | None]) -> StructInfo:
    """Rebuild ``info`` with ``f`` applied to every dim. ``f`` returning None erases the
    enclosing shape (keeping the rank) or prim value: the result stays true, only less precise."""

    def dims(values: tuple[Dim, ...] | None) -> tuple[Dim, ...] | None:
        if values is None:
            return None
        out = []
        for d in values:
            r = f(d)
            if r is None:
                return None
            out.append(r)
        return tuple(out)

    if isinstance(info, TensorInfo):
        shape = dims(info.shape)
        return info if shape == info.shape else TensorInfo(shape, info.dtype, info.ndim)
    if isinstance(info, ShapeInfo):
        values = dims(info.values)
        return info if values == info.values else ShapeInfo(values, info.ndim)
    if isinstance(info, PrimInfo):
        if info.value is None:
            return info
        return PrimInfo(info.dtype, f(info.value))
    if isinstance(info, TupleInfo):
        return TupleInfo(tuple(map_dims(x, f) for x in info.fields))
    if isinstance(info, FuncInfo):
        params = None if info.params is None else tuple(map_dims(x, f) for x in info.params)
        return FuncInfo(params, map_dims(info.ret, f), info.pure)
    return info


def substitute(info: StructInfo, mapping: Mapping[SymVar, Dim]) -> StructInfo:
    if not mapping:
        return info
    return map_dims(info, lambda d: sym_walk.substitute(d, mapping))


def free_vars(info: StructInfo) -> tuple[SymVar, ...]:
    """Sym vars used in ``info`` in first-occurrence order."""
    out: dict[SymVar, None] = {}

    def visit(d: Dim) -> Dim:
        for v in sym_walk.free_vars(d):
            out[v] = None
        return d

    map_dims(info, visit)
    return tuple(out)


def erase(info: StructInfo, in_scope: Callable[[SymVar], bool]) -> StructInfo:
    """Drop every fact that mentions a sym var out of scope (keeping rank and dtype)."""

    def keep(d: Dim) -> Dim | None:
        return d if all(in_scope(v) for v in sym_walk.free_vars(d)) else None

    return map_dims(info, keep)


def defined_vars(info: StructInfo) -> tuple[SymVar, ...]:
    """Sym vars that matching a value against ``info`` binds: those appearing bare as a dim."""
    out: dict[SymVar, None] = {}

    def visit(d: Dim) -> Dim:
        if isinstance(d, SymVar):
            out[d] = None
        return d

    map_dims(info, visit)
    return tuple(out)


def shape_str(shape: tuple[Dim, ...] | None) -> str:
    if shape is None:
        return "?"
    return "(" + ", ".join(sym.to_str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
