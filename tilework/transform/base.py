"""Passes and pipelines.

A pass is a named, pure ``IRModule -> IRModule`` function object whose fields are its options.
Calling a pass runs it and, when verification is on, the well-formedness verifier on its
result (``set_verify_passes(True)``: the test suite turns it on for every pass, called directly
or in a pipeline; ``TILEWORK_VERIFY_PASSES=1`` turns it on from the environment). A
``Pipeline`` runs passes in order; ``verify=True`` verifies after each whatever the global
setting (within a run, what one pass's check found well-formed and the next pass left as it
was is not walked again: ``tilework.ir.verify.Checked``), ``dump_dir`` writes the IR after
each pass as ``NN-passname.tw.txt``. The named pipelines are in ``tilework.transform.pipeline``.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

from tilework.errors import WellFormedError
from tilework.ir.module import IRModule
from tilework.ir.verify import Checked, verify

_VERIFY = False


def set_verify_passes(on: bool) -> None:
    """Verify the result of every pass from now on (``True``) or only where asked."""
    global _VERIFY
    _VERIFY = on


def verify_passes() -> bool:
    return _VERIFY or os.environ.get("TILEWORK_VERIFY_PASSES") == "1"


def _verify_after(p: "Pass", mod: IRModule, checked: Checked | None = None) -> None:
    try:
        verify(mod, checked)
    except WellFormedError as e:
        raise WellFormedError(f"after pass {p.name!r}:\n{e}") from None


class Pass(abc.ABC):
    """Base of module passes. Subclasses are frozen dataclasses; ``name`` names them in dumps."""

    name: str = "pass"

    def __call__(self, mod: IRModule) -> IRModule:
        out = self.run(mod)
        if verify_passes():
            _verify_after(self, out)
        return out

    @abc.abstractmethod
    def run(self, mod: IRModule) -> IRModule:
        """The transformed module; ``mod`` itself is never changed."""


@dataclass(frozen=True)
class FunctionPass(Pass):
    """A pass made from a plain function (for small passes and tests)."""

    fn: Callable[[IRModule], IRModule]
    name: str = "function_pass"

    def run(self, mod: IRModule) -> IRModule:
        return self.fn(mod)


@dataclass(frozen=True)
class Pipeline(Pass):
    passes: Sequence[Pass] = ()
    name: str = "pipeline"
    verify: bool = False
    dump_dir: str | None = None
    on_pass: Callable[[str, IRModule], None] | None = field(default=None, compare=False)

    def __call__(self, mod: IRModule) -> IRModule:
        return self.run(mod)  # each pass is verified as it runs; the result needs no second look

    def run(self, mod: IRModule) -> IRModule:
        if self.dump_dir:
            os.makedirs(self.dump_dir, exist_ok=True)
        checked = Checked()  # what one pass's check found well-formed is not walked again after the next
        for i, p in enumerate(self.passes):
            mod = p.run(mod)
            if self.verify or verify_passes():
                _verify_after(p, mod, checked)
            if self.dump_dir:
                path = os.path.join(self.dump_dir, f"{i:02d}-{p.name}.tw.txt")
                with open(path, "w") as fh:
                    fh.write(str(mod))
            if self.on_pass is not None:
                self.on_pass(p.name, mod)
        return mod


__all__ = ["Pass", "FunctionPass", "Pipeline", "set_verify_passes", "verify_passes"]
