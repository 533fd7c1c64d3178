"""Every converter module; importing this registers all converters with ``registry``."""

from __future__ import annotations

from tilework.frontend.onnx import (  # noqa: F401
    convert_attention,
    convert_control,
    convert_loss,
    convert_math,
    convert_nn,
    convert_reduce,
    convert_shape,
)
