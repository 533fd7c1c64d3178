"""The ``quant`` backend: ``quant_linear`` (``tilework.op.quant``) on GGUF blocks, run by a C
library of our own (``quant_kernels.c``, shipped as package data).

The library is compiled on first use through the kernel toolchain
(``tilework.codegen.c.toolchain``: the system compiler with ``-O3 -march=native -fopenmp``,
the content-hashed cache, atomic writes), never at import, with the paths (``FAMILIES``: one a
format, with its x16 layout) that are asked for: ``library_for(fmt)`` builds ``fmt``'s path alone
unless a build holding it is at hand or on its way (``library_in_background``: an LLM's first
start compiles the paths its formats take, `q` on SmolLM2 q4_1's and q8_0's, 3.0 s of GCC's CPU
where all the integer formats of 32-byte blocks took 6.9 and every path takes 17.6; fp32 the helpers
alone, 0.6 s); a build's entry points for another path refuse (error 6). Formats: ``FORMATS`` (all of
``QUANT_FORMATS`` but ``f32``, and the interleaved layouts ``q4_0x16``, ``q4_1x16``, ``q5_0x16``,
``q5_1x16``, ``q8_0x16``, ``q4_kx16``, ``q5_kx16``, ``q6_kx16``, ``q3_kx16``, ``q2_kx16``, ``iq4_nlx16``, ``iq4_xsx16`` of ``tilework.op.quant``: the same blocks, 16 rows side by side, which the GEMV reads straight
into its vectors; the same results, bit for bit, as the plain rows; and ``bf16x16``, bf16 rows
16 side by side by pairs of weights: with AVX-512 BF16 a vector of a group's rows is one
``vdpbf16ps`` operand, for the GEMV and, unpacked, the GEMM, whose bits are the plain rows';
elsewhere a plain C loop over the 16 rows).

q4_0, q4_1, q5_0, q5_1, q8_0, the k-quants (q4_k, q5_k, q6_k, q3_k, q2_k), iq4_nl and iq4_xs take the
integer path, as llama.cpp does (q5's weights are unsigned 5-bit values there, as q4's are 4-bit ones; a
q4_k super-block is 8 blocks of 32 nibbles, each with its own ``d * scale`` and ``m = -dmin *
min``, as q4_1's ``d`` and ``m``, and q5_k's the same with 5-bit values; a q6_k one 8 blocks of
32 6-bit values less 32, each half of a block with its own int8 scale: the two halves' exact
sums times their scales, added in int32, then times ``d * d_x``; q3_k the same with 3-bit values
less 4 and 6-bit scales less 32; q2_k with 2-bit values and 4-bit scales, and its 4-bit mins
times the halves' sums of ``x``'s 8-bit values, added in int32, then times ``-dmin * d_x``;
iq4_nl and iq4_xs are q8_0 whose int8 weights are looked up from their nibbles in a table of
16 values, ``vpshufb``, iq4_xs's ``d`` per 32 weights ``d * (ls - 32)``):
each row of ``x`` is quantized
once per call to 8-bit blocks of 32 (``d = max|x| / 127``, ``q = rint(x / d)``) and each block's
dot product is exact in int32 (AVX-512 VNNI ``vpdpbusd``; ``vpmaddubsw`` without VNNI), scaled
and summed in float32 in block order. The results therefore differ from
``x @ dequantize(w).T`` by the rounding of ``x``: per output at most
``sum_b max|x_b| / 254 * sum_b |w|`` over the blocks ``b`` of the row (``activation_bound``),
plus float32 rounding; about 1e-3 relative. The float32 operations are the same on the GEMV
(up to 32 rows, in passes of up to 8 over each tile of weights), the GEMM (longer prefills)
and the portable build, so a row's result has the same bits
whatever else is in the call. bf16 and f16 multiply in float32 with the weights
decoded exactly (``x`` is not quantized): ``x @ dequantize(w).T`` up to float32 rounding; but
for bf16 on a CPU with AVX-512 BF16 (``QuantLibrary.bf16dot``) the GEMV and the GEMM round ``x``
to bf16 and multiply pairs with ``vdpbf16ps``, at twice the float32 rate: off by at most ``bf16_bound`` more (``2**-8 * sum|x_k w_k|`` per output; values below
``2**-126`` count as zero there).
AVX-512 where the CPU has it, portable C otherwise, with AVX2 (+ FMA, F16C) parts where the CPU
has that: the integer path's dot products (q8_0, q4_0, q4_1, q5_0 and q5_1 in tiles of 8 weight
rows, each block read once for every row of ``x``), and the float path (bf16, f16:
``quant_float_avx2.c``, spliced into the source by ``source``; a GEMV over groups of W rows
decoded in registers, and for prefill a packed GEMM with a 6 x 16 FMA micro-kernel).

Capability ``quant.linear``: any ``quant_linear`` whose ``x`` is float32 with a known rank and
whose blocks are a 2-D uint8 tensor. It lowers to ``call_lib("quant.linear.<fmt>", x, w,
(rows, out_features, in_features))``. ``quant.linear_add``: that product plus a float32
residual of its shape, ``call_lib("quant.linear_add.<fmt>", x, w, r, dims)``.
Capability ``quant.experts``: ``expert_linear`` (a mixture of experts' products, the experts'
matrices stacked as block rows) on these formats, with ``x`` float32 ``[T, S, K]``, the blocks
2-D uint8 and ids int32/int64 ``[T, slots]``. It lowers to ``call_lib("quant.experts.<fmt>",
x, w, ids, (T, S, slots, experts, out_features, in_features))``, the library's
``tw_qexperts_<fmt>`` (``quant_experts.c``: each routed expert's rows through the kernels
above, so the bits of ``quant_linear`` on them); its extern, check and checked entry point
``qexperts`` are ``tilework.backend.quant_experts``'s.

The extern is the hot path of decoding (one call per weight matrix and token), so it trusts
the VM's arguments (C-contiguous NumPy arrays of the inferred dtypes and shapes, as
``Kernel.__call__`` does) and passes them to the library's ``tw_qlinear_packed`` as object
addresses in one per-thread argument block: about a microsecond of Python per call.
``qlinear`` is the checked entry point for direct use.
"""

