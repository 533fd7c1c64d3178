"""The ONNX frontend: ``from_onnx(model_or_path, dim_bounds=None, keep_params_as_inputs=False)``.

    mod = from_onnx("model.onnx", dim_bounds={"seq": (1, 512)})
    exe = tilework.build(mod); vm = tilework.VM(exe); out = vm["main"](ids, mask)

Named dynamic dims (``dim_param``) become sym vars shared across the model; shape arithmetic
computed in the graph folds into symbolic dims; converters are keyed by op type and schema
version (``supported_ops()`` lists them). See ``docs/conformance.md`` for the ONNX node-test
results.

The names below load on first use, so that registering the frontend with ``tilework.compile``
(``tilework.frontend.onnx.compile``) does not import onnx.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "from_onnx": "importer",
    "param_arrays": "importer",
    "load_model": "importer",
    "Importer": "importer",
    "supported": "converters",
    "supported_ops": "converters",
    "lookup": "converters",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tilework.frontend.onnx' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tilework.frontend.onnx.{module}"), name)


__all__ = list(_EXPORTS)
