"""tilework: a compiler for machine-learning models whose shapes change at run time."""

from __future__ import annotations

from tilework.errors import TileworkError
from tilework.ir.sym import SymVar

__version__ = "0.1.0"


def dim(name: str, min: int = 1, max: int | None = None) -> SymVar:
    """A named symbolic dimension, ``>= min`` (1 by default) and ``<= max`` when given."""
    return SymVar(name, min, max)


__all__ = ["TileworkError", "SymVar", "dim", "__version__"]
