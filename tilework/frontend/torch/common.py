"""What the converters share: dtype names and small argument helpers."""

from __future__ import annotations

from typing import Any

from tilework.errors import UnsupportedError
from tilework.ir.dtype import DTYPES, from_torch


def dtype_of_torch(dt: Any) -> str:
    """tilework's name for a torch dtype."""
    name = from_torch(dt)
    if name is None:
        raise UnsupportedError(f"torch dtype {dt} is not supported (supported: {', '.join(DTYPES)})")
    return name


def as_list(v: Any) -> list[Any]:
    """An int-or-list argument (``dim=1`` or ``dim=[1, 2]``) as a list."""
    return list(v) if isinstance(v, (list, tuple)) else [v]


def norm_axis(axis: int, ndim: int) -> int:
    """A torch dim in ``[-ndim, ndim)`` as a non-negative axis (0-d tensors accept 0 and -1)."""
    n = max(ndim, 1)
    if not -n <= axis < n:
        raise UnsupportedError(f"dim {axis} is out of range for a tensor of rank {ndim}")
    return axis + n if axis < 0 else axis


__all__ = ["dtype_of_torch", "as_list", "norm_axis"]
