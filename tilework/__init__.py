"""tilework: a compiler for machine-learning models whose shapes change at run time.

    seq = tw.dim("seq", max=4096)          # a named symbolic dim with optional bounds
    mod = tw.parse(text)                   # IRModule from the text format; print(mod) gives text
    tw.verify(mod)                         # well-formedness; raises with the offending binding
    exe = tw.build(mod, target="cpu")      # one compilation for every shape
    vm = tw.VM(exe); out = vm["main"](*arrays)
    exe.save("m.tw"); exe = tw.load("m.tw")
    cm = tw.compile(model, example_args, dynamic_shapes)   # torch.nn.Module, ExportedProgram, ...
    out = cm(*inputs); cm.save("m.tw"); print(cm.explain())
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from tilework.errors import TileworkError
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar

# The package facade wires the layers together (registries live in the lower layer and the
# higher one registers into them): the op families register into the IR's op registry and the
# text printer into the IR's display hook (tilework.text imports tilework.op); the targets
# (C + OpenMP, the interpreter) register their kernel loaders with the runtime; the built-in
# backends register their library functions. None of this imports torch or onnxruntime.
import tilework.text  # noqa: E402,F401  isort: skip
import tilework.codegen  # noqa: E402,F401  isort: skip
import tilework.backend  # noqa: E402,F401  isort: skip
import tilework.compiled  # noqa: E402,F401  isort: skip  (registers the frontends and Module.compile)

__version__ = "0.1.0"

if TYPE_CHECKING:
    from tilework.compiled import CompiledModel
    from tilework.runtime.executable import Executable


def dim(name: str, min: int = 1, max: int | None = None) -> SymVar:
    """A named symbolic dimension, ``>= min`` (1 by default) and ``<= max`` when given."""
    return SymVar(name, min, max)


def parse(text: str) -> IRModule:
    """The module written in ``text`` (the format ``print(mod)`` produces)."""
    from tilework.text import parse as _parse

    return _parse(text)


def verify(mod: IRModule) -> None:
    """Raise ``WellFormedError`` showing every offending binding in context."""
    from tilework.ir.verify import verify as _verify

    _verify(mod)


def structural_equal(a: Any, b: Any) -> bool:
    """Equality of modules, functions, expressions and struct info modulo var names."""
    from tilework.ir.structural import structural_equal as _eq

    return _eq(a, b)


def build(mod: IRModule, target: str = "cpu", **kw: Any) -> "Executable":
    """Compile ``mod`` once into an Executable that runs every shape; ``target`` is ``"cpu"``
    (C + OpenMP kernels) or ``"interp"`` (the NumPy reference interpreter)."""
    from tilework.driver import build as _build

    return _build(mod, target, **kw)


def load(path: "str | os.PathLike[str]", trust_native: bool = False) -> "Executable":
    """An executable saved with ``Executable.save``. Nothing from the file runs: its kernels
    are rebuilt from their stored loop IR through the kernel cache (no compiler run when the
    cache has them). ``trust_native=True`` uses the native code stored in the file instead
    (for machines without a C compiler; only for files you trust).

    A file written by ``CompiledModel.save`` gives its executable here, whose ``main`` takes the
    weights as trailing arguments; ``tilework.CompiledModel.load(path)`` loads it as the
    callable model, with its weights."""
    from tilework.compiled import is_compiled_model
    from tilework.runtime.executable import load_file

    loaded = load_file(os.fspath(path), trust_native=trust_native)
    if is_compiled_model(loaded):
        loaded.executable.call_hint = f"{os.fspath(path)!r} was written by CompiledModel.save: tilework.CompiledModel.load loads it as the model, which passes its weights"
    return loaded.executable


def compile(model: Any, example_args: Any = None, dynamic_shapes: Any = None, backends: Any = None, placement: Any = None, **options: Any) -> "CompiledModel":
    """Compile a model (``torch.nn.Module``, ``ExportedProgram``, ONNX file, ``tilework.nn``
    module, ``IRModule``) once for every shape of its dynamic dims; the result is called like the
    model. ``options`` (``dim_bounds``, ``dim_names``, ``weights``, ``passes``, ``opt_level``)
    are those of ``tilework.compiled.compile``."""
    from tilework.compiled import compile as _compile

    return _compile(model, example_args, dynamic_shapes, backends, placement, **options)


def __getattr__(name: str) -> Any:
    if name == "VM":
        from tilework.runtime.vm import VM

        return VM
    if name == "CompiledModel":
        from tilework.compiled import CompiledModel

        return CompiledModel
    if name == "Executable":
        from tilework.runtime.executable import Executable

        return Executable
    raise AttributeError(f"module 'tilework' has no attribute {name!r}")


__all__ = ["TileworkError", "IRModule", "SymVar", "dim", "parse", "verify", "structural_equal", "build", "load", "compile", "CompiledModel", "VM", "Executable", "__version__"]
