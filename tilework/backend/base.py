"""The backend registration interface.

A ``Backend`` states what it can run and how:

- ``kind``: ``"library"`` (an op-level library: each match becomes one library call) or
  ``"region"`` (a graph-level compiler: adjacent matched ops of the backend merge into one
  region, compiled as a whole);
- ``available()``: ``(True, how)`` or ``(False, why not)``, e.g. ``(False, "torch is not
  installed")``; asked once per process;
- ``capabilities``: ``Capability(name, pattern, predicate)``: a graph pattern
  (``tilework.pattern``) and a predicate over the ``PatternMatch`` (the matched calls' struct
  info: dtypes, ranks, static or symbolic dims; their attrs; the captures). Order matters:
  earlier capabilities claim bindings first, so composites come before their parts;
- ``compile(funcs, target)``: for a backend whose regions become loop-level kernels (the
  ``codegen`` backend), the ``KernelModule`` that ``target`` (``tilework.codegen.Target``)
  makes of them;
- ``lower(region)``: the value that replaces a region, normally
  ``call_lib(extern, args, out_info)`` of a function registered with
  ``tilework.runtime.extern.register_extern`` (destination-passing: the VM allocates the
  outputs and appends them to the arguments). ``lower=None`` leaves the ops where they are for
  ``Legalize`` (tilework's own kernels: the ``codegen`` backend).

``register_backend(backend)`` is the one call that makes a backend usable by name in
``tilework.build(mod, backends=[...])``, the CLI's ``--backends`` and, later, the placement
search.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from tilework.errors import UnsupportedError
from tilework.ir.graph import Binding, Call, Expr, MatchCast, ShapeExpr, Var
from tilework.ir.info import StructInfo, TensorInfo
from tilework.ir import info as I
from tilework.ir.loop import TensorFunc
from tilework.ir.sym import Dim, SymVar
from tilework.op.calls import call_lib
from tilework.pattern.core import Pattern
from tilework.pattern.graph import PatternMatch, out_info
from tilework.runtime.kernels import KernelModule

KINDS = ("library", "region")

Predicate = Callable[[PatternMatch], bool]


@dataclass(frozen=True)
class Capability:
    """``pattern`` plus ``predicate``: what one backend entry point can run."""

    name: str
    pattern: Pattern
    predicate: Predicate | None = field(default=None, compare=False)

    def accepts(self, m: PatternMatch) -> bool:
        return self.predicate is None or bool(self.predicate(m))


@dataclass(frozen=True)
class Region:
    """What a lowering receives: the bindings of one block taken together (program order),
    the vars and constants they read from outside (``inputs``) and the vars read outside them
    (``outputs``: the replacement provides these, one value or a tuple in this order). For a
    library backend, ``capability`` and ``match`` (with its captures) say what matched."""

    backend: str
    capability: str | None
    func_name: str
    bindings: tuple[Binding | MatchCast, ...]
    inputs: tuple[Expr, ...]
    outputs: tuple[Var, ...]
    match: PatternMatch | None = None

    @property
    def calls(self) -> tuple[Call, ...]:
        return tuple(b.value for b in self.bindings if isinstance(b.value, Call))

    @property
    def out_info(self) -> StructInfo:
        return out_info(self.outputs)

    def sym_vars(self) -> tuple[SymVar, ...]:
        """The sym vars the region's values mention (inputs, outputs and inside), in
        first-occurrence order: the dims a region compiled once must receive at run time."""
        seen: dict[SymVar, None] = {}
        for e in (*self.inputs, *(b.var for b in self.bindings)):
            for v in I.free_vars(e.info):
                seen[v] = None
        return tuple(seen)

    def __getitem__(self, name: str) -> Expr:
        if self.match is None:
            raise KeyError(f"region of {self.backend} has no captures")
        return self.match[name]


Lowering = Callable[[Region], Expr]


@dataclass(frozen=True)
class Backend:
    """See the module docstring. ``max_region_size`` bounds a region backend's regions (in
    bindings)."""

    name: str
    kind: str
    available: Callable[[], tuple[bool, str]] = field(compare=False)
    capabilities: Sequence[Capability] = ()
    lower: Lowering | None = field(default=None, compare=False)
    compile: Callable[[Mapping[str, TensorFunc], str], KernelModule] | None = field(default=None, compare=False)
    max_region_size: int = 256
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "capabilities", tuple(self.capabilities))
        if self.kind not in KINDS:
            raise UnsupportedError(f"backend {self.name}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        names = [c.name for c in self.capabilities]
        if len(set(names)) != len(names):
            raise UnsupportedError(f"backend {self.name}: capability names must be unique, got {names}")
        if self.kind == "region" and self.lower is None:
            raise UnsupportedError(f"backend {self.name}: a region backend needs a lowering")
        if self.max_region_size < 1:
            raise UnsupportedError(f"backend {self.name}: max_region_size must be at least 1")

    def capability(self, name: str) -> Capability:
        for c in self.capabilities:
            if c.name == name:
                return c
        raise KeyError(f"backend {self.name} has no capability {name!r} (it has: {', '.join(c.name for c in self.capabilities)})")


# -- the registry -------------------------------------------------------------------------

_BACKENDS: dict[str, Backend] = {}
_AVAILABLE: dict[str, tuple[bool, str]] = {}


def register_backend(backend: Backend, *, replace: bool = False) -> Backend:
    """Make ``backend`` usable by name; registering a name twice needs ``replace=True``."""
    if backend.name in _BACKENDS and not replace:
        raise UnsupportedError(f"backend {backend.name!r} is registered already (pass replace=True to replace it)")
    _BACKENDS[backend.name] = backend
    _AVAILABLE.pop(backend.name, None)
    return backend


def unregister_backend(name: str) -> None:
    _BACKENDS.pop(name, None)
    _AVAILABLE.pop(name, None)


def get_backend(name: str) -> Backend:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise UnsupportedError(f"unknown backend {name!r}; registered: {', '.join(_BACKENDS) or 'none'}") from None


def backend_names() -> list[str]:
    return list(_BACKENDS)


def availability(name: str) -> tuple[bool, str]:
    """``available()`` of backend ``name``, asked once per process; an ``available`` that
    raises counts as unavailable, with the error as the reason."""
    if name not in _AVAILABLE:
        backend = get_backend(name)
        try:
            ok, reason = backend.available()
        except Exception as e:  # noqa: BLE001 - a broken probe makes the backend unavailable
            ok, reason = False, f"available() raised {type(e).__name__}: {e}"
        _AVAILABLE[name] = (bool(ok), str(reason))
    return _AVAILABLE[name]


def check_names(spec: object, names: Sequence[str], what: str = "backends", example: str = "'blas,codegen'") -> None:
    """A list of backends names one at least, no empty name and none twice (``what`` and
    ``example`` say it as the caller's user wrote it: ``--backends`` on the command line)."""
    if not any(names):
        raise UnsupportedError(f"{what} {spec!r} names no backend; give names in priority order, e.g. {example}")
    if not all(names):
        raise UnsupportedError(f"{what} {spec!r} has an empty name; separate names by single commas, e.g. {example}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UnsupportedError(f"{what} {spec!r} names {', '.join(twice)} more than once")


def resolve_backends(spec: str | Sequence[str | Backend]) -> list[Backend]:
    """Backends by name in priority order (``"blas,torch,codegen"`` or a list of names and
    ``Backend`` objects; an object is registered when its name is new). An unknown or
    unavailable backend is an error naming the reason, and so are a spec naming none (``""``,
    ``",,"``, ``[]``), an empty name and a name given twice."""
    items: Sequence[str | Backend] = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    check_names(spec, [item.name if isinstance(item, Backend) else item for item in items])
    out: list[Backend] = []
    for item in items:
        if isinstance(item, Backend):
            if item.name not in _BACKENDS:
                register_backend(item)
            backend = item
        else:
            backend = get_backend(item)
        ok, reason = availability(backend.name)
        if not ok:
            raise UnsupportedError(f"backend {backend.name} is not available here: {reason}")
        if backend.name not in (b.name for b in out):
            out.append(backend)
    return out


# -- helpers for lowerings ------------------------------------------------------------------


def lib_call(symbol: str, args: Sequence[Expr], region: Region, dims: Sequence[Dim] | None = None) -> Call:
    """``call_lib(symbol, (*args[, shape(dims)]), out=region's outputs)``: the extern receives
    the arguments, then the dims as a tuple of ints computed at run time (when given), then
    the output buffers."""
    call_args = list(args)
    if dims is not None:
        call_args.append(ShapeExpr.of(tuple(dims)))
    return call_lib(symbol, call_args, region.out_info)




# -- helpers for predicates -----------------------------------------------------------------


def tensor_values(m: PatternMatch) -> list[Expr]:
    """The tensor-typed arguments and results of the matched calls."""
    out: list[Expr] = []
    for call in m.calls:
        out.extend(a for a in call.args if isinstance(a.info, TensorInfo))
        if isinstance(call.info, TensorInfo):
            out.append(call)
    return out


def same_dtype_in(m: PatternMatch, dtypes: Sequence[str]) -> bool:
    """Every tensor the matched calls read or produce has one dtype, one of ``dtypes``, and a
    known shape (symbolic dims allowed)."""
    infos = [e.info for e in tensor_values(m)]
    if not infos:
        return False
    first = infos[0]
    assert isinstance(first, TensorInfo)
    return first.dtype in dtypes and all(isinstance(i, TensorInfo) and i.dtype == first.dtype and i.shape is not None for i in infos)


def shape_of(e: Expr) -> tuple[Dim, ...]:
    """The (known) shape of a tensor expression; lowerings call it after their predicates
    checked that shapes are known."""
    info = e.info
    if not isinstance(info, TensorInfo) or info.shape is None:
        raise UnsupportedError(f"{e!r} has no known shape ({info})")
    return info.shape


__all__ = [
    "KINDS",
    "Backend",
    "Capability",
    "Region",
    "Lowering",
    "Predicate",
    "register_backend",
    "unregister_backend",
    "get_backend",
    "backend_names",
    "availability",
    "resolve_backends",
    "check_names",
    "lib_call",
    "tensor_values",
    "same_dtype_in",
    "shape_of",
]
