"""Targets: how a module's loop-level functions become a ``KernelModule``.

A ``Target`` names a kind of code tilework generates and says how it is made: ``build(funcs)``
compiles TensorFuncs into a ``tilework.runtime.kernels.KernelModule`` (through the target's
own cache), ``load_native(data, functions, funcs)`` loads a module's native bytes (code that
may come from a file: executables use it only on explicit opt-in), ``schedule_rules`` are the
default schedule rules its kernels get (``tilework.schedule.rules``) and ``pipeline`` names the
pass pipeline it compiles with (``tilework.transform.pipeline.PIPELINES``).

``register_target`` makes a target usable by name (``tilework.build(mod, target=...)``) and
registers its loader with the runtime, so executables holding its modules load in any process.
The built-in targets are ``cpu`` (C + OpenMP, ``tilework.codegen.c``) and ``interp`` (the NumPy
reference interpreter, ``tilework.codegen.interp``). A new target (GPU, ahead-of-time C) is a
new file that registers itself.
"""

from __future__ import annotations

import abc
from typing import Any, Mapping, Sequence

from tilework.errors import BuildError
from tilework.ir.loop import TensorFunc
from tilework.runtime.kernels import KernelInfo, KernelLoader, KernelModule, register_kernel_loader


class Target(abc.ABC):
    """See the module docstring."""

    name: str = ""
    description: str = ""
    pipeline: str = "default"

    @property
    def schedule_rules(self) -> Sequence[Any] | None:
        """The default schedule rules (None: the standard ones of ``tilework.schedule``; an
        empty sequence: only the fallback rule)."""
        return None

    def available(self) -> tuple[bool, str]:
        """``(True, how)`` or ``(False, why not)`` on this machine."""
        return True, self.description

    @abc.abstractmethod
    def build(self, funcs: Mapping[str, TensorFunc]) -> KernelModule:
        """Compile every function of ``funcs`` (name -> TensorFunc) into one module."""

    @abc.abstractmethod
    def load_native(self, data: bytes, functions: Mapping[str, KernelInfo], funcs: Mapping[str, TensorFunc]) -> KernelModule:
        """A module from its native bytes (``KernelModule.to_bytes``) and function table."""

    def cached(self, ir_digest: str, functions: Mapping[str, KernelInfo]) -> KernelModule | None:
        """The module built here earlier from the loop IR text whose SHA-256 is ``ir_digest``
        (its function table is ``functions``), or None. Only objects this machine built from
        that text qualify."""
        return None

    def remember(self, ir_digest: str, module: KernelModule) -> None:
        """Record that ``module`` was built from the loop IR text with digest ``ir_digest``."""

    def __repr__(self) -> str:
        return f"Target({self.name})"


_TARGETS: dict[str, Target] = {}


def register_target(target: Target) -> Target:
    """Make ``target`` usable by name and its modules loadable by the runtime."""
    if not target.name:
        raise BuildError("a target needs a name")
    _TARGETS[target.name] = target
    register_kernel_loader(KernelLoader(target.name, target.build, target.load_native, target.cached, target.remember))
    return target


def get_target(name: str) -> Target:
    target = _TARGETS.get(name)
    if target is None:
        raise BuildError(f"unknown target {name!r}; this build supports: {', '.join(sorted(_TARGETS))}")
    return target


def targets() -> list[str]:
    return sorted(_TARGETS)


__all__ = ["Target", "register_target", "get_target", "targets"]