from __future__ import annotations

import ctypes
import functools
import re
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from tilework.backend.base import Backend, Capability, Region, lib_call, register_backend, shape_of
from tilework.codegen import cache
from tilework.codegen.c import toolchain
from tilework.codegen.c.module import _DATA_OFFSET  # also sets GOMP_SPINCOUNT before libgomp loads
from tilework.errors import BuildError, RuntimeCheckError, TileworkError
from tilework.ir import sym
from tilework.ir.graph import Call, OpRef
from tilework.ir.info import TensorInfo
from tilework.op.quant import INTERLEAVED_FORMATS, interleaved, quant_format
from tilework.pattern.core import Pattern, is_op, wildcard
from tilework.pattern.graph import PatternMatch
from tilework.runtime.extern import register_extern, register_extern_check

FORMATS = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "f16", "q4_k", "q6_k", "q5_k", "q3_k", "q2_k", "iq4_nl", "iq4_xs", "q4_0x16", "q4_1x16", "q5_0x16", "q5_1x16",
           "q8_0x16", "bf16x16", "q4_kx16", "q5_kx16", "q6_kx16", "q3_kx16", "q2_kx16", "iq4_nlx16", "iq4_xsx16")  # the C codes' order
INT8_FORMATS = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "q4_0x16", "q4_1x16", "q5_0x16", "q5_1x16", "q8_0x16", "q4_kx16", "q5_kx16",
                "q6_kx16", "q3_kx16", "q2_kx16", "iq4_nl", "iq4_xs", "iq4_nlx16", "iq4_xsx16")  # the integer path: x quantized to 8-bit blocks of 32
# the linears' paths, one a format (its plain and x16 layouts; bf16's holds bf16 and bf16x16): a build of the library holds any of them
FAMILIES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_nl", "iq4_xs", "bf16", "f16")
INTEGER_FAMILIES = FAMILIES[:12]  # the integer path's formats
SOURCE = "quant_kernels.c"
_INCLUDE = re.compile(r'^#include "(quant_[a-z0-9_]+\.c)".*$', re.M)  # the parts of SOURCE that source() splices in
# the library's return codes -> what they mean (the export's C messages take them too)
ERROR_TEXT = {
    1: "a null data pointer",
    2: "a negative size, or in_features not a multiple of the format's block",
    3: "an unknown format code",
    4: "the decode scratch could not be allocated",
    5: "the residual to add is the output buffer itself",
    6: "the format's path is not in this build of the library",
    7: "x's dim 1 is neither 1 nor the slots, there are no experts, or the ids are neither int32 nor int64",
}


def experts_symbol(fmt: str) -> str:
    """The extern of ``expert_linear`` on ``fmt`` blocks (arguments x, w, ids, dims (T, S,
    slots, experts, out_features, in_features), out; ``tilework.backend.quant_experts``)."""
    return f"quant.experts.{fmt}"


def extern_symbol(fmt: str, add: bool = False) -> str:
    """The extern of ``quant_linear`` on ``fmt`` blocks; ``add``: of ``quant_linear(x, w) + r``
    (arguments x, w, r, dims, out)."""
    return f"quant.linear_add.{fmt}" if add else f"quant.linear.{fmt}"


def family_of(fmt: str) -> str:
    """The path (``FAMILIES``) that runs ``fmt``'s linears."""
    return fmt.removesuffix("x16")


def families_of(formats: Iterable[str]) -> tuple[str, ...]:
    """The paths the linears of ``formats`` need, in ``FAMILIES`` order (a format this library
    does not run, ``f32``, needs none; ``()``: the helpers only)."""
    return _families(family_of(f) for f in formats if f in FORMATS)


def _families(families: Iterable[str]) -> tuple[str, ...]:
    """``families`` checked, without repeats, in ``FAMILIES`` order."""
    wanted = set(families)
    unknown = wanted - set(FAMILIES)
    if unknown:
        raise TileworkError(f"unknown quant library path(s) {', '.join(sorted(unknown))}; the paths are {', '.join(FAMILIES)}")
    return tuple(f for f in FAMILIES if f in wanted)


# -- the library ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def source(portable: bool = False, vnni: bool = True, bf16dot: bool = True, families: tuple[str, ...] = FAMILIES) -> str:
    """The C source, one translation unit: ``SOURCE`` with each of its ``#include "quant_*.c"``
    lines replaced by that file (``quant_float_avx2.c``, ``quant_dequant.c``, ``quant_experts.c``). ``portable`` compiles the plain-C
    kernels even where AVX-512 or AVX2 exists, ``vnni=False`` the AVX-512BW integer dot products
    even where VNNI exists, ``bf16dot=False`` the float32 bf16 GEMM even where AVX-512 BF16
    exists. ``families``: the linears' paths compiled in (``FAMILIES`` order; the helpers are
    always there): GCC 12's CPU on the Zen 4 machine for q4_1's and q8_0's (SmolLM2) 3.0 s, each
    alone 2.5, the five formats of 32-byte blocks 6.9, q4_k's and q6_k's (a Q4_K_M file) 4.5, the
    seven k-quant and iq4 formats 12.6, every path 17.6, the helpers alone 0.6."""
    files = resources.files("tilework.backend")
    text = _INCLUDE.sub(lambda m: files.joinpath(m.group(1)).read_text(), files.joinpath(SOURCE).read_text())
    for family in FAMILIES:
        if family not in families:
            text = f"#define TWQ_WITH_{family.upper()} 0\n" + text
    if not vnni:
        text = "#define TW_QUANT_NO_VNNI 1\n" + text
    if not bf16dot:
        text = "#define TW_QUANT_NO_BF16DOT 1\n" + text
    return "#define TW_QUANT_PORTABLE 1\n" + text if portable else text


