"""Graph functions as native code in this process: the VM's bytecode compiled away.

``NativeModel(exe, bind={"decode": weights})`` translates the executable's graph functions to C
exactly as the ahead-of-time export does (``tilework.export.aot``: the shape checks with the
VM's messages, the static memory plan, the shape heap), compiles that C with the kernel
toolchain (``tilework.codegen.c.toolchain``: cached under the text's key, verified before it is
loaded) and runs it on NumPy arrays. It exists for the calls whose interpreter overhead is a
large share of their time: an LLM's decode step makes ~600 VM instructions for ~4 ms of kernels.

What is not compiled again: the kernels and the quant library's calls are *imported*, the
generated C calls them through function pointers set to the functions the VM's own libraries
hold in this process (``CKernelModule.address``, the quant library's symbols). So the native
path runs the same machine code as the VM, and building it compiles only the graph code and
the small C runtime (an LLM's prefill and decode: 2-3 s cold in one unit, SmolLM2 fp32's 3.0
-> 1.75 s in two; nothing when cached). The graph functions are split over as many C units as compile jobs are
idle (``toolchain.idle_jobs``: not while the quant library builds in the background).

Weights are not copied: ``tw_model_create_from_arrays`` takes the constants and the bound
arrays where they are, and this object keeps them alive. Outputs are copied out of the model's
memory (they live until its next run). One model serves one thread at a time; calls are
serialized by a lock.

What cannot run this way raises ``ExportError`` at construction, naming it (a torch,
onnxruntime or BLAS library call, a kernel of another target): such a model runs on the VM
(``runtime="vm"``).
"""

from __future__ import annotations

import ctypes
import threading
from importlib import resources
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tilework.backend import quant
from tilework.codegen import cache
from tilework.codegen.c import toolchain
from tilework.codegen.c.emit import CUnit
from tilework.codegen.c.module import CKernelModule
from tilework.export.aot import arrays_of, make_export_id, model_units
from tilework.export.externs import ExportError
from tilework.export.runner import ExportedModel, declare, tensors_of
from tilework.runtime.executable import Executable
from tilework.runtime.kernels import KernelInfo


def _inline_headers(text: str) -> str:
    """``text`` with the runtime's own ``#include "..."`` lines replaced by the headers (a
    translation unit of the kernel toolchain is compiled alone, away from the export's files)."""
    out = []
    for line in text.splitlines():
        if line.startswith('#include "tw_'):
            name = line.split('"')[1]
            out.append(_inline_headers(resources.files("tilework.export.c").joinpath(name).read_text()))
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def _kernel_sources(exe: Executable) -> tuple[dict[str, tuple[KernelInfo, str]], dict[str, int]]:
    """Each kernel's table entry and the C name of its pointer, and the pointer's value."""
    kernels: dict[str, tuple[KernelInfo, str]] = {}
    addresses: dict[str, int] = {}
    for module in exe.modules:
        if not isinstance(module, CKernelModule):
            raise ExportError(f"a kernel module of target {module.target!r} cannot be called from native graph code")
        for name, info in module.functions.items():
            sym = f"twk_{len(kernels)}"
            kernels[name] = (info, sym)
            addresses[sym] = module.address(name)
    return kernels, addresses


# The graph code is straight-line calls (shape checks, memory plan, kernel calls): -O1 makes it
# in 40% less compiler time than the library's -O3 (DenseNet-121's 356 KB: 2.1 -> 1.3 s CPU on
# the 2-core Zen 4, the last compile of a cold start), and it runs as fast (MobileNetV3-Small at
# 2.2 ms a call: the same within the noise). The C runtime keeps the library's flags.
GRAPH_CODE_FLAGS = ("-O1",)

_IMPORT_TABLES: dict[int, tuple[int, ...]] = {}  # each loaded graph library's imported addresses


class NativeModel(ExportedModel):
    """See the module docstring. ``functions`` lists what it runs; ``cache_hit`` tells whether
    its library came from the kernel cache."""

    def __init__(self, exe: Executable, bind: Mapping[str, Sequence[np.ndarray]] | None = None) -> None:
        kernels, addresses = _kernel_sources(exe)
        arrays, bound = arrays_of(exe, dict(bind or {}))
        # the graph functions in as many units as compile jobs are idle (they compile side by side)
        texts, externs = model_units(exe, kernels, arrays, bound, imported=True, parts=toolchain.idle_jobs())
        export_id = str(make_export_id(texts, arrays))
        model_c = [_inline_headers(text.replace("@ID@", export_id)) for text in texts]
        runtime_c = _inline_headers(resources.files("tilework.export.c").joinpath("tw_runtime.c").read_text())
        built = toolchain.compile_source("".join(model_c) + runtime_c, units=[*(CUnit(text, {}, GRAPH_CODE_FLAGS) for text in model_c), CUnit(runtime_c, {})])
        self.cache_hit = built.cache_hit
        # a copy of its own: the import table is a global of the library, and another model
        # with the same graph code (the same text, so the same bytes) may import other kernels
        lib = declare(cache.load_shared_object(built.path, built.data, own=True))
        lib.tw_native_import_name.restype = ctypes.c_char_p
        lib.tw_native_set_import.argtypes = [ctypes.c_int, ctypes.c_void_p]
        imports = []
        for i in range(lib.tw_native_num_imports()):
            name = lib.tw_native_import_name(i).decode()
            address = addresses.get(name)
            if address is None and externs:  # a library call: the quant library's entry point of the same name
                address = quant.entry_address(name)
            if not address:
                raise ExportError(f"the native graph code calls {name}, which is not loaded in this process")
            imports.append(address)
        table = _IMPORT_TABLES.setdefault(lib._handle, tuple(imports))  # shared only where no copy could be made
        if table != tuple(imports):
            raise ExportError("another native model in this process has the same graph code but other kernels, and its library could not be loaded apart (no executable scratch directory): run this one on the VM (runtime='vm')")
        for i, address in enumerate(imports):
            if lib.tw_native_set_import(i, address):
                raise ExportError(f"the native graph code's import {i} is out of its table")
        self._arrays = arrays  # the model reads them in place
        tensors, self._array_keep = tensors_of(arrays)
        self._modules = list(exe.modules)  # the imported kernels' libraries stay loaded
        self._attach(lib, lib.tw_model_create_from_arrays(tensors, len(arrays)))
        self.functions = {name: exe.functions[name].params[: len(exe.functions[name].params) - len(bound.get(name, []))] for name in bound or exe.functions}
        self._lock = threading.Lock()

    def run(self, function: str, *arrays: np.ndarray, bits: Mapping[int, str] | None = None) -> list[np.ndarray]:
        with self._lock:
            return super().run(function, *arrays, bits=bits)

    def bind(self, function: str, bits: Mapping[int, str] | None = None) -> Callable[..., Any]:
        """A callable running ``function`` on its leading inputs (the bound weights are held),
        returning what the VM's bound function returns: the one output, or a tuple. ``bits``
        maps an input's position to the dtype whose bits it is given as (``tensors_of``)."""
        if function not in self.functions:
            raise ExportError(f"no function {function!r} in the native model (it has: {', '.join(self.functions)})")

        def call(*arrays: np.ndarray) -> Any:
            outs = self.run(function, *arrays, bits=bits)
            return outs[0] if len(outs) == 1 else tuple(outs)

        return call


__all__ = ["NativeModel"]
