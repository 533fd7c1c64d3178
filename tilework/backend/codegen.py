"""The ``codegen`` backend: tilework's own C kernels, for every op.

It is the fallback: its one capability matches any op call, and its lowering is to leave the
op where it is, so ``Legalize`` turns it into a loop-level kernel later. Bindings that no
backend of a placement claims end here too. Listing ``codegen`` before another backend gives
that backend nothing.
"""

from __future__ import annotations

from tilework.backend.base import Backend, Capability, register_backend
from tilework.pattern.core import op_call


def _available() -> tuple[bool, str]:
    return True, "tilework's C kernels (legalize + default schedules), always available"


CODEGEN = register_backend(
    Backend(
        "codegen",
        "library",
        _available,
        (Capability("codegen.any", op_call(None)),),
        lower=None,
        description="tilework's own kernels for every op (the fallback)",
    )
)

__all__ = ["CODEGEN"]
