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
from typing import Any, Mapping, Sequence

import numpy as np

from tilework.errors import IndexOutOfRange, IntegerDivisionByZero, RuntimeCheckError, TileworkError
from tilework.codegen.c import team as c_team
from tilework.codegen.c.module import data_pointer
from tilework.export.aot import MAX_NDIM
from tilework.export.graph_c import dl_type
from tilework.ir.dtype import DTYPE_TABLE, dtype_name
from tilework.runtime import team
from tilework.runtime.tensor import host_array

MAX_OUTPUTS = 64
MAX_INPUTS = 64


ERR_ZERO_DIVISION, ERR_INDEX = 2, 3  # tw_model.h's TW_ERR_ZERO_DIVISION, TW_ERR_INDEX


def _error(lib: Any, handle: Any) -> RuntimeCheckError:
    """The model's last failure as the exception the VM raises: ``IntegerDivisionByZero`` (a
    ``ZeroDivisionError``, as the source framework's) for a kernel's integer division by zero,
    ``IndexOutOfRange`` (an ``IndexError``) for a kernel's index outside its dim,
    ``RuntimeCheckError`` otherwise."""
    message = lib.tw_model_error(handle).decode()
    kind = lib.tw_model_error_kind(handle)
    return IntegerDivisionByZero(message) if kind == ERR_ZERO_DIVISION else IndexOutOfRange(message) if kind == ERR_INDEX else RuntimeCheckError(message)


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
    lib.tw_model_error_kind.argtypes = [ctypes.c_void_p]
    lib.tw_model_error_kind.restype = ctypes.c_int
    lib.tw_model_free.argtypes = [ctypes.c_void_p]
    lib.tw_model_free.restype = None
    return lib


_DL_OF: dict[np.dtype, tuple[int, int]] = {}  # NumPy dtype -> DLPack (code, bits), as met
_NP_OF: dict[tuple[int, int], np.dtype] = {}


def _dl_of(dt: np.dtype) -> tuple[int, int]:
    found = _DL_OF.get(dt)
    if found is None:
        found = _DL_OF[dt] = dl_type(dtype_name(dt))
    return found


def _bits_of(dt: np.dtype, name: str, i: int) -> tuple[int, int]:
    """The DLPack type of ``name`` for an array of ``dt`` holding its bits (input ``i``)."""
    code, width = dl_type(name)
    if 8 * dt.itemsize != width:
        raise RuntimeCheckError(f"input {i} should hold the bits of {name} ({width}-bit integers), got an array of {dt}")
    return code, width


def _np_of(code: int, bits: int) -> np.dtype:
    found = _NP_OF.get((code, bits))
    if found is None:
        found = _NP_OF[(code, bits)] = np.dtype(DTYPE_TABLE[_BY_DL[(code, bits)]].numpy)
    return found


def tensors_of(arrays: Sequence[Any], tensors: Any = None, bits: Mapping[int, str] | None = None, function: str = "", names: Sequence[str] = ()) -> tuple[Any, list[Any]]:
    """``tw_tensor`` structs describing C-contiguous ``arrays`` (written into ``tensors``, a
    ``_Tensors`` of enough room, when given), and what must stay alive while they are used.
    Torch tensors and numbers are converted as the VM converts them (``host_array``); its errors name
    the input as the VM's checks do (``function: argument name``, else its position).
    ``bits`` maps a position to a tilework dtype whose bits an integer array there holds (uint16
    for bfloat16: NumPy has no such dtype without ml_dtypes); the item sizes must agree. An
    array of another kind at that position is described by its own dtype."""
    if tensors is None:
        tensors = _Tensors(len(arrays))
    keep: list[Any] = [tensors]  # its shape arrays
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray):
            a = host_array(a, f"{function}: argument {names[i]}" if i < len(names) else f"input {i}")
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)  # (which would make a 0-d array 1-d)
        t = tensors.structs[i]
        if bits is not None and i in bits and a.dtype.kind in "ui":
            t.dtype.code, t.dtype.bits = _bits_of(a.dtype, bits[i], i)
        else:
            t.dtype.code, t.dtype.bits = _dl_of(a.dtype)
        t.data = data_pointer(a)
        t.ndim = nd = a.ndim
        if nd > MAX_NDIM:
            raise RuntimeCheckError(f"input {i} has rank {nd} (at most {MAX_NDIM})")
        shape = tensors.shapes[i]
        for d, n in enumerate(a.shape):
            shape[d] = n
        keep.append(a)
    return tensors.structs, keep


class _Tensors:
    """Room for ``n`` ``tw_tensor`` structs, each with its shape array of ``MAX_NDIM``."""

    def __init__(self, n: int) -> None:
        self.structs = (_Tensor * max(n, 1))()
        self.shapes = [(ctypes.c_int64 * MAX_NDIM)() for _ in range(max(n, 1))]
        for t, shape in zip(self.structs, self.shapes):
            t.shape = ctypes.cast(shape, _I64P)
            t.dtype.lanes = 1


_I64P = ctypes.POINTER(ctypes.c_int64)


class ExportedModel:
    """A loaded ``libtwmodel.so`` with its weights file; see the module docstring."""

    functions: Mapping[str, Sequence[str]] = {}  # each function's input names, where known (for errors)

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
        c_team.install()  # calls after a pause hold their OpenMP team (tilework.runtime.team)
        self._outputs = (_Tensor * MAX_OUTPUTS)()
        self._inputs = _Tensors(MAX_INPUTS)
        self._keep: list[Any] = []

    def prepare(self, function: str, *arrays: Any, bits: Mapping[int, str] | None = None) -> tuple[bytes, Any, int]:
        """The ctypes arguments of a call, built once (for ``run_raw``); ``bits`` as in
        ``tensors_of``."""
        if len(arrays) > MAX_INPUTS:
            raise RuntimeCheckError(f"{function}: {len(arrays)} inputs (at most {MAX_INPUTS})")
        tensors, keep = tensors_of(arrays, self._inputs, bits, function, self.functions.get(function, ()))
        self._keep = keep
        return function.encode(), tensors, len(arrays)

    def run_raw(self, prepared: tuple[bytes, Any, int]) -> int:
        name, tensors, n = prepared
        held = team.enter()
        try:
            got = self._lib.tw_model_run(self._handle, name, tensors, n, self._outputs, MAX_OUTPUTS)
        finally:
            team.leave(held)
        if got < 0:
            raise _error(self._lib, self._handle)
        return int(got)

    def run(self, function: str, *arrays: Any, bits: Mapping[int, str] | None = None) -> list[np.ndarray]:
        n = self.run_raw(self.prepare(function, *arrays, bits=bits))
        outs = []
        for i in range(min(n, MAX_OUTPUTS)):
            t = self._outputs[i]
            out = np.empty(t.shape[: t.ndim], _np_of(t.dtype.code, t.dtype.bits))
            if out.nbytes:
                ctypes.memmove(data_pointer(out), t.data, out.nbytes)
            outs.append(out)
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
