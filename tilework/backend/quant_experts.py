"""The quant backend's mixture of experts: ``expert_linear`` (``tilework.op.quant``) on GGUF
blocks, run by the quant library's ``tw_qexperts_<fmt>`` (``quant_experts.c``).

``out[t, s] = x[t, s or 0] @ W_e.T`` with ``e = ids[t, s]`` (negative from the end, then
clamped to ``[0, experts)``), the experts' ``[N, K]`` matrices stacked as block rows. The
library sorts the pairs ``(t, s)`` by expert and runs each expert's rows of ``x`` through the
linears' own kernels (the GEMV up to 8 rows, the GEMM beyond), so every output has the bits
``qlinear`` gives that row against that expert's rows (the integer path's error bound,
``quant.activation_bound``, is the linears'). Decoding (one token, a few experts of many) runs
one GEMV per routed expert on ``x`` in place; nothing is copied.

The capability (``quant.experts``, in ``tilework.backend.quant``) lowers an ``expert_linear``
whose format the library runs to ``call_lib("quant.experts.<fmt>", x, w, ids, (T, S, slots,
experts, N, K))``; ``f32`` experts stay on the codegen path (the op's reference kernel). This
module registers that extern (the hot path of a mixture-of-experts model's decoding: it trusts
the VM's arguments and passes object addresses to ``tw_qexperts_packed``, as the linears'
extern does) and its check (what a VM runs before each call of a loaded executable), and holds
the checked entry point ``qexperts``.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from tilework.backend.quant import ERROR_TEXT, FORMATS, argument_block, check_array, check_weights_and_out, experts_symbol, family_of, library, library_for, row_bytes
from tilework.codegen.c.module import _DATA_OFFSET
from tilework.errors import RuntimeCheckError
from tilework.op.quant import INTERLEAVED_FORMATS, quant_format
from tilework.runtime.extern import register_extern, register_extern_check

Dims = tuple[int, int, int, int, int, int]  # T, S, slots, experts, N, K


def _failure(rc: int, fmt: str, dims: Dims) -> RuntimeCheckError:
    t, s, slots, e, n, k = dims
    why = ERROR_TEXT.get(rc, f"error code {rc}")
    return RuntimeCheckError(f"expert_linear ({fmt}, tokens={t}, x dim 1={s}, slots={slots}, experts={e}, out_features={n}, in_features={k}): the library refused the call: {why}")


def qexperts(x: np.ndarray, w: np.ndarray, ids: np.ndarray, fmt: str, experts: int, out: np.ndarray | None = None, *, portable: bool = False) -> np.ndarray:
    """``expert_linear(x, w, ids, fmt, K, experts)`` on the library: float32 ``x [T, S, K]``
    (``S`` 1 or the slots), ``fmt`` blocks ``w`` (``uint8 [experts * N, row_bytes]``), ids
    int32/int64 ``[T, slots]``; float32 ``[T, slots, N]`` (into ``out`` where given). Every
    argument is checked: a mismatch raises ``RuntimeCheckError`` naming it. ``portable``: the
    plain-C build (``quant.library``)."""
    if fmt not in FORMATS:
        raise RuntimeCheckError(f"expert_linear: unknown format {fmt!r}; the quant backend runs {', '.join(FORMATS)}")
    if not isinstance(experts, (int, np.integer)) or isinstance(experts, bool) or experts <= 0:
        raise RuntimeCheckError(f"expert_linear: experts must be a positive int, got {experts!r}")
    x, w, ids = np.ascontiguousarray(x), np.ascontiguousarray(w), np.ascontiguousarray(ids)
    if x.dtype != np.float32 or x.ndim != 3:
        raise RuntimeCheckError(f"expert_linear: x must be float32 [tokens, 1 or slots, in_features], got {x.dtype} of shape {x.shape}")
    if ids.dtype not in (np.int32, np.int64) or ids.ndim != 2 or ids.shape[0] != x.shape[0]:
        raise RuntimeCheckError(f"expert_linear: ids must be int32 or int64 [tokens, slots] with x's {x.shape[0]} tokens, got {ids.dtype} of shape {ids.shape}")
    t, s, k = x.shape
    slots = ids.shape[1]
    if s not in (1, slots):
        raise RuntimeCheckError(f"expert_linear: x's dim 1 must be 1 or the {slots} slots of ids, got {s}")
    if w.dtype != np.uint8 or w.ndim != 2:
        raise RuntimeCheckError(f"expert_linear: the weights w must be uint8 [experts * out_features, row_bytes], got {w.dtype} of shape {w.shape}")
    block = quant_format(fmt).block
    if k % block or w.shape[1] != row_bytes(fmt, k):
        raise RuntimeCheckError(f"expert_linear: the weights w must have rows of {fmt} blocks of in_features {k} (a multiple of {block}), got shape {w.shape}")
    if w.shape[0] % experts or (fmt in INTERLEAVED_FORMATS and w.shape[0] // experts % 16):
        raise RuntimeCheckError(f"expert_linear: the weights w's {w.shape[0]} rows are not {experts} experts of equal size{' (a multiple of 16 rows each)' * (fmt in INTERLEAVED_FORMATS)}")
    n = w.shape[0] // experts
    shape = (t, slots, n)
    if out is None:
        out = np.empty(shape, np.float32)
    elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous or not out.flags.writeable:
        raise RuntimeCheckError(f"expert_linear: out must be a writable C-contiguous float32 array of shape {shape}, got {out.dtype} {out.shape}")
    dims = (t, s, slots, int(experts), n, k)
    lib = library(portable, families=(family_of(fmt),))
    rc = lib.experts[fmt](x.ctypes.data, w.ctypes.data, ids.ctypes.data, ids.itemsize, out.ctypes.data, *dims)
    if rc:
        raise _failure(rc, fmt, dims)
    return out


# -- the extern ----------------------------------------------------------------------------------

_ND = np.ndarray
_TLS = threading.local()
_FAST: dict[str, Any] = {}  # per format: the trampoline of the build holding its path (None: no fast calls)


def _extern(fmt: str) -> Callable[[np.ndarray, np.ndarray, np.ndarray, Dims, np.ndarray], None]:
    code = FORMATS.index(fmt)

    def call(x: np.ndarray, w: np.ndarray, ids: np.ndarray, dims: Dims, out: np.ndarray) -> None:
        try:
            fast = _FAST[fmt]
        except KeyError:
            fast = _FAST.setdefault(fmt, library_for(fmt).experts_packed if _DATA_OFFSET is not None else None)
        if fast is None or not (isinstance(x, _ND) and isinstance(w, _ND) and isinstance(ids, _ND) and isinstance(out, _ND)):
            ids = np.asarray(ids)
            rc = library_for(fmt).experts[fmt](np.asarray(x).ctypes.data, np.asarray(w).ctypes.data, ids.ctypes.data, ids.itemsize, out.ctypes.data, *dims)
        else:
            try:
                block, addr = _TLS.block
            except AttributeError:
                block, addr = argument_block(_TLS, 13, 11)  # fmt, x, w, ids, out (object addresses), the six dims, data offset, ids' item size
            block[0:11] = (code, id(x), id(w), id(ids), id(out), *dims)
            block[12] = ids.itemsize
            rc = fast(addr)
        if rc:
            raise _failure(rc, fmt, dims)

    call.__name__ = f"quant_experts_{fmt}"
    return call


def _check(fmt: str) -> Callable[..., None]:
    """The check a VM runs before each call of a loaded executable (the C code reads ``x``,
    ``w`` and ``ids`` and writes ``out`` by raw pointers, as far as the dims say)."""

    def check(symbol: str, x: Any, w: Any, ids: Any, dims: Any, out: Any) -> None:
        if not isinstance(dims, tuple) or len(dims) != 6 or not all(isinstance(d, (int, np.integer)) and 0 <= d < 1 << 31 for d in dims):
            raise RuntimeCheckError(f"{symbol}: dims must be six non-negative ints (tokens, x dim 1, slots, experts, out_features, in_features), got {dims!r:.80}")
        t, s, slots, e, n, k = (int(d) for d in dims)
        fm = quant_format(fmt)
        if s not in (1, slots) or e == 0 or k % fm.block or (fmt in INTERLEAVED_FORMATS and n % 16):
            raise RuntimeCheckError(f"{symbol}: dims {dims} do not fit the {fmt} blocks and experts")
        check_array(symbol, "x", x, (np.float32,), t * s * k, dims)
        check_array(symbol, "ids", ids, (np.int32, np.int64), t * slots, dims)
        check_weights_and_out(symbol, w, e * n * fm.row_bytes(k), out, t * slots * n, dims)

    return check


for _fmt in FORMATS:
    register_extern(experts_symbol(_fmt), _extern(_fmt), override=True)
    register_extern_check(experts_symbol(_fmt), _check(_fmt))

__all__ = ["qexperts"]
