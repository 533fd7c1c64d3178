"""Ahead-of-time export: an executable as a standalone C library (no Python at run time).

``export_c(exe, out_dir, bind={"main": weights})`` writes into ``out_dir``:

- ``kernels.c``: the kernels, emitted from the executable's loop IR by the CPU target's emitter
  (``tilework.codegen.c.emit``: the very text the VM's kernel library is compiled from, so
  built with the same compiler and flags they compute the same bits);
- ``model.c``: each graph function as straight-line C (``tilework.export.graph_c``: the
  bytecode compiled away, the run-time shape checks and their messages kept), the function
  table and the layout of the weights file it expects;
- ``model.twb``: the constants and the bound weights, one binary file that the library maps
  read-only at ``tw_model_create`` (format below);
- ``tw_model.h`` (the API), ``tw_internal.h``, ``tw_runtime.c`` (checks, memory, the API),
  ``quant_kernels.c``/``tw_blas.c`` when the model calls those libraries, ``tw_run.c`` (a
  program that runs a function on ``.npy`` files), ``tw_generate.c`` and ``llm_config.h`` for a
  decoder exported with ``llm=...``, and ``CMakeLists.txt`` and a ``Makefile`` that build
  ``libtwmodel.so``, ``libtwmodel.a`` and the programs with the system C compiler;
- ``.tilework-export``: the names, SHA-256 digests and stats of the files above
  (``tilework.export.manifest``). An export replaces only files that a previous export listed
  there and that did not change since; any other file of the same name is refused
  (``force=True``, ``tilework export --force``, replaces it). A file a previous export listed
  that this one does not write (``tw_generate.c`` after an LLM) is removed when unchanged, else
  left with a warning. Each file is written atomically (``tilework.runtime.atomic``).

``bind`` fixes the trailing parameters of functions to arrays (a compiled model's weights, an
LLM's weights shared by ``prefill`` and ``decode``): they go into ``model.twb`` once (arrays
shared by several functions are stored once) and the C API takes only the leading inputs.

Memory: a planned storage whose size is bounded (``plan_memory``'s static arenas) gets a fixed
offset in one static pool the model allocates at create; a storage sized per call comes from
the model's arena of size-class blocks; outputs and unplanned tensors are blocks kept until the
next run (``c/tw_runtime.c``).

The weights file (version 1, little-endian): magic ``TWBLOB\\r\\n``, ``u32`` version, ``u32``
array count, ``u64`` export id (the library refuses a file of another export), ``u64`` zero, then
per array ``u64`` offset and ``u64`` byte count, then the raw row-major arrays, each at a
multiple of 64 bytes.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import struct
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import BinaryIO, Mapping, Sequence

import numpy as np

from tilework.backend.quant import families_of, source as quant_source
from tilework.codegen.c.emit import emit_module
from tilework.codegen.c.toolchain import compiler_flags
from tilework.errors import BuildError, TileworkError
from tilework.export.externs import QUANT_PREFIXES, ExportError, declarations, extra_sources
from tilework.export.graph_c import DTYPES, FunctionC, ModuleText, c_int, c_string, call_depth_regs, check_kernel_symbols, dl_type, dtype_index
from tilework.export.manifest import MANIFEST, Entry, check_overwrite, remove_stale, write_manifest
from tilework.ir.dtype import DTYPE_TABLE, dtype_name
from tilework.runtime.atomic import write_atomic, write_bytes_atomic
from tilework.runtime.executable import Executable
from tilework.runtime.kernels import KernelInfo

MAGIC = b"TWBLOB\r\n"
BLOB_VERSION = 1
ALIGN = 64
MAX_NDIM = 16
RUNTIME_FILES = ("tw_model.h", "tw_internal.h", "tw_runtime.c", "tw_run.c", "tw_npy.h")
LLM_FILES = ("tw_generate.c",)


@dataclass(frozen=True)
class ExportResult:
    """What ``export_c`` wrote: the directory, the weights file, the exported functions with
    their input names, and the C sources of the library."""

    out_dir: Path
    weights: Path
    functions: dict[str, tuple[str, ...]]
    sources: tuple[str, ...]
    export_id: int


def arrays_of(exe: Executable, bind: Mapping[str, Sequence[np.ndarray]]) -> tuple[list[np.ndarray], dict[str, list[int]]]:
    """The weights file's arrays (constants first, then every bound array once) and, per
    function, the array index of each bound parameter."""
    arrays: list[np.ndarray] = list(exe.constants)
    seen: dict[int, int] = {}
    bound: dict[str, list[int]] = {}
    for name, values in bind.items():
        if name not in exe.functions:
            raise ExportError(f"bind names function {name!r}, which the executable does not have (it has: {', '.join(exe.functions)})")
        params = exe.functions[name].params
        if len(values) > len(params):
            raise ExportError(f"{name} takes {len(params)} parameters, {len(values)} were bound")
        idx = []
        for a in values:
            key = id(a)
            if key not in seen:
                seen[key] = len(arrays)
                arrays.append(np.asarray(a))
            idx.append(seen[key])
        bound[name] = idx
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray):
            raise ExportError(f"constant {i} is a {type(a).__name__}, not an array: it cannot go into the weights file")
        if a.ndim > MAX_NDIM:
            raise ExportError(f"an array of rank {a.ndim} (the export holds at most {MAX_NDIM})")
    return arrays, bound


def model_source(exe: Executable, kernels: dict[str, tuple[KernelInfo, str]], arrays: list[np.ndarray], bound: dict[str, list[int]], imported: bool = False) -> tuple[str, list[str]]:
    """The text of model.c (with the id left as ``@ID@``) and the library calls it makes. With
    ``imported`` the kernels and library calls are function pointers that the loader sets by
    name (``tw_native_set_import``) to the functions already loaded in the process."""
    texts, externs = model_units(exe, kernels, arrays, bound, imported)
    return texts[0], externs


def model_units(exe: Executable, kernels: dict[str, tuple[KernelInfo, str]], arrays: list[np.ndarray], bound: dict[str, list[int]], imported: bool = False, parts: int = 1) -> tuple[list[str], list[str]]:
    """model.c as up to ``parts`` translation units (``model_source``'s text where one), and
    the library calls it makes. Split (``imported`` only: what ``tilework.export.native``
    compiles, a unit per compile job), the graph functions are spread over the units by the
    size of their C, the first unit defines the import slots and holds the tables and entry
    points, and what the units share is declared in each with hidden visibility (SmolLM2's
    prefill and decode: one 400 KB unit took 2 s of GCC)."""
    module = ModuleText()
    func_symbols = {name: f"twf_{i}" for i, name in enumerate(exe.functions)}
    split = imported and parts > 1 and len(exe.functions) > 1
    linkage = "TW_PRIVATE" if split else "static"
    static_bytes = [0]

    def static_offset(capacity: int) -> int:
        off = static_bytes[0]
        static_bytes[0] += -(-capacity // ALIGN) * ALIGN
        return off

    bodies = []
    externs: list[str] = []
    for i, (name, fn) in enumerate(exe.functions.items()):
        externs += [ins[2][1] for ins in fn.code if ins[0] == "call" and ins[2][0] == "extern"]
        bodies.append(FunctionC(fn, i, module, kernels, func_symbols, len(exe.constants), static_offset, linkage).translate())
    externs = sorted(set(externs))
    stack = call_depth_regs(exe.functions) + 2 * max((len(f.params) for f in exe.functions.values()), default=0)

    entries, table = [], []
    for name in bound or {n: [] for n in exe.functions}:
        fn = exe.functions[name]
        idx = bound.get(name, [])
        lead = len(fn.params) - len(idx)
        sym = func_symbols[name]
        lines = [
            f"static int twe_{sym}(tw_model* m, const tw_val* in, tw_val* ret) {{",
            f"    tw_val* a = twrt_push_regs(m, {len(fn.params)});",
            f"    for (int i = 0; i < {lead}; ++i) a[i] = in[i];",
        ]
        if idx:
            lines.append(f"    static const int32_t bound_[] = {{{', '.join(map(str, idx))}}};")
            lines.append(f"    for (int i = 0; i < {len(idx)}; ++i) a[{lead} + i] = *twrt_array(m, bound_[i]);")
        lines += [f"    return {sym}(m, a, ret);", "}"]
        entries.append("\n".join(lines))
        table.append(f"    {{{c_string(name)}, {lead}, {c_string(', '.join(fn.params[:lead]))}, twe_{sym}}},")

    nbytes = ", ".join(c_int(int(a.nbytes)) for a in arrays) or "0"
    dts = ", ".join(str(dtype_index(dtype_name(a.dtype))) for a in arrays) or "0"
    ndims = ", ".join(str(a.ndim) for a in arrays) or "0"
    shapes = ",\n    ".join("{" + ", ".join(c_int(int(d)) for d in a.shape) + "}" if a.ndim else "{0}" for a in arrays) or "{0}"
    dtypes = ",\n    ".join(f"{{{c_string(n)}, {DTYPE_TABLE[n].itemsize}, {dl_type(n)[0]}, {dl_type(n)[1]}}}" for n in DTYPES)
    pointer = "int32_t (*{})(void* const* data, const int64_t* syms);"
    storage = "TW_PRIVATE" if split else "static"  # of the import slots' definitions (in the first unit)
    if imported:
        kernel_decls = [f"{storage} {pointer.format(sym)}" for _, sym in kernels.values()]
        names = [sym for _, sym in kernels.values()] + [line.split("(*", 1)[1].split(")", 1)[0] for line in declarations(externs, True)]
        slots = ",\n    ".join(f"{{{c_string(n)}, (void*)&{n}}}" for n in names) or "{NULL, NULL}"
        import_table = [
            f"static const struct {{ const char* name; void* slot; }} imports_[] = {{\n    {slots}}};",
            f"int tw_native_num_imports(void) {{ return {len(names)}; }}",
            f"const char* tw_native_import_name(int i) {{ return i >= 0 && i < {len(names)} ? imports_[i].name : NULL; }}",
            "int tw_native_set_import(int i, void* fn) {",
            f"    if (i < 0 || i >= {len(names)}) return 1;",
            "    memcpy(imports_[i].slot, &fn, sizeof fn);",
            "    return 0;",
            "}",
        ]
    else:
        kernel_decls = [f"int32_t {sym}(void* const* data, const int64_t* syms);" for _, sym in kernels.values()]
        import_table = []
    head = [
        "/* generated by tilework export: the graph functions of the model as C (see tilework/export/aot.py) */",
        "#include <inttypes.h>",
        "#include <math.h>",
        "#include <stddef.h>",
        "#include <stdint.h>",
        *(["#include <string.h>"] if imported else []),
        '#include "tw_internal.h"',
        "",
    ]
    if split:  # what every unit shares: the import slots and the graph functions, hidden in the library
        head += [
            "#if defined(__GNUC__)",
            '#define TW_PRIVATE __attribute__((visibility("hidden")))',
            "#else",
            "#define TW_PRIVATE",
            "#endif",
            *(f"extern TW_PRIVATE {pointer.format(sym)}" for _, sym in kernels.values()),
            *declarations(externs, True, "extern TW_PRIVATE"),
            "",
        ]
    shared = [*module.decls, "", *(f"{linkage} int {s}(tw_model* m, const tw_val* args, tw_val* ret);" for s in func_symbols.values()), ""]
    first = [
        "/* the kernels (kernels.c) and library calls */",
        *kernel_decls,
        *declarations(externs, imported, storage),
        *import_table,
        "",
        f"const tw_dtype_desc tw__dtypes[] = {{\n    {dtypes}}};",
        f"const int32_t tw__num_dtypes = {len(DTYPES)};",
        "",
    ]
    tail = [
        *entries,
        "",
        f"static const tw_function_desc functions_[] = {{\n{chr(10).join(table)}\n}};",
        f"static const int64_t array_nbytes_[] = {{{nbytes}}};",
        f"static const int32_t array_dtype_[] = {{{dts}}};",
        f"static const int32_t array_ndim_[] = {{{ndims}}};",
        f"static const int64_t array_shape_[][{MAX_NDIM}] = {{\n    {shapes}}};",
        "const tw_export_info tw__info = {",
        "    UINT64_C(@ID@),",
        f"    {len(arrays)}, array_nbytes_, array_dtype_, array_ndim_, &array_shape_[0][0],",
        f"    {static_bytes[0]}, {stack}, {len(table)}, functions_,",
        "};",
        "",
    ]
    if not split:
        return ["\n".join([*head, *first, *shared, *bodies, "", *tail])], externs
    groups: list[list[str]] = [[] for _ in range(min(parts, len(bodies)))]
    for body in sorted(bodies, key=len, reverse=True):  # the largest first, each to the lightest unit
        min(groups, key=lambda g: sum(map(len, g))).append(body)
    return ["\n".join([*head, *(first if i == 0 else []), *shared, *g, "", *(tail if i == 0 else [])]) for i, g in enumerate(groups)], externs


def make_export_id(texts: Sequence[str], arrays: Sequence[np.ndarray]) -> int:
    """The id tying a library to its arrays: a digest of its C and of each array's dtype and
    shape (63 bits)."""
    digest = hashlib.sha256()
    for part in (*texts, *(f"{a.dtype.str}{a.shape}" for a in arrays)):
        digest.update(part.encode())
    return int.from_bytes(digest.digest()[:8], "little") & ((1 << 63) - 1)


def _write_blob(path: Path, arrays: list[np.ndarray], export_id: int) -> str:
    """Write the weights file; returns its SHA-256."""
    header = bytearray(MAGIC + struct.pack("<IIQQ", BLOB_VERSION, len(arrays), export_id, 0))
    table = bytearray()
    offset = len(header) + 16 * len(arrays)
    offsets = []
    for a in arrays:
        offset = -(-offset // ALIGN) * ALIGN
        offsets.append(offset)
        offset += a.nbytes
    for a, off in zip(arrays, offsets):
        table += struct.pack("<QQ", off, a.nbytes)

    digest = hashlib.sha256()

    def put(fh: BinaryIO) -> None:
        def emit(data: bytes | bytearray) -> None:
            digest.update(data)
            fh.write(data)

        emit(header)
        emit(table)
        pos = len(header) + len(table)
        for a, off in zip(arrays, offsets):
            emit(b"\0" * (off - pos))
            data = np.ascontiguousarray(a)
            if data.dtype.byteorder == ">":
                data = data.astype(data.dtype.newbyteorder("<"))
            emit(data.tobytes())
            pos = off + a.nbytes

    write_atomic(path, put)
    return digest.hexdigest()


def _build_files(sources: Sequence[str], llm: bool) -> tuple[str, str]:
    flags = shlex.join(f for f in compiler_flags() if f != "-shared")  # the VM's flags on this machine (the build files add -shared)
    srcs = " ".join(sources)
    programs = ["tw_run", *(["tw_generate"] if llm else [])]
    cmake = "\n".join([
        "# generated by tilework export",
        "cmake_minimum_required(VERSION 3.10)",
        "project(twmodel C)",
        'if(NOT CMAKE_BUILD_TYPE)\n  set(CMAKE_BUILD_TYPE Release)\nendif()',
        f'set(TW_CFLAGS {flags} CACHE STRING "flags of the exported kernels (those the tilework VM compiles them with)")',
        "separate_arguments(TW_CFLAGS_LIST UNIX_COMMAND \"${TW_CFLAGS}\")",
        f"set(TW_SOURCES {srcs})",
        "add_library(twmodel_objects OBJECT ${TW_SOURCES})",
        "target_compile_options(twmodel_objects PRIVATE ${TW_CFLAGS_LIST})",
        "set_target_properties(twmodel_objects PROPERTIES POSITION_INDEPENDENT_CODE ON)",
        "add_library(twmodel SHARED $<TARGET_OBJECTS:twmodel_objects>)",
        "add_library(twmodel_static STATIC $<TARGET_OBJECTS:twmodel_objects>)",
        "set_target_properties(twmodel_static PROPERTIES OUTPUT_NAME twmodel)",
        "target_link_libraries(twmodel PRIVATE -fopenmp m)",
        "target_link_libraries(twmodel_static INTERFACE -fopenmp m)",
        *(f"add_executable({p} {p}.c)\ntarget_link_libraries({p} PRIVATE twmodel m)\nset_target_properties({p} PROPERTIES BUILD_RPATH \"${{CMAKE_BINARY_DIR}}\")" for p in programs),
        "",
    ])
    objs = " ".join(s.replace(".c", ".o") for s in sources)
    make = "\n".join([
        "# generated by tilework export: make (CC, TW_CFLAGS may be overridden)",
        "CC ?= cc",
        f"TW_CFLAGS ?= {flags}",
        "CFLAGS_ALL = $(TW_CFLAGS)",
        f"OBJS = {objs}",
        "",
        f"all: libtwmodel.so libtwmodel.a {' '.join(programs)}",
        "",
        "%.o: %.c tw_internal.h tw_model.h",
        "\t$(CC) $(CFLAGS_ALL) -c $< -o $@",
        "",
        "libtwmodel.so: $(OBJS)",
        "\t$(CC) $(CFLAGS_ALL) -shared -o $@ $(OBJS) -lm",
        "",
        "libtwmodel.a: $(OBJS)",
        "\tar rcs $@ $(OBJS)",
        "",
        *(f"{p}: {p}.c libtwmodel.so\n\t$(CC) -O2 -o $@ {p}.c -L. -ltwmodel -Wl,-rpath,'$$ORIGIN' -lm\n" for p in programs),
        "clean:",
        f"\trm -f $(OBJS) libtwmodel.so libtwmodel.a {' '.join(programs)}",
        "",
        ".PHONY: all clean",
        "",
    ])
    return cmake, make


def _resource(name: str) -> bytes:
    return resources.files("tilework.export.c").joinpath(name).read_bytes()


ALL_FILES = ("kernels.c", "model.c", "quant_kernels.c", "tw_blas.c", *RUNTIME_FILES, *LLM_FILES, "llm_config.h", "CMakeLists.txt", "Makefile", "model.twb", MANIFEST)
"""Every name an export may write into its directory (which of them depends on the model)."""


def export_c(
    exe: Executable,
    out_dir: str | os.PathLike[str],
    *,
    bind: Mapping[str, Sequence[np.ndarray]] | None = None,
    llm: Mapping[str, int] | None = None,
    force: bool = False,
) -> ExportResult:
    """Write the C library of ``exe`` into ``out_dir`` (see the module docstring). ``bind``
    maps function names to the arrays fixed as their trailing parameters (only the functions
    named are exported when it is given; all of them otherwise). ``llm`` (for a decoder:
    ``layers``, ``kv_heads``, ``head_dim``, ``page``, ``vocab``, ``context``, and the KV cache's
    DLPack ``kv_code`` and ``kv_bits``, its pair width ``kv_pair``, and the rows of scales an int8
    pool adds after each kv head's keys ``kv_scales``) adds the C generate example. Raises ``ExportError`` for
    what C cannot run (a torch or onnxruntime library call, recursion), and when ``out_dir``
    holds a file the export would replace that a tilework export did not write (listed in
    ``out_dir/.tilework-export`` with its digest), unless ``force``. Each file is written
    atomically (``tilework.runtime.atomic``); a write that fails names the file."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TileworkError(f"cannot write {os.fspath(out_dir)!r}: {e.strerror or e}") from None
    funcs = exe.kernel_funcs
    infos = {name: info for m in exe.modules for name, info in m.functions.items()}
    missing = [n for n in infos if n not in funcs]
    if missing:
        raise ExportError(f"the executable lacks the loop IR of kernel(s) {', '.join(missing[:5])}")
    kernels_c = emit_module(funcs) if funcs else None
    symbols = kernels_c.symbols if kernels_c is not None else {}
    check_kernel_symbols(list(symbols.values()))
    kernels = {name: (infos.get(name) or KernelInfo.of(name, symbols[name], f), symbols[name]) for name, f in funcs.items()}
    arrays, bound = arrays_of(exe, dict(bind or {}))
    model_c, externs = model_source(exe, kernels, arrays, bound)
    kernel_text = kernels_c.text if kernels_c is not None else "/* no kernels */\n"
    export_id = make_export_id([model_c, kernel_text], arrays)
    model_c = model_c.replace("@ID@", str(export_id))

    texts: dict[str, bytes] = {"kernels.c": kernel_text.encode(), "model.c": model_c.encode()}
    extra = extra_sources(externs)
    for name in extra:
        if name == "quant_kernels.c":
            # one file, its AVX2 part spliced in, with the paths the model's formats take (quant.families_of)
            paths = families_of(s.rpartition(".")[2] for s in externs if s.startswith(QUANT_PREFIXES))
            texts[name] = quant_source(families=paths).encode()
        else:
            texts[name] = _resource(name)
    for name in RUNTIME_FILES + (LLM_FILES if llm else ()):
        texts[name] = _resource(name)
    if llm:
        keys = ("layers", "kv_heads", "head_dim", "page", "vocab", "context", "kv_code", "kv_bits", "kv_pair", "kv_scales")
        lines = ["/* generated by tilework export: the decoder's shapes for tw_generate.c */"]
        lines += [f"#define TW_LLM_{k.upper()} {int(llm[k])}" for k in keys]
        texts["llm_config.h"] = ("\n".join(lines) + "\n").encode()
    sources = ("model.c", "kernels.c", "tw_runtime.c", *extra)
    cmake, make = _build_files(sources, bool(llm))
    texts["CMakeLists.txt"] = cmake.encode()
    texts["Makefile"] = make.encode()
    weights = out / "model.twb"
    names = [*texts, weights.name]
    recorded = check_overwrite(out, names, force=force)
    # names first (an export cut short leaves files this manifest claims), entries once written
    write_manifest(out, {**recorded, **dict.fromkeys(names)})
    entries: dict[str, Entry | None] = {}
    for name, data in texts.items():
        write_bytes_atomic(out / name, data)
        entries[name] = Entry.written(out / name, hashlib.sha256(data).hexdigest())
    entries[weights.name] = Entry.written(weights, _write_blob(weights, arrays, export_id))
    remove_stale(out, recorded, entries, ALL_FILES)  # an earlier export's files this one does not write
    write_manifest(out, entries)
    functions = {}
    for name in bound or exe.functions:
        params = exe.functions[name].params
        functions[name] = tuple(params[: len(params) - len(bound.get(name, []))])
    return ExportResult(out, weights, functions, sources, export_id)


def build_export(out_dir: str | os.PathLike[str], tool: str = "make", *, jobs: int = 2) -> Path:
    """Build an export with ``make`` (in the directory) or ``cmake`` (in ``out_dir/build``) and
    return the directory holding ``libtwmodel.so`` and the programs. A failure is a
    ``BuildError`` carrying the tool's output."""
    out = Path(out_dir)
    if tool == "make":
        steps = [["make", f"-j{jobs}"]]
        where = out
    elif tool == "cmake":
        where = out / "build"
        # absolute: the commands run in ``out`` (a relative ``out`` would be looked for inside itself)
        steps = [["cmake", "-S", str(out.resolve()), "-B", str(where.resolve()), "-DCMAKE_BUILD_TYPE=Release"], ["cmake", "--build", str(where.resolve()), f"-j{jobs}"]]
    else:
        raise TileworkError(f"tool must be 'make' or 'cmake', got {tool!r}")
    for argv in steps:
        if shutil.which(argv[0]) is None:
            raise BuildError(f"{argv[0]} is not installed; build the export with the other tool or install it")
        proc = subprocess.run(argv, cwd=out, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"{' '.join(argv)} failed in {out}:\n{(proc.stdout + proc.stderr)[-6000:]}")
    return where


__all__ = ["ExportError", "ExportResult", "export_c", "build_export", "MAGIC", "BLOB_VERSION", "ALL_FILES"]
