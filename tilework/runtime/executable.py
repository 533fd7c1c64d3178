"""Executable: VM bytecode, constants, loop-level kernels and their compiled modules.

``save(path)`` writes the data-only file format (``tilework.runtime.archive``;
``docs/executable-format.md``): bytecode as JSON data, constants as raw little-endian arrays,
the kernels' loop-level functions as text IR, and each kernel module's function table with its
native bytes. ``load(path)`` reads it back and runs nothing from the file: kernels are rebuilt
from the stored loop IR by the target that made them (its kernel cache makes that as fast as
loading a shared object when the cache is warm), library calls are resolved by name in this
process's registry. Only ``trust_native=True`` uses the native code stored in the file (for
machines without a compiler, and files the user trusts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tilework.errors import BuildError, RuntimeCheckError, TileworkError
from tilework.ir.kernel_abi import call_checker
from tilework.ir.loop import TensorFunc
from tilework.runtime import bytecode
from tilework.runtime.archive import Archive, ArchiveWriter, FormatError
from tilework.runtime.bytecode import VMFunction
from tilework.runtime.extern import lookup_extern
from tilework.runtime.kernels import KernelInfo, KernelModule, kernel_loader, loop_ir_digest, loop_ir_text
from tilework.text import parse

KIND = "tilework.executable"


class Executable:
    """Bytecode by function name, the constant pool, the kernels' loop-level functions (parsed
    from the file's loop IR only when asked for) and their compiled modules."""

    def __init__(
        self,
        functions: dict[str, VMFunction],
        constants: list[np.ndarray],
        kernel_funcs: Mapping[str, TensorFunc] | None,
        modules: Sequence[KernelModule] = (),
        meta: Mapping[str, Any] | None = None,
        *,
        loop_ir: str | None = None,
    ) -> None:
        self.functions = functions
        self.constants = constants
        self.modules = list(modules)
        self.meta = dict(meta or {})
        self._kernel_funcs = None if kernel_funcs is None else dict(kernel_funcs)
        self._loop_ir = loop_ir
        # True for an executable read from a file (``load_file``): its bytecode is not trusted
        # to call kernels right, so a VM checks every kernel and library call (docs/errors.md)
        self.untrusted = False
        # said after a call's wrong argument count (``tilework.load`` of a compiled model's file)
        self.call_hint = ""

    @property
    def kernel_funcs(self) -> dict[str, TensorFunc]:
        if self._kernel_funcs is None:
            self._kernel_funcs = _parse_loop_ir("the executable", self._loop_ir) if self._loop_ir else {}
        return self._kernel_funcs

    def loop_ir(self) -> str:
        """The kernels as text IR (what the file stores)."""
        if self._loop_ir is None:
            self._loop_ir = loop_ir_text(self.kernel_funcs)
        return self._loop_ir

    def kernel_callables(self, private: bool = False) -> dict[str, Callable[..., Any]]:
        """``name -> f(*buffers, sym_values)`` for the VM's kernel calls. ``private``: for a
        caller that runs one call at a time (a VM's set of steps), kernels that offer it
        (``kernel.vm_call()``, else ``kernel.private()``) come with argument buffers of their
        own and no lock. For an ``untrusted`` executable each call is first checked against the kernel's loop IR
        (``tilework.ir.kernel_abi.call_checker``: dtypes, layout, shapes at the sym values)."""
        out: dict[str, Callable[..., Any]] = {}
        funcs = self.kernel_funcs if self.untrusted else {}
        for module in self.modules:
            for name in module.functions:
                kernel = module[name]
                direct = getattr(kernel, "vm_call", None) if private and not self.untrusted else None
                if direct is not None:  # called as the VM calls, f(*arrays, sym_values)
                    out[name] = direct()
                    continue
                make = getattr(kernel, "private", None) if private else None
                kernel = make() if make is not None else kernel
                if self.untrusted:
                    func = funcs.get(name)
                    if func is None:
                        raise FormatError(f"kernel {name!r} has no loop IR to check its calls against")
                    out[name] = _checked_kernel_adapter(kernel, call_checker(func, f"kernel {name}"))
                else:
                    out[name] = _kernel_adapter(kernel)
        return out

    def stats(self) -> dict[str, int]:
        return {
            "functions": len(self.functions),
            "instructions": sum(len(f.code) for f in self.functions.values()),
            "kernels": sum(len(m.functions) for m in self.modules),
            "constants": len(self.constants),
            "constant_bytes": int(sum(c.nbytes for c in self.constants)),
        }

    def __repr__(self) -> str:
        st = self.stats()
        targets = ",".join(m.target for m in self.modules) or "none"
        return f"Executable({', '.join(self.functions)}: {st['instructions']} instructions, {st['kernels']} kernel(s) on {targets}, {st['constants']} constant(s))"

    # -- persistence ----------------------------------------------------------------------

    def save(self, path: str, *, extra: Mapping[str, Any] | None = None, arrays: Mapping[str, Sequence[np.ndarray]] | None = None, texts: Mapping[str, str] | None = None) -> None:
        """Write the executable to ``path`` (atomically, ``tilework.runtime.atomic``: a path
        that is not a regular file is refused, a symbolic link is written through, a failed
        write names the file and leaves the old one). ``extra`` (JSON data), ``arrays``
        (named groups of arrays) and ``texts`` travel with it for a caller that reads them
        back from ``load_file`` (``tilework.compiled.CompiledModel`` keeps its signature,
        weights and module text there)."""
        w = ArchiveWriter()
        consts = [w.add_array(f"constant/{i}", c) for i, c in enumerate(self.constants)]
        text = self.loop_ir()
        loop_ir = w.add_text("kernels.tir", text) if text else None
        digest = loop_ir_digest(text)
        modules = []
        for m in self.modules:
            _remember(m, digest)
            native = m.to_bytes()
            modules.append({
                "target": m.target,
                "functions": [info.to_dict() for info in m.functions.values()],
                "native": w.add_bytes(f"native/{m.target}", native) if native else None,
            })
        meta: dict[str, Any] = {
            "kind": KIND,
            "meta": _json_safe(self.meta),
            "functions": [bytecode.to_data(f) for f in self.functions.values()],
            "constants": consts,
            "kernels": {"loop_ir": loop_ir, "modules": modules},
            "extra": _json_safe(dict(extra or {})),
            "arrays": {name: [w.add_array(f"{name}/{i}", a) for i, a in enumerate(group)] for name, group in (arrays or {}).items()},
            "texts": {name: w.add_text(name, t) for name, t in (texts or {}).items()},
        }
        w.write(path, meta)

    @staticmethod
    def load(path: str, *, trust_native: bool = False) -> "Executable":
        return load_file(path, trust_native=trust_native).executable