@dataclass(frozen=True)
class QuantLibrary:
    """The loaded shared object: one entry point per format, the packed-argument trampoline and
    the helpers the benchmark uses."""

    path: Path
    cache_hit: bool
    simd: bool  # AVX-512 kernels (else the portable ones)
    vnni: bool  # the integer path's dot products use AVX-512 VNNI
    bf16dot: bool  # bf16 rounds x to bf16 and uses AVX-512 BF16 dot products (GEMV and GEMM)
    families: tuple[str, ...]  # the linears' paths it holds (FAMILIES); entries has their formats only
    handle: Any
    entries: dict[str, Any]
    add_entries: dict[str, Any]  # tw_qlinear_add_<fmt>: y = x @ W.T + r
    packed: Any
    experts: dict[str, Any]  # tw_qexperts_<fmt>: expert_linear (quant_experts.c)
    experts_packed: Any

    def set_threads(self, n: int) -> None:
        """The OpenMP thread count of later calls (of every OpenMP library in the process)."""
        self.handle.tw_quant_set_threads(int(n))

    def max_threads(self) -> int:
        return int(self.handle.tw_quant_max_threads())

    def read_sum(self, a: np.ndarray) -> float:
        """Sum of a float32 array read with every thread: the memory read-bandwidth probe."""
        if a.dtype != np.float32 or not a.flags.c_contiguous:
            raise RuntimeCheckError("read_sum needs a C-contiguous float32 array")
        return float(self.handle.tw_quant_read_sum(ctypes.c_void_p(a.ctypes.data), ctypes.c_int64(a.size)))

    def quantize_x(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``x [M, K]`` as the integer path quantizes it: ``q`` (int8 ``[M, K]``), and per block of
        32 ``d`` (float32 ``[M, K/32]``) and ``sum(q)`` (int32 ``[M, K/32]``)."""
        x = np.ascontiguousarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] % 32:
            raise RuntimeCheckError(f"quantize_x needs x [M, K] with K a multiple of 32, got shape {x.shape}")
        m, k = x.shape
        q = np.empty((m, k), np.int8)
        d = np.empty((m, k // 32), np.float32)
        s = np.empty((m, k // 32), np.int32)
        rc = self.handle.tw_quant_quantize_x(x.ctypes.data, m, k, q.ctypes.data, d.ctypes.data, s.ctypes.data)
        if rc:
            raise RuntimeCheckError(f"quantize_x: the library refused the call: {ERROR_TEXT.get(rc, rc)}")
        return q, d, s

    def dequantize(self, data: np.ndarray, fmt: str, bf16: bool = False, out: np.ndarray | None = None) -> np.ndarray:
        """Rows of ``fmt`` blocks (``uint8[rows, row_bytes]``, a plain layout: not ``*x16``)
        decoded with every thread: float32 ``[rows, cols]``, the values of
        ``tilework.llm.quant.dequantize_rows`` bit for bit; ``bf16``: their bfloat16 bits
        (``uint16``, rounded to nearest even). Written into ``out`` (C-contiguous, that dtype,
        ``rows * cols`` elements) where it is given."""
        if fmt not in FORMATS or fmt in INTERLEAVED_FORMATS:
            raise RuntimeCheckError(f"dequantize: {fmt!r} is not a plain block format ({', '.join(f for f in FORMATS if f not in INTERLEAVED_FORMATS)})")
        f = quant_format(fmt)
        data = np.ascontiguousarray(data, np.uint8)
        if data.ndim != 2 or data.shape[1] % f.nbytes:
            raise RuntimeCheckError(f"dequantize: {fmt} rows must be uint8 [rows, a multiple of {f.nbytes} bytes], got shape {data.shape}")
        rows, cols = data.shape[0], data.shape[1] // f.nbytes * f.block
        dtype = np.dtype(np.uint16 if bf16 else np.float32)
        if out is None:
            out = np.empty((rows, cols), dtype)
        elif out.dtype != dtype or out.size != rows * cols or not out.flags.c_contiguous or not out.flags.writeable:
            raise RuntimeCheckError(f"dequantize: out must be a writable C-contiguous {dtype} array of {rows * cols} elements, got {out.dtype} of shape {out.shape}")
        out = out.reshape(rows, cols)
        rc = self.handle.tw_quant_dequantize(FORMATS.index(fmt), data.ctypes.data, rows, cols, out.ctypes.data, int(bf16))
        if rc:
            raise RuntimeCheckError(f"dequantize ({fmt}, rows={rows}, cols={cols}): the library refused the call: {ERROR_TEXT.get(rc, rc)}")
        return out

    def interleave(self, data: np.ndarray, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """``tilework.op.quant.interleave_rows(data, name, out)`` with every thread: the same
        bytes (``name``: a format with an interleaved layout; ``data`` uint8 rows, a multiple
        of 16)."""
        x16 = interleaved(name)
        if x16 is None:
            raise RuntimeCheckError(f"interleave: {name!r} has no interleaved layout ({', '.join(n.removesuffix('x16') for n in INTERLEAVED_FORMATS)})")
        block = quant_format(x16).nbytes
        data = np.ascontiguousarray(data, np.uint8)
        if data.ndim != 2 or data.shape[0] % 16 or data.shape[1] % block:
            raise RuntimeCheckError(f"interleave: {name} rows must be uint8 [a multiple of 16 rows, a multiple of {block} bytes], got shape {data.shape}")
        if out is None:
            out = np.empty(data.shape, np.uint8)
        elif out.dtype != np.uint8 or out.shape != data.shape or not out.flags.c_contiguous or not out.flags.writeable:
            raise RuntimeCheckError(f"interleave: out must be a writable C-contiguous uint8 array of shape {data.shape}, got {out.dtype} of shape {out.shape}")
        rc = self.handle.tw_quant_interleave(FORMATS.index(name), data.ctypes.data, data.shape[0], data.shape[1], out.ctypes.data)
        if rc:
            raise RuntimeCheckError(f"interleave ({name}, shape {data.shape}): the library refused the call: {ERROR_TEXT.get(rc, rc)}")
        return out

_Key = tuple[bool, bool, bool, tuple[str, ...]]
_LIBS: dict[_Key, QuantLibrary] = {}
_LOCK = threading.Lock()  # guards _LIBS and _BUILDING
_BUILDING: dict[_Key, threading.Lock] = {}  # a lock per build: two builds (the paths) may run at once
_BACKGROUND: dict[tuple[str, ...], threading.Thread] = {}  # the threads library_in_background started, by paths
_BACKGROUND_LOCK = threading.Lock()


def library(portable: bool = False, vnni: bool = True, bf16dot: bool = True, families: Iterable[str] = FAMILIES) -> QuantLibrary:
    """The library, compiled (or found in the kernel cache) and loaded on the first call;
    ``portable``, ``vnni`` and ``bf16dot`` as in ``source`` (the variants exist to be tested).
    Leaving out a feature the compiler's target lacks changes no code: that variant is the
    full library (a second build of the same kernels would take as long as the first).
    ``families``: the linears' paths it must hold (``library_for``: a format's); a build
    already loaded, or in the kernel cache, with every path serves any of them, and so does
    one ``library_in_background`` has on its way (waited for); else only those are compiled
    (a portable or no-VNNI variant: every path it changes, ``_variant_families``)."""
    fams = _families(families)
    asked = (portable, vnni, bf16dot, fams)
    lib = _LIBS.get(asked)
    if lib is not None:
        return lib
    if not (vnni and bf16dot):
        full = library(portable, families=fams)
        if (vnni or not full.vnni) and (bf16dot or not full.bf16dot):
            return _LIBS.setdefault(asked, full)
    if portable or not vnni:
        fams = _variant_families(fams, portable)
    key = (portable, vnni, bf16dot, fams)
    with _LOCK:
        held = _held(key)
        if held is not None:
            return _LIBS.setdefault(asked, _LIBS.setdefault(key, held))
    if not portable and vnni and bf16dot and _await_background(fams):
        with _LOCK:
            held = _held(key)
            if held is not None:
                return _LIBS.setdefault(key, held)
    with _LOCK:
        build_lock = _BUILDING.setdefault(key, threading.Lock())
    with build_lock:
        if key not in _LIBS:
            lib = _load(portable, vnni, bf16dot, fams)
            with _LOCK:
                _LIBS[key] = lib
        return _LIBS.setdefault(asked, _LIBS[key])


def _variant_families(families: tuple[str, ...], portable: bool) -> tuple[str, ...]:
    """The paths a variant build (portable, or without VNNI: there to be tested) holds for
    ``families``: every path the variant changes, where one of them is asked for (portable
    C: all of them; no VNNI: the integer formats'), so that the tests of the formats share one
    build of each variant (without VNNI, the twelve integer formats: 19.3 s of GCC's CPU where
    one each took 2.5, 30 in all). Without BF16 dot products only bf16's path changes."""
    if not families:
        return families
    if portable:
        return FAMILIES
    return _families(g for f in families for g in (INTEGER_FAMILIES if f in INTEGER_FAMILIES else (f,)))


def _await_background(families: tuple[str, ...]) -> bool:
    """Wait for the builds ``library_in_background`` started that hold ``families`` (a model's
    first start asks for each format's path while the build of all of them is on its way: one
    compile, not one more a format); whether there was one."""
    with _BACKGROUND_LOCK:
        builds = [t for fs, t in _BACKGROUND.items() if set(families) <= set(fs) and t is not threading.current_thread()]
    for t in builds:
        t.join()
    return bool(builds)


def _held(key: _Key) -> QuantLibrary | None:
    """A loaded build of ``key``'s variant holding at least its paths, else None."""
    return next((b for (p, v, f, fs), b in list(_LIBS.items()) if (p, v, f) == key[:3] and set(key[3]) <= set(fs)), None)


def library_for(fmt: str) -> QuantLibrary:
    """``library()`` holding the path of ``fmt``'s linears (``family_of``)."""
    return library(families=(family_of(fmt),))


def library_if_built() -> QuantLibrary | None:
    """A build of ``library()`` (any paths: for its helpers) where one is loaded or the kernel
    cache has one (nothing is compiled, no build is waited for), else None: for callers with a
    NumPy way of their own that should not wait for a first build (the LLM loaders' decoding
    and interleaving, while ``library_in_background`` builds it beside them). The cache is
    asked about the builds of the paths ``library_in_background`` was given, every path's and
    the helpers'."""
    lib = next((b for (p, v, f, _), b in list(_LIBS.items()) if not p and v and f), None)
    if lib is not None:
        return lib
    try:
        with _BACKGROUND_LOCK:
            started = list(_BACKGROUND)  # the paths of a model being loaded (library_in_background)
        for fams in dict.fromkeys((*started, FAMILIES, ())):
            if toolchain.cached_result(source(families=fams)) is not None:
                return library(families=fams)
    except TileworkError:
        pass
    return None


def library_ready(families: Iterable[str] = FAMILIES) -> bool:
    """Whether ``library(families=families)`` would return without compiling or waiting for a
    build: one holding those paths is loaded, or the kernel cache has one (nothing is compiled
    for the asking). Progress messages use it: a first start says what it waits for."""
    fams = _families(families)
    if _held((False, True, True, fams)) is not None:
        return True
    try:
        return any(toolchain.cached_result(source(families=held)) is not None for held in dict.fromkeys((FAMILIES, fams)))
    except TileworkError:
        return False


def library_in_background(families: Iterable[str] = FAMILIES) -> None:
    """Start making ``library(families=families)`` in a thread, for a caller with other work to
    do before it needs it (an LLM's first start loads its weights and compiles its decoder,
    seconds of other work, while the C compiler builds this library in a process of its own);
    ``library()`` waits for it. The thread, and its compiler, run at a lower priority
    (``toolchain.in_background``). A failure is left to that later call to report (it
    tries again and raises). Once per process for each set of paths. The thread is a daemon: a process that
    ends meanwhile (a model file it cannot read) does not wait for the compiler, which finishes
    on its own; its scratch directory (``.build-*`` in the cache) is then left behind."""
    fams = _families(families)

    def build() -> None:
        with toolchain.in_background():  # the foreground's own compiles come first; idle cores are this build's
            try:
                library(families=fams)
            except Exception:  # reported by the caller's own library() call
                pass

    with _BACKGROUND_LOCK:
        if fams in _BACKGROUND:
            return
        _BACKGROUND[fams] = threading.Thread(target=build, name=f"tilework-quant-library-{'-'.join(fams) or 'helpers'}", daemon=True)
        _BACKGROUND[fams].start()


def bf16dot_available() -> bool:
    """``library().bf16dot`` without building it: whether the compiler's target under the
    kernel flags has what the library's AVX-512 BF16 kernels need (its predefined macros; with
    no compiler, a build in the kernel cache says)."""
    try:
        macros = toolchain.predefined_macros()
    except BuildError:
        return library().bf16dot
    return {"__AVX512F__", "__AVX512BW__", "__F16C__", "__AVX512BF16__"} <= macros


def entry_address(name: str) -> int | None:
    """The address of the library's entry point ``name`` (``tw_qlinear_<fmt>``,
    ``tw_qlinear_add_<fmt>`` or ``tw_qexperts_<fmt>``, from the build holding ``fmt``'s path),
    None for another name."""
    m = re.fullmatch(r"tw_q(?:linear_(?:add_)?|experts_)([a-z0-9_]+)", name)
    if m is None or m.group(1) not in FORMATS:
        return None
    return ctypes.cast(getattr(library_for(m.group(1)).handle, name), ctypes.c_void_p).value


def _load(portable: bool, vnni: bool, bf16dot: bool, families: tuple[str, ...]) -> QuantLibrary:
    if families != FAMILIES and toolchain.cached_result(source(portable, vnni, bf16dot)) is not None:
        families = FAMILIES  # built before with every path: nothing to compile
    result = toolchain.compile_source(source(portable, vnni, bf16dot, families))
    handle = cache.load_shared_object(result.path, result.data)  # the verified bytes
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    entries, add_entries, experts = {}, {}, {}
    for fmt in (f for f in FORMATS if family_of(f) in families):
        fn = getattr(handle, f"tw_qlinear_{fmt}")
        fn.argtypes = [p, p, p, i64, i64, i64]
        fn.restype = ctypes.c_int32
        entries[fmt] = fn
        fn = getattr(handle, f"tw_qlinear_add_{fmt}")
        fn.argtypes = [p, p, p, p, i64, i64, i64]
        fn.restype = ctypes.c_int32
        add_entries[fmt] = fn
        fn = getattr(handle, f"tw_qexperts_{fmt}")
        fn.argtypes = [p, p, p, i64, p, i64, i64, i64, i64, i64, i64]
        fn.restype = ctypes.c_int32
        experts[fmt] = fn
    packed, experts_packed = handle.tw_qlinear_packed, handle.tw_qexperts_packed
    for fn in (packed, experts_packed):
        fn.argtypes = [p]
        fn.restype = ctypes.c_int32
    handle.tw_quant_read_sum.argtypes = [p, i64]
    handle.tw_quant_read_sum.restype = ctypes.c_double
    handle.tw_quant_set_threads.argtypes = [ctypes.c_int32]
    handle.tw_quant_set_threads.restype = None
    handle.tw_quant_max_threads.restype = ctypes.c_int32
    handle.tw_quant_simd.restype = ctypes.c_int32
    handle.tw_quant_vnni.restype = ctypes.c_int32
    handle.tw_quant_bf16dot.restype = ctypes.c_int32
    handle.tw_quant_families.restype = ctypes.c_int32
    handle.tw_quant_quantize_x.argtypes = [p, i64, i64, p, p, p]
    handle.tw_quant_quantize_x.restype = ctypes.c_int32
    handle.tw_quant_dequantize.argtypes = [ctypes.c_int32, p, i64, i64, p, ctypes.c_int32]
    handle.tw_quant_dequantize.restype = ctypes.c_int32
    handle.tw_quant_interleave.argtypes = [ctypes.c_int32, p, i64, i64, p]
    handle.tw_quant_interleave.restype = ctypes.c_int32
    simd, has_vnni, has_bf16dot = bool(handle.tw_quant_simd()), bool(handle.tw_quant_vnni()), bool(handle.tw_quant_bf16dot())
    held = tuple(f for i, f in enumerate(FAMILIES) if handle.tw_quant_families() >> i & 1)
    if held != families:
        raise BuildError(f"the quant library at {result.path} holds the paths {held}, not {families}")
    return QuantLibrary(result.path, result.cache_hit, simd, has_vnni, has_bf16dot, families, handle, entries, add_entries, packed, experts, experts_packed)


def _failure(rc: int, fmt: str, dims: tuple[int, int, int]) -> RuntimeCheckError:
    m, n, k = dims
    why = ERROR_TEXT.get(rc, f"error code {rc}")
    return RuntimeCheckError(f"quant_linear ({fmt}, rows={m}, out_features={n}, in_features={k}): the library refused the call: {why}")


# -- the checked entry point ---------------------------------------------------------------------


def row_bytes(fmt: str, in_features: int) -> int:
    return quant_format(fmt).row_bytes(in_features)


def activation_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The most the integer path's ``[M, N]`` results may differ from ``x @ w.T`` (``w`` the
    dequantized float weights ``[N, K]``) by the quantization of ``x`` alone:
    ``sum_b max|x_b| / 254 * sum_b |w|`` over the blocks of 32 (each ``x`` moves by at most half a
    step, ``d / 2``). Float32 rounding of the sums comes on top."""
    m, k = x.shape[0], x.shape[1]
    half_step = np.abs(x.astype(np.float64)).reshape(m, k // 32, 32).max(axis=2) / 254.0
    return half_step @ np.abs(w.astype(np.float64)).reshape(w.shape[0], k // 32, 32).sum(axis=2).T


def bf16_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The most the bf16 GEMM with AVX-512 BF16 may add to the error of ``x @ w.T`` (``w`` the
    bf16 weights as float ``[N, K]``, ``x [M, K]``) by rounding ``x`` to bf16: each ``x_k`` moves
    by at most ``2**-8 |x_k|`` (8 significant bits, to nearest), so an output by
    ``2**-8 * sum_k |x_k w_k|``. Float32 rounding of the sums comes on top."""
    return 2.0**-8 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T)


