"""ONNX for ``tilework.compile`` and the command line.

``register()`` makes ``tilework.compile`` accept a ``ModelProto`` or a path to a ``.onnx``
file; ``parse_dim_spec`` reads the ``--dim`` bounds of ``tilework build model.onnx``
(``seq<=512``, ``batch>=1``, ``1<=seq<=512``, ``x.0<=8``, ``x_dim0<=8``).
"""

from __future__ import annotations

import re
from typing import Any

from tilework.errors import TileworkError
from tilework.frontend.registry import CompileOptions, Imported, Signature, register_frontend

Bounds = tuple[int | None, int | None]

_NAME = r"[A-Za-z_][\w.\-/:]*"


def parse_dim_spec(spec: str) -> tuple[str, Bounds]:
    """``NAME<=HI``, ``NAME>=LO``, ``LO<=NAME<=HI`` or ``NAME`` (no bounds) as ``(name, (lo, hi))``."""
    s = re.sub(r"\s*([<>]=)\s*", r"\1", spec.strip())
    spaced = re.search(r"[^<>=]*\s[^<>=]*", s)
    if spaced:
        raise TileworkError(f"--dim {spec!r}: {spaced.group()!r} has a space in it; a name or bound is one word")
    m = re.fullmatch(rf"(?:(\d+)<=)?({_NAME})(?:<=(\d+))?", s)
    if m:
        lo, name, hi = m.groups()
        return name, (None if lo is None else int(lo), None if hi is None else int(hi))
    m = re.fullmatch(rf"({_NAME})>=(\d+)", s)
    if m:
        return m.group(1), (int(m.group(2)), None)
    raise TileworkError(f"--dim {spec!r}: expected NAME<=HI, NAME>=LO or LO<=NAME<=HI (NAME is a dim_param, INPUT.AXIS or a generated name such as x_dim0)")


def accepts(model: Any) -> bool:
    """An ONNX ``ModelProto`` or a path ending in ``.onnx`` (without importing onnx)."""
    if isinstance(model, str):
        return model.endswith(".onnx")
    return type(model).__name__ == "ModelProto" and type(model).__module__.startswith("onnx")


def load(model: Any, options: CompileOptions) -> Imported:
    """The ``compile`` frontend: weights become trailing params (``weights="inputs"``) or
    constants; a ``dim_bounds`` key is a ``dim_param``, ``INPUT.AXIS`` or the generated name of
    an unnamed dim (``x_dim0``)."""
    from tilework.frontend.onnx.importer import from_onnx, load_model, param_arrays

    if options.example_args is not None or options.dynamic_shapes is not None:
        raise TileworkError("an ONNX model names its dynamic dims itself (dim_param): pass dim_bounds, not example_args or dynamic_shapes")
    if options.dim_names:
        raise TileworkError("dim_names does not apply to ONNX models: their dims are named by dim_param")
    proto = load_model(model)
    as_inputs = options.weights == "inputs"
    mod = from_onnx(proto, dim_bounds=options.dim_bounds, keep_params_as_inputs=as_inputs)
    main = mod.graph_func("main")
    n = int(main.attrs.get("num_inputs", len(main.params)))
    inits = {t.name for t in proto.graph.initializer}
    names = [vi.name for vi in proto.graph.input if vi.name not in inits]
    dims: dict[Any, str] = {}
    for name, p in zip(names, main.params[:n]):
        for axis, d in enumerate(getattr(p.info, "shape", None) or ()):
            if hasattr(d, "name") and d not in dims:
                dims[d] = f"{name}.{axis}"
    weights = param_arrays(proto) if as_inputs else []
    signature = Signature([{"name": nm, "tensor": True, "value": None} for nm in names])
    source = f"ONNX model ({len(proto.graph.node)} nodes, opset {min((o.version for o in proto.opset_import if o.domain in ('', 'ai.onnx')), default=0)})"
    return Imported(mod, weights, signature, source, dims)


def register() -> None:
    """Make ``tilework.compile`` accept ONNX models."""
    register_frontend("onnx", accepts, load)


__all__ = ["parse_dim_spec", "accepts", "load", "register"]
