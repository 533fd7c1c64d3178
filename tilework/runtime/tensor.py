"""Host tensors: NumPy arrays, with torch tensors exchanged without copies.

dtype names are tilework's (``float32``, ``bfloat16`` ...); ``bfloat16`` is ml_dtypes' NumPy
dtype. Torch tensors on the CPU become NumPy views (``Tensor.numpy()`` shares memory, bfloat16
and the float8 types go through a same-size integer view).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilework.errors import RuntimeCheckError
from tilework.ir.dtype import LOWP_DTYPES, LOWP_FLOAT_DTYPES, np_dtype



def is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "numpy") and hasattr(x, "dtype")


_FROM_TORCH_PLAIN: set[Any] = set()  # torch dtypes whose ``Tensor.numpy()`` is the view: filled on first use


def from_torch(t: Any) -> np.ndarray:
    """A NumPy view of a CPU torch tensor (contiguous copy only when it is not contiguous)."""
    import torch

    if not _FROM_TORCH_PLAIN:
        _FROM_TORCH_PLAIN.update([torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool])
    if t.device.type != "cpu":
        raise RuntimeCheckError(f"tensor on {t.device} given to the CPU runtime; move it with .cpu()")
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype in _FROM_TORCH_PLAIN:
        return t.numpy()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np_dtype("bfloat16"))
    name = str(t.dtype).removeprefix("torch.")
    if name in LOWP_FLOAT_DTYPES:  # torch's float8 tensors: one byte per element, as ml_dtypes'
        return t.view(torch.uint8).numpy().view(np_dtype(name))
    return t.numpy()


# dtypes torch.from_numpy takes as they are (a dtype's ``.name`` is computed in Python by
# NumPy: ~1 us, which every output of every call paid)
_TORCH_PLAIN = frozenset(np.dtype(t) for t in ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool", "complex64", "complex128"))


def to_torch(a: np.ndarray) -> Any:
    import torch

    if a.dtype in _TORCH_PLAIN:
        return torch.from_numpy(a if a.flags.c_contiguous else np.ascontiguousarray(a))
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    if a.dtype.name in LOWP_DTYPES:
        if a.dtype.name not in LOWP_FLOAT_DTYPES or not hasattr(torch, a.dtype.name):
            raise RuntimeCheckError(f"torch has no tensor of {a.dtype.name} with one element per byte; pass NumPy arrays for this dtype")
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).view(getattr(torch, a.dtype.name))
    return torch.from_numpy(np.ascontiguousarray(a))


def to_torch_tree(x: Any) -> Any:
    """A VM result (arrays, tuples of them, other values) with every array as a torch tensor."""
    if isinstance(x, tuple):
        return tuple(to_torch_tree(v) for v in x)
    if hasattr(x, "__array_interface__"):
        return to_torch(x)
    return x


def describe(x: Any, limit: int = 80) -> str:
    """``x`` in an error message: its type and repr, cut to about ``limit`` characters."""
    text = repr(x)
    if len(text) > limit:
        text = text[: limit - 5] + " ...]" if text[:1] == "[" else text[: limit - 4] + " ..."
    return f"{type(x).__name__} {text}"


def host_array(x: Any, where: str) -> np.ndarray:
    """An input of the native graph code or an export, which take tensors only: ``as_array``
    (arrays stay, torch tensors become views), a number a 0-d array; anything else (None, a
    list ...) is a ``RuntimeCheckError`` naming ``where``, as the VM's check says it."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch_tensor(x):
        return from_torch(x)
    if isinstance(x, (bool, int, float, complex, np.generic)):
        return np.asarray(x)
    raise RuntimeCheckError(f"{where} expects a tensor, got {describe(x)}")


def as_array(x: Any) -> Any:
    """A VM input: arrays stay, torch tensors become views, Python scalars stay scalars."""
    if isinstance(x, np.ndarray):
        return x if x.flags.c_contiguous else np.ascontiguousarray(x)
    if is_torch_tensor(x):
        return from_torch(x)
    if isinstance(x, (tuple, list)):
        return tuple(as_array(v) for v in x)
    return x