def qlinear(
    x: np.ndarray,
    w: np.ndarray,
    fmt: str,
    out: np.ndarray | None = None,
    *,
    portable: bool = False,
    vnni: bool = True,
    bf16dot: bool = True,
) -> np.ndarray:
    """``x @ W.T`` for float32 ``x [..., K]`` and ``fmt`` blocks ``w`` (``uint8 [N, row_bytes]``,
    or any array whose bytes are those rows, e.g. GGUF ``F16`` data); every argument is checked
    (a mismatch raises ``RuntimeCheckError``). ``INT8_FORMATS`` quantize ``x`` (see the module
    docstring); ``portable``, ``vnni`` and ``bf16dot`` pick a library variant (``library``)."""
    if fmt not in FORMATS:
        raise RuntimeCheckError(f"quant_linear: unknown format {fmt!r}; the quant backend runs {', '.join(FORMATS)}")
    x = np.ascontiguousarray(x)
    if x.dtype != np.float32 or x.ndim < 1:
        raise RuntimeCheckError(f"quant_linear: x must be a float32 array of rank >= 1, got {x.dtype} of rank {x.ndim}")
    w = np.ascontiguousarray(w)
    if w.ndim != 2:
        raise RuntimeCheckError(f"quant_linear: the blocks must be 2-D [out_features, row_bytes], got shape {w.shape}")
    w = w.view(np.uint8)
    k = x.shape[-1]
    block = quant_format(fmt).block
    if k % block:
        raise RuntimeCheckError(f"quant_linear: in_features {k} is not a multiple of the {fmt} block ({block})")
    if w.shape[1] != row_bytes(fmt, k):
        raise RuntimeCheckError(f"quant_linear: {fmt} rows of {k} weights take {row_bytes(fmt, k)} bytes, got {w.shape[1]}")
    if fmt in INTERLEAVED_FORMATS and w.shape[0] % 16:
        raise RuntimeCheckError(f"quant_linear: {fmt} interleaves rows in groups of 16, got {w.shape[0]} rows")
    n, m = w.shape[0], x.size // k if k else int(np.prod(x.shape[:-1]))
    shape = (*x.shape[:-1], n)
    if out is None:
        out = np.empty(shape, np.float32)
    elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise RuntimeCheckError(f"quant_linear: out must be a C-contiguous float32 array of shape {shape}, got {out.dtype} {out.shape}")
    rc = library(portable, vnni, bf16dot, (family_of(fmt),)).entries[fmt](x.ctypes.data, w.ctypes.data, out.ctypes.data, m, n, k)
    if rc:
        raise _failure(rc, fmt, (m, n, k))
    return out


