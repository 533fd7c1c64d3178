"""Passes and pipelines.

A pass is a named, pure ``IRModule -> IRModule`` function object whose fields are its options.
A ``Pipeline`` runs passes in order; with ``verify=True`` it runs the well-formedness verifier
after each pass (the tests always do), and with ``dump_dir`` it writes the IR after each pass
as ``NN-passname.tw.txt``.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

from tilework.errors import WellFormedError
from tilework.ir.module import IRModule


class Pass(abc.ABC):
    """Base of module passes. Subclasses are frozen dataclasses; ``name`` names them in dumps."""

    name: str = "pass"

    def __call__(self, mod: IRModule) -> IRModule:
        return self.run(mod)

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

    def run(self, mod: IRModule) -> IRModule:
        verify_env = os.environ.get("TILEWORK_VERIFY_PASSES") == "1"
        if self.dump_dir:
            os.makedirs(self.dump_dir, exist_ok=True)
        for i, p in enumerate(self.passes):
            mod = p(mod)
            if self.verify or verify_env:
                from tilework.ir.verify import verify

                try:
                    verify(mod)
                except WellFormedError as e:
                    raise WellFormedError(f"after pass {p.name!r}:\n{e}") from None
            if self.dump_dir:
                path = os.path.join(self.dump_dir, f"{i:02d}-{p.name}.tw.txt")
                with open(path, "w") as fh:
                    fh.write(str(mod))
            if self.on_pass is not None:
                self.on_pass(p.name, mod)
        return mod
