"""The ``blas`` backend: matmul, linear (+ bias) and batched matmul through the BLAS that
NumPy itself links.

The library is found without a new dependency: the shared objects NumPy has loaded (read from
``/proc/self/maps``), then those shipped beside it (``numpy.libs``, ``scipy_openblas64``/``32``),
opened with ``ctypes`` and searched for ``cblas_?gemm`` and ``cblas_?gemv`` with or without
the ``scipy_`` prefix and the ``64_`` suffix of 64-bit-integer builds. Each call writes straight
into the destination buffer the VM allocated (``beta = 1`` over a copy of the bias adds it for
free); the sizes ``M, N, K`` (and the batch count) are computed from the symbolic dims at run
time and passed in, and a single row (``M == 1``: decoding) goes to GEMV, which is several
times faster there than a GEMM. When no symbol is found the externs fall back to ``numpy.matmul(...,
out=)`` (also copy-free); ``available()`` says which one runs.

Capabilities, in claiming order: ``blas.matmul_bias`` (``add(matmul(a, b), bias)`` with a 1-D
bias, when nothing else reads the matmul), ``blas.linear`` (with or without bias),
``blas.matmul`` (``a`` of rank >= 2 against a 2-D ``b``: the leading dims of ``a`` fold into
``M``) and ``blas.batch_matmul`` (equal batch dims, one GEMM per batch entry). float32 and
float64.

Each call runs on the calling thread (``THREADS``, 1 by default; ``TILEWORK_BLAS_THREADS``
overrides, 0 for the library's own count), set for that thread alone around the call through OpenBLAS's
``openblas_set_num_threads_local`` (0.3.27 and later; NumPy's other callers, and other
threads, keep their own setting). OpenBLAS's workers spin for about 2**28 cycles after the
calls they share (tens of milliseconds) before they sleep, and tilework's OpenMP kernels around
a BLAS region then wait on a core a spinning worker holds: on the 2-core Zen 4 machine a 64 ->
128 -> gelu -> 8 MLP of two ``blas`` linears took 8 ms at 64 rows with OpenBLAS's pool and
0.05 ms on the calling thread (codegen alone 0.02 ms); the large shapes lose up to 1.9x on one
thread (docs/backends.md).
"""

from __future__ import annotations

import ctypes
import glob
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tilework.backend.base import Backend, Capability, Region, lib_call, register_backend, same_dtype_in, shape_of
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import TensorInfo
from tilework.pattern.core import Pattern, is_op, wildcard
from tilework.pattern.graph import PatternMatch
from tilework.errors import RuntimeCheckError
from tilework.runtime.extern import register_extern, register_extern_check

DTYPES = ("float32", "float64")
THREADS = int(os.environ.get("TILEWORK_BLAS_THREADS", "1") or 1)  # OpenBLAS threads of one call (module docstring)
_SHORT = {"float32": "f32", "float64": "f64"}
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112

# -- finding the BLAS -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Blas:
    """``cblas_?gemm`` and ``cblas_?gemv`` of one library, and the integer type of their sizes
    (``gemv`` serves single-row products, where a GEMM is several times slower)."""

    gemm: Any
    gemv: Any
    symbol: str
    path: str
    int64: bool
    local_threads: Any = None  # openblas_set_num_threads_local (None: an older or another BLAS)
    threads_now: Any = None  # openblas_get_num_threads: the calling thread's count


def _candidate_libraries() -> list[str]:
    found: list[str] = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.rsplit(" ", 1)[-1].strip()
                if "blas" in os.path.basename(path).lower() and path not in found:
                    found.append(path)
    except OSError:
        pass
    root = os.path.dirname(os.path.dirname(np.__file__))
    for pattern in ("numpy.libs/*blas*", "numpy/.dylibs/*blas*", "scipy_openblas64/lib/*blas*", "scipy_openblas32/lib/*blas*"):
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            if path not in found:
                found.append(path)
    return found