# -- the extern ----------------------------------------------------------------------------------

_ND = np.ndarray
_TLS = threading.local()
_FAST: dict[str, Any] = {}  # per path (FAMILIES): the trampoline of the build holding it, once loaded (None: no fast calls)


def argument_block(tls: threading.local, size: int, data_at: int) -> tuple[Any, int]:
    """This thread's block of ``size`` int64 arguments for a packed trampoline (kept in ``tls``)
    and its address; slot ``data_at`` holds the data pointer's offset in a NumPy array object."""
    block = (ctypes.c_int64 * size)()
    block[data_at] = _DATA_OFFSET or 0
    tls.block = (block, ctypes.addressof(block))
    return tls.block


def _extern(fmt: str) -> Callable[[np.ndarray, np.ndarray, tuple[int, int, int], np.ndarray], None]:
    code, family = FORMATS.index(fmt), family_of(fmt)

    def call(x: np.ndarray, w: np.ndarray, dims: tuple[int, int, int], out: np.ndarray) -> None:
        _run(fmt, code, family, x, w, None, dims, out)

    call.__name__ = f"quant_linear_{fmt}"
    return call


def _extern_add(fmt: str) -> Callable[[np.ndarray, np.ndarray, np.ndarray, tuple[int, int, int], np.ndarray], None]:
    code, family = FORMATS.index(fmt), family_of(fmt)

    def call(x: np.ndarray, w: np.ndarray, r: np.ndarray, dims: tuple[int, int, int], out: np.ndarray) -> None:
        _run(fmt, code, family, x, w, r, dims, out)

    call.__name__ = f"quant_linear_add_{fmt}"
    return call