@dataclass
class LoadedFile:
    """An executable file read back: the executable and what its writer stored beside it."""

    executable: Executable
    extra: dict[str, Any]
    arrays: dict[str, list[np.ndarray]]
    texts: dict[str, str]


def load_file(path: str, *, trust_native: bool = False) -> LoadedFile:
    """Read an executable file; see the module docstring. Every problem is a ``TileworkError``
    naming the file."""
    ar = Archive(path)
    meta = ar.meta
    if meta.get("kind") != KIND:
        raise FormatError(f"{path!r} is a tilework file of kind {meta.get('kind')!r}, not an executable")
    consts_meta = meta.get("constants")
    if not isinstance(consts_meta, list):
        raise FormatError(f"{path!r}: malformed constant table")
    constants = [ar.array(e) for e in consts_meta]
    raw_funcs = meta.get("functions")
    if not isinstance(raw_funcs, list):
        raise FormatError(f"{path!r}: malformed function list")
    try:
        functions = {f.name: f for f in (bytecode.from_data(d, len(constants)) for d in raw_funcs)}
    except TileworkError as e:
        raise FormatError(f"{path!r}: {e}") from None
    loop_ir, kernel_funcs, modules = _load_kernels(ar, meta.get("kernels"), trust_native)
    exe_meta = meta.get("meta") or {}
    if not isinstance(exe_meta, dict):
        raise FormatError(f"{path!r}: malformed executable metadata")
    exe = Executable(functions, constants, kernel_funcs, modules, dict(exe_meta), loop_ir=loop_ir)
    exe.untrusted = not trust_native  # a file trusted with native code needs no checked calls
    _check_calls(path, exe)
    arrays_meta = meta.get("arrays") or {}
    texts_meta = meta.get("texts") or {}
    if not isinstance(arrays_meta, dict) or not isinstance(texts_meta, dict):
        raise FormatError(f"{path!r}: malformed array or text table")
    arrays = {str(k): [ar.array(e) for e in v] for k, v in arrays_meta.items() if isinstance(v, list)}
    texts = {str(k): ar.text(v) for k, v in texts_meta.items()}
    extra = meta.get("extra")
    return LoadedFile(exe, extra if isinstance(extra, dict) else {}, arrays, texts)


