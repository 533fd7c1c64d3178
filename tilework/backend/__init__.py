"""Backends: the registration interface (``base``), the built-in CPU backends (``codegen``,
``blas``, ``quant`` (and ``quant_experts``, its mixture-of-experts extern), ``torch``, ``onnxruntime``) and partitioning by rules (``partition``).

Importing the package registers the built-ins and their extern functions; none of them
imports its library (torch, onnxruntime) before it is used. See ``docs/backends.md``.
"""

from tilework.backend.base import (
    Backend,
    Capability,
    Region,
    availability,
    backend_names,
    get_backend,
    lib_call,
    register_backend,
    resolve_backends,
    unregister_backend,
)
from tilework.backend import codegen as _codegen  # noqa: F401  (registers the built-ins, in order)
from tilework.backend import blas as _blas  # noqa: F401
from tilework.backend import quant as _quant  # noqa: F401
from tilework.backend import quant_experts as _quant_experts  # noqa: F401  (expert_linear's extern on the quant library)
from tilework.backend import torch as _torch  # noqa: F401
from tilework.backend import onnxruntime as _onnxruntime  # noqa: F401
from tilework.backend.partition import Placement, RegionSpec, partition_by_rules

__all__ = [
    "Backend",
    "Capability",
    "Region",
    "availability",
    "backend_names",
    "get_backend",
    "lib_call",
    "register_backend",
    "resolve_backends",
    "unregister_backend",
    "Placement",
    "RegionSpec",
    "partition_by_rules",
]