def _find_blas(letter: str) -> _Blas | None:
    spellings = [(pre, suf) for pre in ("scipy_", "") for suf in ("64_", "_64", "")]
    for path in _candidate_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for pre, suf in spellings:
            gemm = getattr(lib, f"{pre}cblas_{letter}gemm{suf}", None)
            gemv = getattr(lib, f"{pre}cblas_{letter}gemv{suf}", None)
            if gemm is None or gemv is None:
                continue
            i = ctypes.c_int64 if "64" in suf else ctypes.c_int
            real = ctypes.c_float if letter == "s" else ctypes.c_double
            p, e = ctypes.c_void_p, ctypes.c_int
            gemm.argtypes = [e, e, e, i, i, i, real, p, i, p, i, real, p, i]
            gemv.argtypes = [e, e, i, i, real, p, i, p, i, real, p, i]
            gemm.restype = gemv.restype = None
            local = getattr(lib, "openblas_set_num_threads_local", None)
            now = getattr(lib, f"{pre}openblas_get_num_threads{suf}", None)
            if local is not None and now is not None:
                local.argtypes, local.restype, now.argtypes, now.restype = [ctypes.c_int], ctypes.c_int, [], ctypes.c_int
            else:
                local = now = None
            return _Blas(gemm, gemv, f"{pre}cblas_{letter}gemm{suf}", path, "64" in suf, local, now)
    return None


_FOUND: dict[str, _Blas | None] = {}


def gemm_for(dtype: str) -> _Blas | None:
    """The BLAS entry points for ``dtype`` (float32/float64), or None (the NumPy fallback)."""
    if dtype not in _FOUND:
        _FOUND[dtype] = _find_blas("s" if dtype == "float32" else "d")
    return _FOUND[dtype]


def _available() -> tuple[bool, str]:
    g = gemm_for("float32")
    if g is None:
        return True, "no cblas_sgemm/sgemv symbols in NumPy's libraries; the externs use numpy.matmul(out=) (no copies either)"
    ints = "64-bit" if g.int64 else "32-bit"
    threads = f"{THREADS} thread(s) a call" if g.local_threads is not None else "the library's own thread count (no openblas_set_num_threads_local)"
    return True, f"{g.symbol} and its gemv ({ints} sizes) from {os.path.basename(g.path)}, called through ctypes, {threads}"


# -- the externs ------------------------------------------------------------------------------


def _on_threads(f: Any, g: _Blas, threads: int) -> Any:
    """``f`` run with ``threads`` OpenBLAS threads for the calling thread, then its own setting
    back: none (the library's count, 0) unless the thread had one (``local`` returns the count
    in effect before, not whether it was the thread's own)."""
    local, now = g.local_threads, g.threads_now

    def call(*args: Any) -> None:
        before = local(threads)
        try:
            f(*args)
        finally:
            local(0)
            if now() != before:
                local(before)

    return call


def _ctypes_externs(g: _Blas) -> dict[str, Callable[..., None]]:
    gemm, gemv = g.gemm, g.gemv
    if g.local_threads is not None:
        gemm, gemv = _on_threads(gemm, g, THREADS), _on_threads(gemv, g, THREADS)

    def nn(a: int, b: int, c: int, m: int, n: int, k: int, beta: float) -> None:
        """``c = a @ b + beta * c`` for row-major ``a [m, k]``, ``b [k, n]``."""
        if m == 1:
            gemv(_ROW_MAJOR, _TRANS, k, n, 1.0, b, max(n, 1), a, 1, beta, c, 1)
        elif m and n:
            gemm(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, m, n, k, 1.0, a, max(k, 1), b, max(n, 1), beta, c, max(n, 1))

    def nt(a: int, b: int, c: int, m: int, n: int, k: int, beta: float) -> None:
        """``c = a @ b.T + beta * c`` for row-major ``a [m, k]``, ``b [n, k]``."""
        if m == 1:
            gemv(_ROW_MAJOR, _NO_TRANS, n, k, 1.0, b, max(k, 1), a, 1, beta, c, 1)
        elif m and n:
            gemm(_ROW_MAJOR, _NO_TRANS, _TRANS, m, n, k, 1.0, a, max(k, 1), b, max(k, 1), beta, c, max(n, 1))

    def matmul(a: np.ndarray, b: np.ndarray, dims: tuple[int, int, int], out: np.ndarray) -> None:
        m, n, k = dims
        nn(a.ctypes.data, b.ctypes.data, out.ctypes.data, m, n, k, 0.0)

    def matmul_bias(a: np.ndarray, b: np.ndarray, bias: np.ndarray, dims: tuple[int, int, int], out: np.ndarray) -> None:
        m, n, k = dims
        np.copyto(out.reshape(m, n), bias)
        nn(a.ctypes.data, b.ctypes.data, out.ctypes.data, m, n, k, 1.0)

    def linear(x: np.ndarray, w: np.ndarray, dims: tuple[int, int, int], out: np.ndarray) -> None:
        m, n, k = dims
        nt(x.ctypes.data, w.ctypes.data, out.ctypes.data, m, n, k, 0.0)

    def linear_bias(x: np.ndarray, w: np.ndarray, bias: np.ndarray, dims: tuple[int, int, int], out: np.ndarray) -> None:
        m, n, k = dims
        np.copyto(out.reshape(m, n), bias)
        nt(x.ctypes.data, w.ctypes.data, out.ctypes.data, m, n, k, 1.0)

    def batch_matmul(a: np.ndarray, b: np.ndarray, dims: tuple[int, int, int, int], out: np.ndarray) -> None:
        nb, m, n, k = dims
        size = a.itemsize
        pa, pb, po = a.ctypes.data, b.ctypes.data, out.ctypes.data
        sa, sb, so = m * k * size, k * n * size, m * n * size
        for i in range(nb):
            nn(pa + i * sa, pb + i * sb, po + i * so, m, n, k, 0.0)

    return {"matmul": matmul, "matmul_bias": matmul_bias, "linear": linear, "linear_bias": linear_bias, "batch_matmul": batch_matmul}