def _load_kernels(ar: Archive, kernels: Any, trust_native: bool) -> tuple[str, dict[str, TensorFunc] | None, list[KernelModule]]:
    """The loop IR text, its functions (None while nothing needed them parsed) and the modules.
    A module this machine built earlier from the very same text is taken from the kernel cache
    without parsing anything; otherwise the text is parsed and the target rebuilds it."""
    if not isinstance(kernels, dict) or not isinstance(kernels.get("modules"), list):
        raise FormatError(f"{ar.path!r}: malformed kernel table")
    text = ar.text(kernels["loop_ir"]) if kernels.get("loop_ir") is not None else ""
    digest = loop_ir_digest(text)
    parsed: list[dict[str, TensorFunc]] = []

    def funcs() -> dict[str, TensorFunc]:
        if not parsed:
            parsed.append(_parse_loop_ir(ar.path, text) if text else {})
        return parsed[0]

    modules: list[KernelModule] = []
    for entry in kernels["modules"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("target"), str) or not isinstance(entry.get("functions"), list):
            raise FormatError(f"{ar.path!r}: malformed kernel module entry")
        try:
            table = {i.name: i for i in (KernelInfo.from_dict(d) for d in entry["functions"] if isinstance(d, dict))}
        except TileworkError as e:
            raise FormatError(f"{ar.path!r}: {e}") from None
        try:
            loader = kernel_loader(entry["target"])
        except TileworkError as e:
            raise FormatError(f"{ar.path!r}: {e}") from None
        module = None if trust_native else loader.cached(digest, table)
        if module is None:
            unknown = [n for n in table if n not in funcs()]
            if unknown:
                raise FormatError(f"{ar.path!r}: kernel module {entry['target']!r} lists functions without loop IR: {', '.join(unknown[:5])}")
            module_funcs = {n: funcs()[n] for n in table}
            if trust_native and entry.get("native") is not None:
                module = loader.from_native(bytes(ar.section(entry["native"])), table, module_funcs)
            else:
                try:
                    module = loader.build(module_funcs)
                except BuildError as e:
                    hint = " (the file holds native code for them: tilework.load(path, trust_native=True) uses it, if you trust the file)" if entry.get("native") is not None else ""
                    raise BuildError(f"{ar.path!r}: cannot rebuild its {entry['target']} kernels from their loop IR{hint}: {e}") from None
                loader.remember(digest, module)
        for name, info in table.items():
            have = module.functions.get(name)
            if have is None or (len(have.buffers), have.dtypes, have.num_outputs, len(have.syms)) != (len(info.buffers), info.dtypes, info.num_outputs, len(info.syms)):
                raise FormatError(f"{ar.path!r}: kernel {name!r} does not have the signature its function table states")
        modules.append(module)
    return text, (parsed[0] if parsed else None), modules


def _parse_loop_ir(path: str, text: str) -> dict[str, TensorFunc]:
    try:
        mod = parse(text)
    except TileworkError as e:
        raise FormatError(f"{path!r}: its loop IR does not parse: {e}") from None
    funcs = dict(mod.tensor_funcs())
    if len(funcs) != len(mod):
        raise FormatError(f"{path!r}: its loop IR holds functions that are not loop-level kernels")
    return funcs


def _check_calls(path: str, exe: Executable) -> None:
    """Every callee the bytecode names must exist here: library functions in this process's
    registry, kernels in the loaded modules, VM functions in the file, builtins in the VM."""
    from tilework.runtime.builtins import BIND, BUILTINS

    kernels = {n for m in exe.modules for n in m.functions}
    for f in exe.functions.values():
        for ins in f.code:
            if ins[0] != "call":
                continue
            kind, name = ins[2]
            if kind == "extern" and lookup_extern(name) is None:
                raise FormatError(f"{path!r}: {f.name} calls library function {name!r}, which is not registered here (is the backend that provides it installed?)")
            if kind == "kernel" and name not in kernels:
                raise FormatError(f"{path!r}: {f.name} calls kernel {name!r}, which the file does not hold")
            if kind == "func" and name not in exe.functions:
                raise FormatError(f"{path!r}: {f.name} calls function {name!r}, which the file does not hold")
            if kind == "builtin" and name not in BUILTINS and name not in BIND:
                raise FormatError(f"{path!r}: {f.name} calls VM builtin {name!r}, which does not exist")


def _remember(module: KernelModule, digest: str) -> None:
    try:
        kernel_loader(module.target).remember(digest, module)
    except TileworkError:
        pass  # a target not registered here keeps no records


def _json_safe(v: Any) -> Any:
    """``v`` with tuples as lists and anything JSON cannot hold as its string."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else str(v)
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    return str(v)


def _kernel_adapter(kernel: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> None:
        kernel(args[:-1], args[-1])

    return call


def _checked_kernel_adapter(kernel: Callable[..., Any], check: Callable[[Sequence[Any], Any], None]) -> Callable[..., Any]:
    def call(*args: Any) -> None:
        if not args:
            raise RuntimeCheckError("a kernel call without arguments")
        arrays, sym_values = args[:-1], args[-1]
        check(arrays, sym_values)
        kernel(arrays, sym_values)

    return call


__all__ = ["Executable", "LoadedFile", "load_file"]