def _run(fmt: str, code: int, family: str, x: np.ndarray, w: np.ndarray, r: np.ndarray | None, dims: tuple[int, int, int], out: np.ndarray) -> None:
    m, n, k = dims
    try:
        fast = _FAST[family]
    except KeyError:
        fast = _FAST.setdefault(family, library_for(fmt).packed if _DATA_OFFSET is not None else None)
    if fast is None or not (isinstance(x, _ND) and isinstance(w, _ND) and isinstance(out, _ND) and (r is None or isinstance(r, _ND))):
        lib = library_for(fmt)
        xp, wp = np.asarray(x).ctypes.data, np.asarray(w).ctypes.data
        if r is None:
            rc = lib.entries[fmt](xp, wp, out.ctypes.data, m, n, k)
        else:
            rc = lib.add_entries[fmt](xp, wp, np.asarray(r).ctypes.data, out.ctypes.data, m, n, k)
    else:
        try:
            block, addr = _TLS.block
        except AttributeError:
            block, addr = argument_block(_TLS, 9, 7)  # fmt, x, w, out (object addresses), M, N, K, data offset, residual (an address or 0)
        block[0:7] = (code, id(x), id(w), id(out), m, n, k)
        block[8] = 0 if r is None else id(r)
        rc = fast(addr)
    if rc:
        raise _failure(rc, fmt, dims)


