"""Input specs: the shapes and dtypes a module's methods are exported for.

    spec = {"forward": {"x": nn.spec.Tensor(["batch", "seq", 64], "float32")}}
    spec = {"x": nn.spec.Tensor(["batch", "seq", 64])}       # the same: forward's arguments

A dim is an int, a name or a ``SymVar``. A name becomes one ``SymVar`` per exported method,
shared by every input of that method that uses the name (so ``x: [n, 4]`` and ``y: [n]`` must
agree on ``n`` at run time); it is ``>= 1`` unless ``dim_bounds`` says otherwise:
``{"seq": 4096}`` bounds it above, ``{"seq": (1, 4096)}`` on both sides (None leaves a side
open). A ``SymVar`` in a spec is used as it is, with its own bounds.

Every argument of the method without a default needs a spec; an argument with a default may be
left out (the method then runs with its default).
"""

from __future__ import annotations

import inspect
import keyword
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, Union

from tilework.errors import SpecError
from tilework.ir.graph import Var
from tilework.ir.dtype import DTYPES
from tilework.ir.info import TensorInfo
from tilework.ir.sym import Dim, SymVar

SpecDim = Union[int, str, SymVar]
DimBounds = Mapping[str, Union[int, tuple[Union[int, None], Union[int, None]], None]]


class Tensor:
    """A tensor input: ``shape`` (ints, names, SymVars) and ``dtype``."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Sequence[SpecDim], dtype: str = "float32") -> None:
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise SpecError(f"spec.Tensor shape must be a list of dims, got {shape!r}")
        for d in shape:
            _check_dim(d)
        if dtype not in DTYPES:
            raise SpecError(f"spec.Tensor: unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        self.shape: tuple[SpecDim, ...] = tuple(shape)
        self.dtype = dtype

    def __repr__(self) -> str:
        dims = ", ".join(repr(d) if isinstance(d, str) else str(d) for d in self.shape)
        return f"spec.Tensor([{dims}], {self.dtype!r})"


MethodSpec = Mapping[str, Tensor]
Spec = Union[Mapping[str, MethodSpec], MethodSpec]


def _check_dim(d: object) -> None:
    if isinstance(d, SymVar):
        return
    if isinstance(d, bool) or not isinstance(d, (int, str)):
        raise SpecError(f"spec dims are ints, names or SymVars, got {d!r}")
    if isinstance(d, int) and d < 0:
        raise SpecError(f"spec dim {d} is negative")
    if isinstance(d, str) and (not d.isidentifier() or keyword.iskeyword(d)):
        raise SpecError(f"spec dim name {d!r} is not a Python identifier")


def normalize(spec: object) -> dict[str, dict[str, Tensor]]:
    """``{method: {argument: spec.Tensor}}`` from either accepted form."""
    if not isinstance(spec, Mapping) or not spec:
        raise SpecError(f"a spec is a non-empty dict: {{'forward': {{'x': nn.spec.Tensor([...])}}}} or {{'x': nn.spec.Tensor([...])}}; got {spec!r}")
    if all(isinstance(v, Tensor) for v in spec.values()):
        return {"forward": dict(spec)}
    out: dict[str, dict[str, Tensor]] = {}
    for method, args in spec.items():
        if not isinstance(args, Mapping):
            raise SpecError(f"spec for {method!r}: expected a dict of argument specs, got {args!r}")
        for name, s in args.items():
            if not isinstance(s, Tensor):
                raise SpecError(f"spec for {method}({name}): expected nn.spec.Tensor, got {s!r}")
        out[str(method)] = dict(args)
    return out


def normalize_bounds(dim_bounds: DimBounds | None) -> dict[str, tuple[int, int | None]]:
    """``{name: (lo, hi)}`` with the defaults filled in (lo 1, hi unbounded)."""
    out: dict[str, tuple[int, int | None]] = {}
    for name, b in (dim_bounds or {}).items():
        lo: int | None
        hi: int | None
        if b is None or isinstance(b, int):
            lo, hi = None, b
        elif isinstance(b, (tuple, list)) and len(b) == 2:
            lo, hi = b
        else:
            raise SpecError(f"dim_bounds[{name!r}] must be an upper bound or a (lo, hi) pair, got {b!r}")
        for v in (lo, hi):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise SpecError(f"dim_bounds[{name!r}]: bounds are ints or None, got {b!r}")
        lo = 1 if lo is None else lo
        if lo < 0 or (hi is not None and hi < lo):
            raise SpecError(f"dim_bounds[{name!r}] = {b!r} is an empty or negative range")
        out[name] = (lo, hi)
    return out


@dataclass
class MethodInputs:
    """The graph params of one method's inputs, the argument names in call order, which of them
    are positional-only, and where each sym var first appears (``x.shape[1]``)."""

    params: list[Var]
    names: list[str]
    positional: list[bool]
    dims: dict[SymVar, str]


def method_inputs(owner: str, method: Callable[..., Any], method_name: str, args: Mapping[str, Tensor], bounds: Mapping[str, tuple[int, int | None]]) -> MethodInputs:
    """Graph params for ``method``'s arguments per ``args`` (checked against its signature)."""
    sig = inspect.signature(method)
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    accepted = [p for p in sig.parameters.values() if p.kind in kinds]
    names = [p.name for p in accepted]
    where = f"{owner}.{method_name}"
    unknown = [a for a in args if a not in names]
    if unknown:
        raise SpecError(f"spec for {where}: unknown argument(s) {', '.join(unknown)}; it takes ({', '.join(names)})")
    missing = [p.name for p in accepted if p.default is inspect.Parameter.empty and p.name not in args]
    if missing:
        raise SpecError(f"spec for {where}: no spec for argument(s) {', '.join(missing)}")
    syms: dict[str, SymVar] = {}
    given: set[str] = set()
    dims: dict[SymVar, str] = {}
    params: list[Var] = []
    order = [p for p in accepted if p.name in args]
    for p in order:
        s = args[p.name]
        shape: list[Dim] = []
        for axis, d in enumerate(s.shape):
            v = _resolve(d, syms, given, bounds, where)
            if isinstance(v, SymVar):
                dims.setdefault(v, f"{p.name}.shape[{axis}]")
            shape.append(v)
        params.append(Var(p.name, TensorInfo(tuple(shape), s.dtype)))
    positional = [p.kind is inspect.Parameter.POSITIONAL_ONLY for p in order]
    return MethodInputs(params, [p.name for p in order], positional, dims)


