"""IRModule: global names mapped to graph functions, tensor functions and extern declarations.

A module is immutable; passes return new modules (``with_func``, ``without``). Functions refer
to each other through ``GlobalVar``s whose ``name`` is the key in the module.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Union

from tilework.errors import WellFormedError
from tilework.ir.graph import EMPTY_ATTRS, Attrs, ExternFunc, GlobalVar, GraphFunc
from tilework.ir.info import AnyInfo, FuncInfo, StructInfo
from tilework.ir.loop import TensorFunc
from tilework.ir.display import show_module

Function = Union[GraphFunc, TensorFunc, ExternFunc]


class IRModule(Mapping[str, Function]):
    """An immutable mapping from global names to functions, kept in insertion order."""

    __slots__ = ("_funcs", "attrs")

    def __init__(self, funcs: Mapping[str, Function] | None = None, attrs: Attrs = EMPTY_ATTRS) -> None:
        self._funcs: dict[str, Function] = dict(funcs or {})
        self.attrs = attrs

    def __getitem__(self, name: str) -> Function:
        try:
            return self._funcs[name]
        except KeyError:
            known = ", ".join(self._funcs) or "none"
            raise KeyError(f"no function @{name} in the module (it has: {known})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._funcs)

    def __len__(self) -> int:
        return len(self._funcs)

    def __repr__(self) -> str:
        return show_module(self)

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def with_func(self, name: str, func: Function) -> "IRModule":
        funcs = dict(self._funcs)
        funcs[name] = func
        return IRModule(funcs, self.attrs)

    def without(self, name: str) -> "IRModule":
        funcs = dict(self._funcs)
        funcs.pop(name, None)
        return IRModule(funcs, self.attrs)

    def with_attrs(self, **kw: object) -> "IRModule":
        return IRModule(self._funcs, self.attrs.with_(**kw))

    def graph_funcs(self) -> Iterator[tuple[str, GraphFunc]]:
        for name, f in self._funcs.items():
            if isinstance(f, GraphFunc):
                yield name, f

    def tensor_funcs(self) -> Iterator[tuple[str, TensorFunc]]:
        for name, f in self._funcs.items():
            if isinstance(f, TensorFunc):
                yield name, f

    def graph_func(self, name: str) -> GraphFunc:
        """The graph function ``@name`` (a WellFormedError when it is another kind)."""
        f = self[name]
        if not isinstance(f, GraphFunc):
            raise WellFormedError(f"@{name} is a {type(f).__name__}, not a graph function")
        return f

    def global_var(self, name: str) -> GlobalVar:
        return GlobalVar(name, func_info(self[name]))

    def fresh_name(self, hint: str) -> str:
        """A global name not yet used in the module, derived from ``hint``."""
        if hint not in self._funcs:
            return hint
        i = 1
        while f"{hint}_{i}" in self._funcs:
            i += 1
        return f"{hint}_{i}"


def func_info(f: Function) -> StructInfo:
    """The struct info of a global function; a TensorFunc is opaque (destination-passing)."""
    if isinstance(f, (GraphFunc, ExternFunc)):
        return f.info
    if isinstance(f, TensorFunc):
        return FuncInfo(None, AnyInfo(), pure=True)
    raise WellFormedError(f"not a function: {type(f).__name__}")
