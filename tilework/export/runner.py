"""Calling a built export from Python through ctypes: ``ExportedModel(lib_dir, weights)``.

For tests and benchmarks (the point of an export is to run without Python): the library's C
API (``tw_model.h``) on NumPy arrays. ``run(function, *arrays)`` returns the outputs as NumPy
arrays copied out of the model's memory (the C API's outputs live until the next run);
``run_raw`` leaves them in place and returns nothing, the per-call cost a C caller pays plus
ctypes. A failure is a ``RuntimeCheckError`` with the library's message.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Sequence

import numpy as np

from tilework.errors import RuntimeCheckError, TileworkError
from tilework.export.graph_c import dl_type
from tilework.ir.dtype import DTYPE_TABLE, dtype_name

MAX_OUTPUTS = 64


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("ndim", ctypes.c_int32), ("dtype", _DType), ("shape", ctypes.POINTER(ctypes.c_int64))]


_BY_DL = {dl_type(n): n for n in DTYPE_TABLE}


def declare(lib: Any) -> Any:
    """``lib`` (a loaded export) with the C API's argument and result types set."""
    lib.tw_model_create.argtypes = [ctypes.c_char_p]
    lib.tw_model_create.restype = ctypes.c_void_p
    lib.tw_model_create_from_arrays.argtypes = [ctypes.POINTER(_Tensor), ctypes.c_int]
    lib.tw_model_create_from_arrays.restype = ctypes.c_void_p
    lib.tw_model_run.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(_Tensor), ctypes.c_int, ctypes.POINTER(_Tensor), ctypes.c_int]
    lib.tw_model_run.restype = ctypes.c_int
    lib.tw_model_error.argtypes = [ctypes.c_void_p]
    lib.tw_model_error.restype = ctypes.c_char_p
    lib.tw_model_free.argtypes = [ctypes.c_void_p]
    lib.tw_model_free.restype = None
    return lib


def tensors_of(arrays: Sequence[np.ndarray]) -> tuple[Any, list[Any]]:
    """``tw_tensor`` structs describing C-contiguous ``arrays``, and what must stay alive while
    they are used."""
    tensors = (_Tensor * max(len(arrays), 1))()
    keep: list[Any] = []
    for t, a in zip(tensors, arrays):
        a = np.asarray(a)
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)  # (which would make a 0-d array 1-d)
        code, bits = dl_type(dtype_name(a.dtype))
        shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        keep += [a, shape]
        t.data = a.ctypes.data
        t.ndim = a.ndim
        t.dtype = _DType(code, bits, 1)
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    return tensors, keep


class ExportedModel:
    """A loaded ``libtwmodel.so`` with its weights file; see the module docstring."""

    def __init__(self, lib_dir: str | os.PathLike[str], weights: str | os.PathLike[str]) -> None:
        path = os.path.join(os.fspath(lib_dir), "libtwmodel.so")
        if not os.path.exists(path):
            raise TileworkError(f"no libtwmodel.so in {lib_dir}: build the export first (make or cmake)")
        lib = declare(ctypes.CDLL(path))
        self._attach(lib, lib.tw_model_create(os.fsencode(weights)))

    def _attach(self, lib: Any, handle: Any) -> None:
        """Hold ``handle`` (a ``tw_model*`` of ``lib``, NULL when its create failed)."""
        self._lib = lib
        self._handle = None
        if not handle:
            raise RuntimeCheckError(lib.tw_model_error(None).decode())
        self._handle = handle
        self._outputs = (_Tensor * MAX_OUTPUTS)()
        self._keep: list[Any] = []

    def prepare(self, function: str, *arrays: np.ndarray) -> tuple[bytes, Any, int]:
        """The ctypes arguments of a call, built once (for ``run_raw``)."""
        tensors, keep = tensors_of(arrays)
        self._keep = keep
        return function.encode(), tensors, len(arrays)

    def run_raw(self, prepared: tuple[bytes, Any, int]) -> int:
        name, tensors, n = prepared
        got = self._lib.tw_model_run(self._handle, name, tensors, n, self._outputs, MAX_OUTPUTS)
        if got < 0:
            raise RuntimeCheckError(self._lib.tw_model_error(self._handle).decode())
        return int(got)

    def run(self, function: str, *arrays: np.ndarray) -> list[np.ndarray]:
        n = self.run_raw(self.prepare(function, *arrays))
        outs = []
        for t in self._outputs[: min(n, MAX_OUTPUTS)]:
            dtype = np.dtype(DTYPE_TABLE[_BY_DL[(t.dtype.code, t.dtype.bits)]].numpy)
            shape = tuple(t.shape[i] for i in range(t.ndim))
            count = int(np.prod(shape, dtype=np.int64))
            if not count:
                outs.append(np.empty(shape, dtype))
                continue
            buf = (ctypes.c_char * (count * dtype.itemsize)).from_address(t.data)
            outs.append(np.frombuffer(memoryview(buf).cast("B"), dtype, count).reshape(shape).copy())
        return outs

    def close(self) -> None:
        if self._handle:
            self._lib.tw_model_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


__all__ = ["ExportedModel", "declare", "tensors_of"]
