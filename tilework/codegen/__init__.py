"""Code generation: loop-level TensorFuncs to kernel modules, one ``Target`` at a time.

``target`` defines the seam (``Target``, the registry of targets); ``c`` is the CPU target
(C99 + OpenMP, compiled and cached, called through ctypes) and ``interp`` the reference
interpreter target (NumPy, serial: the oracle the C kernels are tested against). Both walk the
loop IR with ``loop_emit.LoopEmitter``. ``vm_codegen`` turns lowered graph functions into VM
bytecode. ``abi`` checks arrays against a kernel's signature. Importing this package registers
the built-in targets.
"""

from __future__ import annotations

from tilework.codegen import c, interp
from tilework.ir.kernel_abi import bind_syms, check_arrays
from tilework.codegen.c import CKernelModule, Kernel, build_library
from tilework.codegen.target import Target, get_target, register_target, targets

__all__ = ["CKernelModule", "Kernel", "Target", "bind_syms", "build_library", "c", "check_arrays", "get_target", "interp", "register_target", "targets"]