def _check(fmt: str) -> Callable[..., None]:
    """The check a VM runs before each call of a loaded executable (the C code reads ``x``,
    ``w`` and the residual and writes ``out`` by raw pointers, as far as the dims say)."""

    def check(symbol: str, x: Any, w: Any, *rest: Any) -> None:
        *residual, dims, out = rest
        if len(residual) > 1 or not isinstance(dims, tuple) or len(dims) != 3 or not all(isinstance(d, (int, np.integer)) and 0 <= d < 1 << 31 for d in dims):
            raise RuntimeCheckError(f"{symbol}: dims must be three non-negative ints, got {dims!r:.80}")
        m, n, k = (int(d) for d in dims)
        fm = quant_format(fmt)
        if k % fm.block or (fmt in INTERLEAVED_FORMATS and n % 16):
            raise RuntimeCheckError(f"{symbol}: dims {dims} do not fit the {fmt} blocks")
        for what, a, size in (("x", x, m * k), ("the residual", residual[0] if residual else None, m * n)):
            if a is not None or what == "x":
                check_array(symbol, what, a, (np.float32,), size, dims)
        check_weights_and_out(symbol, w, n * fm.row_bytes(k), out, m * n, dims)

    return check


def check_array(symbol: str, what: str, a: Any, dtypes: tuple[Any, ...], size: int, dims: tuple[int, ...]) -> None:
    """A library call's argument ``what``: a C-contiguous NumPy array of one of ``dtypes`` and
    ``size`` elements (the C code reads it by raw pointer, as far as ``dims`` say), else a
    ``RuntimeCheckError`` naming it."""
    if not isinstance(a, np.ndarray) or a.dtype not in dtypes or not a.flags.c_contiguous or a.size != size:
        kinds = " or ".join(np.dtype(d).name for d in dtypes)
        raise RuntimeCheckError(f"{symbol}: {what} must be a C-contiguous {kinds} array of {size} elements for dims {dims}, got {a!r:.80}")


def check_weights_and_out(symbol: str, w: Any, nbytes: int, out: Any, size: int, dims: tuple[int, ...]) -> None:
    """A library call's weights (``nbytes`` contiguous bytes) and its float32 output (``size``
    elements, writable), else a ``RuntimeCheckError`` naming them."""
    if not isinstance(w, np.ndarray) or not w.flags.c_contiguous or w.nbytes != nbytes:
        raise RuntimeCheckError(f"{symbol}: the weights must be {nbytes} contiguous bytes for dims {dims}, got {w!r:.80}")
    check_array(symbol, "out", out, (np.float32,), size, dims)
    if not out.flags.writeable:
        raise RuntimeCheckError(f"{symbol}: out is read-only")


for _fmt in FORMATS:
    register_extern(extern_symbol(_fmt), _extern(_fmt), override=True)
    register_extern(extern_symbol(_fmt, add=True), _extern_add(_fmt), override=True)
    register_extern_check(extern_symbol(_fmt), _check(_fmt))
    register_extern_check(extern_symbol(_fmt, add=True), _check(_fmt))


