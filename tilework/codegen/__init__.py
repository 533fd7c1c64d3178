"""Code generation: TensorFuncs to C kernels (``c``), compiled and cached (``toolchain``),
loaded and called (``library``); ``interp`` runs the same programs on NumPy as the oracle."""

from __future__ import annotations

from tilework.codegen.abi import bind_syms, kernel_syms, np_dtype
from tilework.codegen.library import Kernel, KernelInfo, KernelLibrary, build_library

__all__ = ["Kernel", "KernelInfo", "KernelLibrary", "bind_syms", "build_library", "kernel_syms", "np_dtype"]