def _numpy_externs() -> dict[str, Callable[..., None]]:
    def matmul(a: np.ndarray, b: np.ndarray, dims: tuple[int, int, int], out: np.ndarray) -> None:
        m, n, k = dims
        np.matmul(a.reshape(m, k), b, out=out.reshape(m, n))

    def matmul_bias(a: np.ndarray, b: np.ndarray, bias: np.ndarray, dims: tuple[int, int, int], out: np.ndarray) -> None:
        m, n, k = dims
        o = out.reshape(m, n)
        np.matmul(a.reshape(m, k), b, out=o)
        o += bias

    def linear(x: np.ndarray, w: np.ndarray, dims: tuple[int, int, int], out: np.ndarray) -> None:
        m, n, k = dims
        np.matmul(x.reshape(m, k), w.T, out=out.reshape(m, n))

    def linear_bias(x: np.ndarray, w: np.ndarray, bias: np.ndarray, dims: tuple[int, int, int], out: np.ndarray) -> None:
        m, n, k = dims
        o = out.reshape(m, n)
        np.matmul(x.reshape(m, k), w.T, out=o)
        o += bias

    def batch_matmul(a: np.ndarray, b: np.ndarray, dims: tuple[int, int, int, int], out: np.ndarray) -> None:
        nb, m, n, k = dims
        np.matmul(a.reshape(nb, m, k), b.reshape(nb, k, n), out=out.reshape(nb, m, n))

    return {"matmul": matmul, "matmul_bias": matmul_bias, "linear": linear, "linear_bias": linear_bias, "batch_matmul": batch_matmul}


def _lazy(dtype: str, kind: str) -> Callable[..., None]:
    """The extern ``kind`` for ``dtype``, resolved to the ctypes or NumPy version on its first
    call (the VM binds this object once; afterwards one attribute read per call)."""
    box: list[Callable[..., None]] = []

    def call(*args: Any) -> None:
        if not box:
            g = gemm_for(dtype)
            box.append((_ctypes_externs(g) if g is not None else _numpy_externs())[kind])
        box[0](*args)

    call.__name__ = f"blas_{_SHORT[dtype]}_{kind}"
    return call


def extern_symbol(dtype: str, kind: str) -> str:
    return f"blas.{_SHORT[dtype]}.{kind}"


# The operands each extern reads or writes through raw pointers, as products of its dims: for
# an executable read from a file, the VM checks each call against these (``_check``).
_SIZES: dict[str, tuple[tuple[int, ...], ...]] = {  # per array (bias excluded): indices into dims
    "matmul": ((0, 2), (2, 1), (0, 1)),
    "linear": ((0, 2), (1, 2), (0, 1)),
    "batch_matmul": ((0, 1, 3), (0, 3, 2), (0, 1, 2)),
}


def _check(dtype: str, kind: str) -> Callable[..., None]:
    sizes = _SIZES[kind.replace("_bias", "")]
    want = np.dtype(dtype)

    def check(symbol: str, *args: Any) -> None:
        *arrays, dims, out = args
        if kind.endswith("_bias"):
            del arrays[2]  # the bias is copied by NumPy, which checks its shape
        ndims = 4 if kind == "batch_matmul" else 3
        if not isinstance(dims, tuple) or len(dims) != ndims or not all(isinstance(d, (int, np.integer)) and 0 <= d < 1 << 31 for d in dims):
            raise RuntimeCheckError(f"{symbol}: dims must be {ndims} non-negative ints, got {dims!r}")
        for i, (a, idx) in enumerate(zip([*arrays, out], sizes)):
            if not isinstance(a, np.ndarray) or a.dtype != want or not a.flags.c_contiguous:
                raise RuntimeCheckError(f"{symbol}: argument {i} must be a C-contiguous {dtype} array, got {a!r:.80}")
            need = int(np.prod([dims[j] for j in idx], dtype=np.int64))
            if a.size != need:
                raise RuntimeCheckError(f"{symbol}: argument {i} has {a.size} elements, but dims {dims} need {need}")
        if not out.flags.writeable:
            raise RuntimeCheckError(f"{symbol}: the output is read-only")

    return check


