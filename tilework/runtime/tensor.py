"""Host tensors: NumPy arrays, with torch tensors exchanged without copies.

dtype names are tilework's (``float32``, ``bfloat16`` ...); ``bfloat16`` is ml_dtypes' NumPy
dtype. Torch tensors on the CPU become NumPy views (``Tensor.numpy()`` shares memory, bfloat16
goes through a same-size integer view).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from tilework.errors import RuntimeCheckError

_NP: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}


def np_dtype(dtype: str) -> np.dtype:
    try:
        return _NP[dtype]
    except KeyError:
        raise RuntimeCheckError(f"unknown dtype {dtype!r}") from None


def dtype_name(dt: np.dtype) -> str:
    return "bfloat16" if dt == _NP["bfloat16"] else str(dt)


def is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "numpy") and hasattr(x, "dtype")


def from_torch(t: Any) -> np.ndarray:
    """A NumPy view of a CPU torch tensor (contiguous copy only when it is not contiguous)."""
    import torch

    if t.device.type != "cpu":
        raise RuntimeCheckError(f"tensor on {t.device} given to the CPU runtime; move it with .cpu()")
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_NP["bfloat16"])
    return t.numpy()


def to_torch(a: np.ndarray) -> Any:
    import torch

    if a.dtype == _NP["bfloat16"]:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def as_array(x: Any) -> Any:
    """A VM input: arrays stay, torch tensors become views, Python scalars stay scalars."""
    if isinstance(x, np.ndarray):
        return x if x.flags.c_contiguous else np.ascontiguousarray(x)
    if is_torch_tensor(x):
        return from_torch(x)
    if isinstance(x, (tuple, list)):
        return tuple(as_array(v) for v in x)
    return x
