"""Executable: bytecode, constants and compiled kernels in one file.

``save(path)`` writes a zip archive (``manifest.json``, ``bytecode.pkl``, ``constants.pkl``,
``kernels.so``, ``kernels.pkl``); ``load(path)`` reads it back in any process and needs no C
compiler: the shared library is written to the kernel cache under its content hash and loaded.
"""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tilework.errors import BuildError, TileworkError
from tilework.ir.loop import TensorFunc
from tilework.runtime.bytecode import VMFunction

FORMAT_VERSION = 1


@dataclass
class Executable:
    functions: dict[str, VMFunction]
    constants: list[np.ndarray]
    kernel_funcs: dict[str, TensorFunc]
    library: Any = None  # tilework.codegen KernelLibrary, None when there are no kernels
    meta: dict[str, Any] = field(default_factory=dict)

    def kernel_callables(self) -> dict[str, Callable[..., Any]]:
        """``name -> f(*buffers, sym_values)`` for the VM's kernel calls."""
        if not self.kernel_funcs:
            return {}
        if self.library is None:
            raise BuildError("the executable has kernels but no compiled library")
        out: dict[str, Callable[..., Any]] = {}
        for name in self.kernel_funcs:
            out[name] = _kernel_adapter(self.library[name])
        return out

    def stats(self) -> dict[str, int]:
        return {
            "functions": len(self.functions),
            "instructions": sum(len(f.code) for f in self.functions.values()),
            "kernels": len(self.kernel_funcs),
            "constants": len(self.constants),
            "constant_bytes": int(sum(c.nbytes for c in self.constants)),
        }

    # -- persistence ----------------------------------------------------------------------

    def save(self, path: str) -> None:
        manifest = {"format": FORMAT_VERSION, "meta": self.meta, "functions": list(self.functions)}
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr("manifest.json", json.dumps(manifest, indent=1, default=str))
            zf.writestr("bytecode.pkl", pickle.dumps(self.functions))
            zf.writestr("constants.pkl", _dump_arrays(self.constants))
            zf.writestr("kernels.pkl", pickle.dumps(self.kernel_funcs))
            if self.library is not None:
                zf.writestr("kernels.so", self.library.so_bytes())

    @staticmethod
    def load(path: str) -> "Executable":
        try:
            zf = zipfile.ZipFile(path)
        except (OSError, zipfile.BadZipFile) as e:
            raise TileworkError(f"cannot read executable {path!r}: {e}") from None
        with zf:
            manifest = json.loads(zf.read("manifest.json"))
            if manifest.get("format") != FORMAT_VERSION:
                raise TileworkError(f"{path!r} has executable format {manifest.get('format')}, this tilework reads {FORMAT_VERSION}")
            functions = pickle.loads(zf.read("bytecode.pkl"))
            constants = _load_arrays(zf.read("constants.pkl"))
            kernel_funcs = pickle.loads(zf.read("kernels.pkl"))
            library = None
            if "kernels.so" in zf.namelist():
                from tilework.codegen import KernelLibrary

                library = KernelLibrary.from_bytes(zf.read("kernels.so"), kernel_funcs)
        return Executable(functions, constants, kernel_funcs, library, manifest.get("meta", {}))


def _kernel_adapter(kernel: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> None:
        kernel(args[:-1], args[-1])

    return call


def _dump_arrays(arrays: list[np.ndarray]) -> bytes:
    from tilework.ir.dtype import dtype_name

    items = [(dtype_name(a.dtype), tuple(a.shape), np.ascontiguousarray(a).tobytes()) for a in arrays]
    buf = io.BytesIO()
    pickle.dump(items, buf)
    return buf.getvalue()


def _load_arrays(data: bytes) -> list[np.ndarray]:
    from tilework.ir.dtype import np_dtype

    return [np.frombuffer(raw, np_dtype(dt)).reshape(shape).copy() for dt, shape, raw in pickle.loads(data)]