# -- capability and lowering ---------------------------------------------------------------------

QUANT_LINEAR: Pattern = is_op("quant_linear", wildcard("x"), wildcard("w"))
QUANT_LINEAR_ADD: Pattern = is_op("add", QUANT_LINEAR, wildcard("r")) | is_op("add", wildcard("r"), QUANT_LINEAR)
EXPERT_LINEAR: Pattern = is_op("expert_linear", wildcard("x"), wildcard("w"), wildcard("ids"))


def _quant_linear_ok(m: PatternMatch) -> bool:
    call = _linear_call(m)
    if call is None or call.attrs.get("fmt") not in FORMATS:
        return False
    x, w = m["x"].info, m["w"].info
    return (
        isinstance(x, TensorInfo) and x.dtype == "float32" and x.shape is not None and len(x.shape) >= 1
        and isinstance(w, TensorInfo) and w.dtype == "uint8" and w.shape is not None and len(w.shape) == 2
    )


def _linear_call(m: PatternMatch, name: str = "quant_linear") -> Call | None:
    return next((c for c in m.calls if isinstance(c.callee, OpRef) and c.callee.name == name), None)


def _experts_ok(m: PatternMatch) -> bool:
    """``expert_linear`` on blocks this library runs: x float32 ``[T, S, K]``, the blocks 2-D
    uint8, ids int32/int64 ``[T, slots]`` (the op's inference checked the rest)."""
    call = _linear_call(m, "expert_linear")
    if call is None or call.attrs.get("fmt") not in FORMATS:
        return False
    x, w, ids = m["x"].info, m["w"].info, m["ids"].info
    return (
        isinstance(x, TensorInfo) and x.dtype == "float32" and x.shape is not None and len(x.shape) == 3
        and isinstance(w, TensorInfo) and w.dtype == "uint8" and w.shape is not None and len(w.shape) == 2
        and isinstance(ids, TensorInfo) and ids.dtype in ("int32", "int64") and ids.shape is not None and len(ids.shape) == 2
    )


def _lower_experts(region: Region) -> Call:
    assert region.match is not None
    call = _linear_call(region.match, "expert_linear")
    assert call is not None
    x, w, ids = region["x"], region["w"], region["ids"]
    (t, s, k), experts = shape_of(x), call.attrs["experts"]
    dims = (t, s, shape_of(ids)[1], experts, shape_of(call)[2], k)
    return lib_call(experts_symbol(call.attrs["fmt"]), [x, w, ids], region, dims)


def _quant_linear_add_ok(m: PatternMatch) -> bool:
    """A residual add of the product's own shape (no broadcast) in float32."""
    call = _linear_call(m)
    if call is None or not _quant_linear_ok(m):
        return False
    r, y = m["r"].info, call.info
    if not (isinstance(r, TensorInfo) and r.dtype == "float32" and r.shape is not None and isinstance(y, TensorInfo) and y.shape is not None):
        return False
    return sym.prove_dims_eq(r.shape, y.shape)


def _lower(region: Region) -> Call:
    assert region.match is not None
    if region.capability == "quant.experts":
        return _lower_experts(region)
    call = _linear_call(region.match)
    assert call is not None
    attrs = call.attrs
    x, w = region["x"], region["w"]
    rows = sym.product(shape_of(x)[:-1])
    dims = (rows, shape_of(w)[0], attrs["in_features"])
    if region.capability == "quant.linear_add":
        return lib_call(extern_symbol(attrs["fmt"], add=True), [x, w, region["r"]], region, dims)
    return lib_call(extern_symbol(attrs["fmt"]), [x, w], region, dims)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[-1].split())


def _available() -> tuple[bool, str]:
    flags = _cpu_flags()
    kind = "AVX-512" if {"avx512f", "avx512bw", "f16c"} <= flags else "portable C with AVX2 (the float path, integer dot products)" if {"avx2", "fma", "f16c"} <= flags else "portable C"
    try:
        toolchain.compiler_command()
    except BuildError as e:
        try:
            library()  # a library built earlier may still be in the kernel cache
        except BuildError:
            return False, f"the quant library is not built and cannot be: {e}"
    return True, f"{SOURCE}: {kind} GEMV/GEMM kernels on GGUF blocks ({', '.join(FORMATS)}; int8 activations for {', '.join(INT8_FORMATS)}), compiled on first use"


QUANT = register_backend(
    Backend(
        "quant",
        "library",
        _available,
        (
            Capability("quant.linear_add", QUANT_LINEAR_ADD, _quant_linear_add_ok),
            Capability("quant.linear", QUANT_LINEAR, _quant_linear_ok),
            Capability("quant.experts", EXPERT_LINEAR, _experts_ok),
        ),
        lower=_lower,
        description="quant_linear and expert_linear on GGUF weight blocks (q4_0, q4_1, q5_0, q5_1, q8_0, bf16, f16, q4_k, q6_k, q5_k, q3_k, q2_k, iq4_nl, iq4_xs; q4_0/q4_1/q5_0/q5_1/q8_0/bf16, the k-quants and iq4_nl/iq4_xs also with 16 rows interleaved) with our own C kernels",
    )
)

__all__ = [
    "FAMILIES", "FORMATS", "INT8_FORMATS", "INTEGER_FAMILIES", "QUANT", "QuantLibrary", "activation_bound", "bf16dot_available", "entry_address", "experts_symbol", "extern_symbol", "families_of",
    "ERROR_TEXT", "argument_block", "check_array", "check_weights_and_out", "family_of", "library", "library_for", "library_if_built", "library_in_background", "library_ready", "qlinear", "row_bytes", "source",
]
