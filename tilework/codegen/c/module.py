"""The CPU target's kernel module: every kernel of a module in one shared object, via ctypes.

``build_library`` emits the C of all kernels (``tilework.codegen.c.emit``), compiles it into
one shared object (one compiler invocation, or for a large library units compiled in parallel
and linked; or finds it in the cache, ``toolchain``) and loads it. ``lib.cache_hit`` tells whether the compiler ran. ``to_bytes()`` is the shared object;
``CKernelModule.from_native`` loads such bytes (with the function table) in any process
without a compiler, which runs native code from wherever the bytes came from: executables
use it only when the user opts in.

``Kernel.__call__(arrays, sym_values)`` is the fast path: it trusts its arguments, which must
follow the ABI in ``tilework.codegen.c``, and passes NumPy arrays by object address to the
library's ``tw_call_objects`` trampoline, which reads their data pointers (about a microsecond
per call, instead of one per array through ``ndarray.ctypes``). ``Kernel.run`` checks the
arguments first. A Kernel is safe to call from many threads at once: a call takes the
Kernel's own argument buffers when no other call holds them (a non-blocking lock, so the
single-threaded path allocates nothing) and fresh ones otherwise.

A kernel's return code tells what went wrong inside it: 1, scratch memory could not be
allocated (``MemoryError``); 2, an integer division by zero where the source framework raises
(``tilework.errors.IntegerDivisionByZero``, see docs/semantics.md).
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tilework.ir.kernel_abi import SymValues, bind_syms, check_arrays
from tilework.codegen import cache
from tilework.codegen.c import team, toolchain
from tilework.codegen.c.emit import emit_module
from tilework.codegen.loop_emit import EMPTY_REDUCTION

INDEX_OUT_OF_RANGE = "an index is out of range (the source framework raises here, e.g. torch's IndexError)"
from tilework.errors import BuildError, IndexOutOfRange, IntegerDivisionByZero, RuntimeCheckError
from tilework.runtime.kernels import KernelInfo, KernelModule

# OpenMP workers of our kernels spin between parallel regions before they sleep. libgomp's
# default spin (hundreds of microseconds) starves the other thread pools of a process (BLAS,
# torch, onnxruntime, another VM) on small machines; a short spin keeps back-to-back kernels
# warm without that. libgomp reads this once, when it loads: with the first kernel library, or
# earlier with `import torch` (torch's wheel carries a libgomp.so.1, which our kernels then
# share), so it takes effect where tilework is imported before torch; a user's setting wins.
os.environ.setdefault("GOMP_SPINCOUNT", "20000")


def _load_openmp() -> None:
    """Load libgomp now, reading ``OMP_WAIT_POLICY=active`` where the user set no policy, then
    take that variable back out of the environment.

    Each thread that starts a parallel region keeps a pool of workers of its own for as long as
    it lives. Once the pools' workers outnumber the CPUs (the thread that loaded a model, and
    the thread that runs it: a server's scheduler, a web framework's worker thread), libgomp
    cuts every worker's spin to its "throttled" count: 100 spins without a policy, so a worker
    sleeps between back-to-back parallel regions and each region waits for it to wake (SmolLM2
    `q` served to one client by ``tilework serve``: 123 tok/s; 305 with the policy). With
    the active policy that count is 1000 (a few microseconds); the spin of the pools that do not
    outnumber the CPUs stays ``GOMP_SPINCOUNT`` (set above, so the policy's own 5-minute spin
    never applies). The variable is set only while libgomp reads it: other OpenMP runtimes
    loaded later (LLVM's spins without end under it) and child processes do not see it. Where
    libgomp is already loaded (``import torch`` first) this changes nothing."""
    added = "OMP_WAIT_POLICY" not in os.environ
    if added:
        os.environ["OMP_WAIT_POLICY"] = "active"
    try:
        ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:  # no libgomp here: building a kernel says what is missing
        pass
    finally:
        if added:
            del os.environ["OMP_WAIT_POLICY"]


_load_openmp()
from tilework.ir.loop import TensorFunc


def _data_offset() -> int | None:
    """Where a NumPy array object keeps its data pointer (right after the object header in
    ``PyArrayObject``), verified on live arrays; None where that does not hold."""
    off = object.__basicsize__
    probes: list[np.ndarray] = [np.zeros(3), np.arange(5, dtype=np.int8)[1:], np.empty((0, 2), np.float32)]
    for a in probes:
        if ctypes.c_void_p.from_address(id(a) + off).value != a.ctypes.data:
            return None
    return off


_DATA_OFFSET = _data_offset()
_DATA_OFFSET_C = ctypes.c_int64(_DATA_OFFSET or 0)


def data_pointer(a: np.ndarray) -> int:
    """The address of ``a``'s data (``a.ctypes.data``, read from the object where that is
    verified to hold: a fifth of the time)."""
    if _DATA_OFFSET is not None and type(a) is np.ndarray:
        return int(ctypes.c_void_p.from_address(id(a) + _DATA_OFFSET).value or 0)
    return int(a.ctypes.data)


class Kernel:
    """One compiled kernel. ``func`` is its TensorFunc when known (needed by ``run``)."""

    __slots__ = ("info", "func", "_fn", "_ptrs", "_syms", "_nb", "_ns", "_lib", "_tramp", "_fnptr", "_nb_c", "_objs", "_lock")

    def __init__(self, info: KernelInfo, fn: Any, lib: "CKernelModule", func: TensorFunc | None, tramp: Any) -> None:
        self.info = info
        self.func = func
        self._fn = fn
        self._nb = len(info.buffers)
        self._ns = len(info.syms)
        self._ptrs = (ctypes.c_void_p * max(self._nb, 1))()
        self._objs = (ctypes.c_void_p * max(self._nb, 1))()
        self._syms = (ctypes.c_int64 * max(self._ns, 1))()
        self._lock = threading.Lock()  # held while a call uses the buffers above
        self._tramp = tramp if _DATA_OFFSET is not None else None
        self._fnptr = ctypes.c_void_p(ctypes.cast(fn, ctypes.c_void_p).value)
        self._nb_c = ctypes.c_int64(self._nb)
        self._lib = lib  # keeps the shared object loaded

    def __call__(self, arrays: Sequence[np.ndarray], sym_values: Sequence[int]) -> None:
        """Run on C-contiguous arrays of the right dtypes (inputs, then outputs, written in
        place) with the kernel sym var values in ABI order. Nothing is checked but counts."""
        if len(arrays) != self._nb or len(sym_values) != self._ns:
            raise TypeError(f"kernel {self.info.name}: expects {self._nb} arrays and {self._ns} sym values, got {len(arrays)} and {len(sym_values)}")
        lock = self._lock
        if lock.acquire(False):
            try:
                rc = self._invoke(arrays, sym_values, self._objs, self._ptrs, self._syms)
            finally:
                lock.release()
        else:  # another thread is in this kernel: use buffers of this call's own
            n = max(self._nb, 1)
            rc = self._invoke(arrays, sym_values, (ctypes.c_void_p * n)(), (ctypes.c_void_p * n)(), (ctypes.c_int64 * max(self._ns, 1))())
        if rc:
            raise _kernel_error(self.info.name, rc)

    def private(self) -> Callable[[Sequence[np.ndarray], Sequence[int]], None]:
        """This kernel with argument buffers of its own and no lock, for a caller that never
        runs it from two threads at once (a VM's set of steps: one call at a time)."""
        n, nb, ns, name, invoke = max(self._nb, 1), self._nb, self._ns, self.info.name, self._invoke
        objs, ptrs, syms = (ctypes.c_void_p * n)(), (ctypes.c_void_p * n)(), (ctypes.c_int64 * max(ns, 1))()

        def call(arrays: Sequence[np.ndarray], sym_values: Sequence[int]) -> None:
            if len(arrays) != nb or len(sym_values) != ns:
                raise TypeError(f"kernel {name}: expects {nb} arrays and {ns} sym values, got {len(arrays)} and {len(sym_values)}")
            rc = invoke(arrays, sym_values, objs, ptrs, syms)
            if rc:
                raise _kernel_error(name, rc)

        return call

    def vm_call(self) -> Callable[..., None]:
        """This kernel called as a VM instruction calls it, ``f(*arrays, sym_values)``, with
        argument buffers of its own and no lock (as ``private``): one generated function per
        kernel that stores the array addresses and sym values and calls the trampoline, without
        the layers of ``private`` (about 2 us less a call; a BERT layer makes ten)."""
        nb, ns, name = self._nb, self._ns, self.info.name
        n = max(nb, 1)
        objs, ptrs, syms = (ctypes.c_void_p * n)(), (ctypes.c_void_p * n)(), (ctypes.c_int64 * max(ns, 1))()
        invoke = self._invoke

        def slow(arrays: Sequence[np.ndarray], sym_values: Sequence[int]) -> int:
            return invoke(arrays, sym_values, objs, ptrs, syms)

        env = {"ND": np.ndarray, "O": objs, "S": syms, "T": self._tramp, "FP": self._fnptr, "NB": self._nb_c, "OFF": _DATA_OFFSET_C, "slow": slow, "err": _kernel_error, "name": name}
        a = [f"a{i}" for i in range(nb)]
        fast = self._tramp is not None and nb > 0
        lines = [f"def call({', '.join([*a, 'sv'])}):"]
        lines.append(f"    if len(sv) != {ns}: raise TypeError(f'kernel {{name}}: expects {ns} sym values, got {{len(sv)}}')")
        if fast:
            lines.append(f"    if {' and '.join(f'type({x}) is ND' for x in a)}:")
            lines += [f"        O[{i}] = id({x})" for i, x in enumerate(a)]
            lines += [f"        S[{j}] = sv[{j}]" for j in range(ns)]
            lines.append("        rc = T(FP, O, NB, OFF, S)")
            lines.append("    else:")
        lines.append(f"{'    ' * (1 + fast)}rc = slow(({''.join(x + ', ' for x in a)}), sv)")
        lines.append("    if rc: raise err(name, rc)")
        exec(compile("\n".join(lines) + "\n", f"<kernel {name}>", "exec"), env)  # noqa: S102 - generated from ints only
        call: Callable[..., None] = env["call"]  # type: ignore[assignment]
        return call

    def _invoke(self, arrays: Sequence[np.ndarray], sym_values: Sequence[int], objs: Any, ptrs: Any, syms: Any) -> int:
        for j, v in enumerate(sym_values):
            syms[j] = v
        tramp = self._tramp
        if tramp is not None:
            for i, a in enumerate(arrays):
                if type(a) is not np.ndarray:
                    break
                objs[i] = id(a)
            else:
                rc: int = tramp(self._fnptr, objs, self._nb_c, _DATA_OFFSET_C, syms)
                return rc
        for i, a in enumerate(arrays):
            ptrs[i] = a.ctypes.data
        rc = self._fn(ptrs, syms)
        return rc

    def run(self, arrays: Sequence[np.ndarray], sym_params: SymValues = None) -> None:
        """Check the arrays (count, dtype, layout, shapes) against the TensorFunc, derive the
        sym values from their shapes and ``sym_params`` (values of ``func.sym_params``), run."""
        if self.func is None:
            raise TypeError(f"kernel {self.info.name} was loaded without its TensorFunc; call it with sym values")
        check_arrays(self.func, arrays, self.info.name)
        self(arrays, bind_syms(self.func, arrays, sym_params, self.info.name))

    def __repr__(self) -> str:
        return f"Kernel({self.info.name}, symbol={self.info.symbol}, syms=({', '.join(self.info.syms)}))"


def _kernel_error(name: str, rc: int) -> Exception:
    if rc == 2:
        return IntegerDivisionByZero(f"kernel {name}: integer division by zero (the source framework raises here, e.g. torch's ZeroDivisionError)")
    if rc == 3:
        return RuntimeCheckError(f"kernel {name}: {EMPTY_REDUCTION}")
    if rc == 4:
        return IndexOutOfRange(f"kernel {name}: {INDEX_OUT_OF_RANGE}")
    return MemoryError(f"kernel {name}: scratch memory could not be allocated (code {rc})")


class CKernelModule(KernelModule):
    """A loaded shared object with its kernels by name."""

    target = "cpu"

    def __init__(
        self,
        path: Path | None,
        infos: Sequence[KernelInfo],
        funcs: Mapping[str, TensorFunc] | None = None,
        cache_hit: bool = False,
        source: str | None = None,
        key: str | None = None,
        data: bytes | None = None,
    ) -> None:
        self.path = path
        self.cache_hit = cache_hit
        self.key = key  # the kernel cache key of the shared object, when it came from the cache
        self.source_text = source
        self._handle = cache.load_shared_object(path, data) if path is not None else None
        if path is not None:
            team.install()  # calls after a pause hold their OpenMP team (tilework.runtime.team)
        tramp = getattr(self._handle, "tw_call_objects", None) if self._handle is not None else None
        if tramp is not None:
            tramp.restype = ctypes.c_int32
        self.kernels: dict[str, Kernel] = {}
        for info in infos:
            assert self._handle is not None
            try:
                fn = getattr(self._handle, info.symbol)
            except AttributeError:
                raise BuildError(f"shared object {path} has no kernel symbol {info.symbol} (for {info.name})") from None
            fn.restype = ctypes.c_int32
            func = funcs.get(info.name) if funcs is not None else None
            self.kernels[info.name] = Kernel(info, fn, self, func, tramp)

    def __getitem__(self, name: str) -> Kernel:
        try:
            return self.kernels[name]
        except KeyError:
            raise KeyError(f"no kernel {name!r} in the library (has: {', '.join(self.kernels) or 'none'})") from None

    @property
    def functions(self) -> Mapping[str, KernelInfo]:
        return {name: k.info for name, k in self.kernels.items()}

    def address(self, name: str) -> int:
        """The address of kernel ``name``'s C function in this process (a caller in C calls it
        as ``int32_t f(void* const* data, const int64_t* syms)``; the module must stay alive)."""
        return int(self[name]._fnptr.value or 0)

    def source(self) -> str:
        if self.source_text is None and self.path is not None and self.path.with_suffix(".c").exists():
            self.source_text = self.path.with_suffix(".c").read_text()
        return self.source_text or ""

    def to_bytes(self) -> bytes:
        """The shared object's bytes (empty for a module without kernels)."""
        return self.path.read_bytes() if self.path is not None else b""

    @staticmethod
    def from_native(data: bytes, functions: Mapping[str, KernelInfo], funcs: Mapping[str, TensorFunc] | None = None) -> "CKernelModule":
        """Load a module from shared-object bytes and its function table (``funcs``, the
        kernels' TensorFuncs, enable the checked ``Kernel.run``). Runs native code from the
        bytes: only for bytes the caller trusts."""
        infos = list(functions.values())
        if not infos:
            return CKernelModule(None, [], funcs)
        if not data:
            raise BuildError("no shared-object bytes for a kernel module with kernels")
        path = toolchain.store_shared_object(data)
        try:
            return CKernelModule(path, infos, funcs, cache_hit=True, data=data)
        except OSError as e:
            raise BuildError(f"the native kernel library ({len(data)} bytes) does not load on this machine: {e}") from e


def build_library(funcs: Mapping[str, TensorFunc]) -> CKernelModule:
    """Compile every kernel of ``funcs`` (name -> TensorFunc) into one shared object (a large
    library in units compiled in parallel, then linked: ``CModule.units``), or load the cached
    shared object; ``lib.cache_hit`` tells which."""
    for name, f in funcs.items():
        if not isinstance(f, TensorFunc):
            raise TypeError(f"build_library: {name} is not a TensorFunc")
    if not funcs:
        return CKernelModule(None, [], {}, cache_hit=True, source="")
    mod = emit_module(funcs)
    result = toolchain.compile_source(mod.text, mod.lines, mod.units)
    infos = [KernelInfo.of(n, mod.symbols[n], f) for n, f in funcs.items()]
    try:
        return CKernelModule(result.path, infos, funcs, cache_hit=result.cache_hit, source=mod.text, key=result.key, data=result.data)
    except OSError as e:
        if not result.cache_hit:
            raise BuildError(f"the kernel library {result.path} just built does not load: {e}") from e
        toolchain.set_aside(result, f"it does not load ({e})")
    result = toolchain.compile_source(mod.text, mod.lines, mod.units)
    return CKernelModule(result.path, infos, funcs, cache_hit=result.cache_hit, source=mod.text, key=result.key, data=result.data)