for _dt in DTYPES:
    for _kind in ("matmul", "matmul_bias", "linear", "linear_bias", "batch_matmul"):
        register_extern(extern_symbol(_dt, _kind), _lazy(_dt, _kind), override=True)
        register_extern_check(extern_symbol(_dt, _kind), _check(_dt, _kind))


# -- patterns, predicates and lowerings ----------------------------------------------------------

_A, _B, _BIAS = wildcard("a"), wildcard("b"), wildcard("bias")
_MM = is_op("matmul", _A, _B).has_attr(out_dtype=None)
MATMUL_BIAS: Pattern = is_op("add", _MM, _BIAS) | is_op("add", _BIAS, _MM)
LINEAR: Pattern = is_op("linear", wildcard("a"), wildcard("b")) | is_op("linear", wildcard("a"), wildcard("b"), wildcard("bias"))
MATMUL: Pattern = _MM
BATCH_MATMUL: Pattern = _MM


def _rank(e: Expr) -> int:
    info = e.info
    return info.ndim if isinstance(info, TensorInfo) else -1


def _matmul_ok(m: PatternMatch) -> bool:
    return same_dtype_in(m, DTYPES) and _rank(m["a"]) >= 2 and _rank(m["b"]) == 2


def _matmul_bias_ok(m: PatternMatch) -> bool:
    if not _matmul_ok(m) or _rank(m["bias"]) != 1:
        return False
    return sym.prove_eq(shape_of(m["bias"])[0], shape_of(m["b"])[1])


def _linear_ok(m: PatternMatch) -> bool:
    bias = m.get("bias")
    return same_dtype_in(m, DTYPES) and _rank(m["a"]) >= 1 and _rank(m["b"]) == 2 and (bias is None or _rank(bias) == 1)


def _batch_ok(m: PatternMatch) -> bool:
    ra, rb = _rank(m["a"]), _rank(m["b"])
    if not same_dtype_in(m, DTYPES) or ra < 3 or rb != ra:
        return False
    return all(sym.prove_eq(x, y) for x, y in zip(shape_of(m["a"])[:-2], shape_of(m["b"])[:-2]))


def _dtype(region: Region) -> str:
    info = region.outputs[0].info
    assert isinstance(info, TensorInfo) and info.dtype is not None
    return info.dtype


def _lower(region: Region) -> Call:
    a, b = region["a"], region["b"]
    sa, sb = shape_of(a), shape_of(b)
    dtype = _dtype(region)
    cap = region.capability
    if cap == "blas.batch_matmul":
        return lib_call(extern_symbol(dtype, "batch_matmul"), [a, b], region, (sym.product(sa[:-2]), sa[-2], sb[-1], sa[-1]))
    rows = sym.product(sa[:-1])
    if cap == "blas.linear":
        bias = region.match.get("bias") if region.match is not None else None
        kind, args = ("linear", [a, b]) if bias is None else ("linear_bias", [a, b, bias])
        return lib_call(extern_symbol(dtype, kind), args, region, (rows, sb[0], sa[-1]))
    if cap == "blas.matmul_bias":
        return lib_call(extern_symbol(dtype, "matmul_bias"), [a, b, region["bias"]], region, (rows, sb[1], sa[-1]))
    return lib_call(extern_symbol(dtype, "matmul"), [a, b], region, (rows, sb[1], sa[-1]))


BLAS = register_backend(
    Backend(
        "blas",
        "library",
        _available,
        (
            Capability("blas.matmul_bias", MATMUL_BIAS, _matmul_bias_ok),
            Capability("blas.linear", LINEAR, _linear_ok),
            Capability("blas.matmul", MATMUL, _matmul_ok),
            Capability("blas.batch_matmul", BATCH_MATMUL, _batch_ok),
        ),
        lower=_lower,
        description="GEMM from the BLAS NumPy links (OpenBLAS in NumPy's wheels), through ctypes",
    )
)

__all__ = ["BLAS", "DTYPES", "gemm_for", "extern_symbol"]