def _resolve(d: SpecDim, syms: dict[str, SymVar], given: set[str], bounds: Mapping[str, tuple[int, int | None]], where: str) -> Dim:
    """A spec dim as a dim: names are looked up in (or added to) ``syms``; ``given`` holds the
    names that came as SymVars, which a plain name may not reuse."""
    if isinstance(d, int):
        return d
    name = d.name if isinstance(d, SymVar) else d
    known = syms.get(name)
    if isinstance(d, SymVar):
        if known is not None and known is not d:
            raise SpecError(f"spec for {where}: dim {name!r} is both a name and a SymVar (or two SymVars); use one")
        if name in bounds:
            raise SpecError(f"spec for {where}: dim {name!r} is a SymVar with its own bounds; dim_bounds cannot change them")
        syms[name] = d
        given.add(name)
        return d
    if name in given:
        raise SpecError(f"spec for {where}: dim {name!r} is both a name and a SymVar (or two SymVars); use one")
    if known is None:
        lo, hi = bounds.get(name, (1, None))
        known = syms[name] = SymVar(name, lo, hi)
    return known


def used_dim_names(spec: Mapping[str, Mapping[str, Tensor]]) -> set[str]:
    return {d if isinstance(d, str) else d.name for args in spec.values() for s in args.values() for d in s.shape if not isinstance(d, int)}


__all__ = ["Tensor", "Spec", "MethodSpec", "DimBounds", "normalize", "normalize_bounds", "method_inputs", "MethodInputs", "used_dim_names"]
