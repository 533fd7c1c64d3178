"""Kernel modules: the compiled form of a module's TensorFuncs for one target.

A ``KernelModule`` is what a target (``tilework.codegen``) makes of a set of loop-level
functions: the target's name, a function table (``KernelInfo``: each kernel's name, exported
symbol and argument ABI), the generated ``source()`` and the native payload ``to_bytes()``. Its
kernels are called as ``module[name](arrays, sym_values)``: the buffers (inputs, then outputs,
written in place) as C-contiguous NumPy arrays and the kernel sym var values in ABI order
(``tilework.ir.loop.kernel_syms``).

The runtime does not know how any target builds or loads code. Targets register a
``KernelLoader`` here under their name; an executable names the target of each module it holds
and the loader turns the stored loop IR back into a module (``build``: through the target's
own compiler and cache, running nothing from the file) or, only when the user opts in, the
stored native bytes (``from_native``).
"""

from __future__ import annotations

import abc
import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from tilework.errors import TileworkError
from tilework.ir.loop import TensorFunc, kernel_syms
from tilework.ir.module import IRModule
from tilework.text import print_module

KernelCall = Callable[[Sequence[np.ndarray], Sequence[int]], None]


@dataclass(frozen=True)
class KernelInfo:
    """One entry of a module's function table: the kernel's ABI."""

    name: str
    symbol: str
    buffers: tuple[str, ...]  # buffer names, inputs then outputs
    dtypes: tuple[str, ...]
    num_outputs: int
    syms: tuple[str, ...]  # kernel sym var names, ABI order

    @staticmethod
    def of(name: str, symbol: str, func: TensorFunc) -> "KernelInfo":
        bufs = func.buffers
        return KernelInfo(
            name,
            symbol,
            tuple(b.name for b in bufs),
            tuple(b.dtype for b in bufs),
            func.num_outputs,
            tuple(v.name for v in kernel_syms(func)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "symbol": self.symbol,
            "buffers": list(self.buffers),
            "dtypes": list(self.dtypes),
            "num_outputs": self.num_outputs,
            "syms": list(self.syms),
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "KernelInfo":
        try:
            info = KernelInfo(
                str(d["name"]),
                str(d["symbol"]),
                tuple(str(b) for b in d["buffers"]),
                tuple(str(t) for t in d["dtypes"]),
                int(d["num_outputs"]),
                tuple(str(s) for s in d["syms"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TileworkError(f"malformed kernel function table entry {d!r}: {e}") from None
        if len(info.dtypes) != len(info.buffers) or not 0 <= info.num_outputs <= len(info.buffers):
            raise TileworkError(f"malformed kernel function table entry for {info.name!r}")
        return info


class KernelModule(abc.ABC):
    """Compiled kernels of one target; see the module docstring."""

    target: str

    @property
    @abc.abstractmethod
    def functions(self) -> Mapping[str, KernelInfo]:
        """The function table, by kernel name."""

    @abc.abstractmethod
    def __getitem__(self, name: str) -> KernelCall:
        """The callable kernel ``name``: ``kernel(arrays, sym_values)``."""

    @abc.abstractmethod
    def source(self) -> str:
        """The generated code (C for the CPU target, Python for the interpreter)."""

    @abc.abstractmethod
    def to_bytes(self) -> bytes:
        """The native payload (a shared object for the CPU target); with the function table it
        recreates the module through the target's loader (``KernelLoader.from_native``)."""

    def __contains__(self, name: object) -> bool:
        return name in self.functions

    def __iter__(self) -> Iterator[str]:
        return iter(self.functions)

    def __len__(self) -> int:
        return len(self.functions)


def _no_record(ir_digest: str, functions: Mapping[str, KernelInfo]) -> KernelModule | None:
    return None


def _forget(ir_digest: str, module: KernelModule) -> None:
    return None


@dataclass(frozen=True)
class KernelLoader:
    """How the runtime gets a target's module back: ``build(funcs)`` compiles loop IR (through
    the target's cache: a hit costs no compiler run); ``from_native(data, functions, funcs)``
    uses stored native bytes (code from the file: only on explicit opt-in). ``cached(digest,
    functions)`` is the module this machine built earlier from the loop IR text with SHA-256
    ``digest`` (None when there is none), so that a warm load parses nothing;
    ``remember(digest, module)`` records one."""

    target: str
    build: Callable[[Mapping[str, TensorFunc]], KernelModule]
    from_native: Callable[[bytes, Mapping[str, KernelInfo], Mapping[str, TensorFunc]], KernelModule]
    cached: Callable[[str, Mapping[str, KernelInfo]], KernelModule | None] = _no_record
    remember: Callable[[str, KernelModule], None] = _forget


_LOADERS: dict[str, KernelLoader] = {}


def register_kernel_loader(loader: KernelLoader) -> None:
    """Make modules of ``loader.target`` loadable (a target registers itself on import)."""
    _LOADERS[loader.target] = loader


def kernel_loader(target: str) -> KernelLoader:
    loader = _LOADERS.get(target)
    if loader is None:
        known = ", ".join(sorted(_LOADERS)) or "none"
        raise TileworkError(f"no kernel target {target!r} is available here (known: {known})")
    return loader


def kernel_targets() -> list[str]:
    return sorted(_LOADERS)


def loop_ir_text(funcs: Mapping[str, TensorFunc]) -> str:
    """``funcs`` as the text loop IR an executable file stores (empty for none)."""
    return print_module(IRModule(dict(funcs))) if funcs else ""


def loop_ir_digest(text: str) -> str:
    """The SHA-256 of a loop IR text: what a target's records of modules built from it are
    keyed by (``KernelLoader.cached`` / ``remember``)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


__all__ = ["loop_ir_digest", "loop_ir_text", "KernelCall", "KernelInfo", "KernelModule", "KernelLoader", "register_kernel_loader", "kernel_loader", "kernel_targets"]
