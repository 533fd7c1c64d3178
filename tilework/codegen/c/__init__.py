"""The CPU target: loop-level TensorFuncs as C99 + OpenMP kernels.

``emit`` writes one C translation unit for a module's kernels (the kernel ABI is documented
there), ``toolchain`` compiles it with the system C compiler and caches the shared object by
content, ``module`` loads it and calls its kernels through ctypes (``CKernelModule``).
``CpuTarget`` ties them together and registers as the target ``cpu``.
"""

from __future__ import annotations

from typing import Mapping

from tilework.codegen.c import toolchain
from tilework.codegen.c.emit import CModule, c_symbols, emit_function, emit_module
from tilework.codegen.c.module import CKernelModule, Kernel, build_library
from tilework.codegen.target import Target, register_target
from tilework.errors import BuildError
from tilework.ir.loop import TensorFunc
from tilework.runtime.kernels import KernelInfo, KernelModule, loop_ir_digest, loop_ir_text


class CpuTarget(Target):
    """C + OpenMP kernels compiled by the system C compiler (``$CC``), one shared object per
    module, cached by content (``toolchain``)."""

    name = "cpu"
    description = "C99 + OpenMP kernels built with the system C compiler"

    def available(self) -> tuple[bool, str]:
        try:
            return True, " ".join(toolchain.compiler_command())
        except BuildError as e:
            return False, str(e)

    def build(self, funcs: Mapping[str, TensorFunc]) -> CKernelModule:
        """The module of ``funcs``: found by the digest of their loop IR text when this machine
        built it before (printing the loop IR takes about a quarter of the time of writing the C
        that the kernel cache is keyed by), else ``build_library`` (which finds an identical C
        source in the cache, or compiles it)."""
        if not funcs:
            return build_library(funcs)
        digest = loop_ir_digest(loop_ir_text(funcs))
        symbols = c_symbols(list(funcs))
        found = self._cached(digest, [KernelInfo.of(n, symbols[n], f) for n, f in funcs.items()], funcs)
        if found is not None:
            return found
        module = build_library(funcs)
        self.remember(digest, module)
        return module

    def load_native(self, data: bytes, functions: Mapping[str, KernelInfo], funcs: Mapping[str, TensorFunc]) -> CKernelModule:
        return CKernelModule.from_native(data, functions, funcs)

    def cached(self, ir_digest: str, functions: Mapping[str, KernelInfo]) -> CKernelModule | None:
        return self._cached(ir_digest, list(functions.values()), None)

    def _cached(self, ir_digest: str, infos: list[KernelInfo], funcs: Mapping[str, TensorFunc] | None) -> CKernelModule | None:
        found = toolchain.lookup_loop_ir(ir_digest)
        if found is None:
            return None
        try:
            return CKernelModule(found.path, infos, funcs, cache_hit=True, key=found.key, data=found.data)
        except (OSError, BuildError) as e:
            toolchain.set_aside(found, f"it does not load ({e})")
            return None

    def remember(self, ir_digest: str, module: KernelModule) -> None:
        if isinstance(module, CKernelModule) and module.key is not None:
            toolchain.remember_loop_ir(ir_digest, module.key)


CPU = register_target(CpuTarget())

__all__ = ["CPU", "CpuTarget", "CKernelModule", "CModule", "Kernel", "build_library", "c_symbols", "emit_function", "emit_module"]
