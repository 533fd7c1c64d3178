"""What a compiled kernel expects from its caller, whatever the target.

A kernel takes its buffers (``func.buffers``: inputs, then outputs) as C-contiguous arrays and
the values of its *kernel sym vars*: ``tilework.ir.loop.kernel_syms(func)``, the sym vars that
appear in the buffer shapes (buffers in param order, dims in order, first occurrence) followed
by the sym params not already listed. ``check_arrays`` checks count, dtypes and layout;
``bind_syms`` derives the sym values from the arrays' shapes and the sym params' values and
checks every dim.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np

from tilework.errors import RuntimeCheckError
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.loop import TensorFunc, kernel_syms
from tilework.ir.sym import SymVar
from tilework.ir.dtype import np_dtype

SymValues = Union[Sequence[int], Mapping[str, int], Mapping[SymVar, int], None]


def _arg_name(func: TensorFunc, i: int) -> str:
    return f"argument {i} ({func.buffers[i].name})"


def check_arrays(func: TensorFunc, arrays: Sequence[np.ndarray], name: str = "kernel", contiguous: bool = True) -> None:
    """Count, dtype and layout of the arrays (shapes are checked by ``bind_syms``)."""
    bufs = func.buffers
    if len(arrays) != len(bufs):
        raise RuntimeCheckError(f"{name}: expects {len(bufs)} arrays ({', '.join(b.name for b in bufs)}), got {len(arrays)}")
    for i, (b, a) in enumerate(zip(bufs, arrays)):
        if not isinstance(a, np.ndarray):
            raise RuntimeCheckError(f"{name}: {_arg_name(func, i)} must be a NumPy array, got {type(a).__name__}")
        if a.dtype != np_dtype(b.dtype):
            raise RuntimeCheckError(f"{name}: {_arg_name(func, i)} has dtype {a.dtype}, expected {b.dtype}")
        if contiguous and not a.flags.c_contiguous:
            raise RuntimeCheckError(f"{name}: {_arg_name(func, i)} is not C-contiguous")
        if i >= len(bufs) - func.num_outputs and not a.flags.writeable:
            raise RuntimeCheckError(f"{name}: output {_arg_name(func, i)} is read-only")


def _given_env(func: TensorFunc, given: SymValues, name: str) -> dict[SymVar, int]:
    """Values given by the caller: a sequence for ``func.sym_params`` in order, or a mapping
    from any kernel sym var (or its name) to its value."""
    params = func.sym_params
    if given is None:
        return {}
    if isinstance(given, Mapping):
        known = kernel_syms(func)
        by_name = {v.name: v for v in known}
        env: dict[SymVar, int] = {}
        for k, val in given.items():
            v = k if isinstance(k, SymVar) and k in known else by_name.get(k) if isinstance(k, str) else None
            if v is None:
                raise RuntimeCheckError(f"{name}: {k!r} is not a sym var of the kernel (has: {', '.join(by_name) or 'none'})")
            env[v] = int(val)
        return env
    vals = list(given)
    if len(vals) != len(params):
        raise RuntimeCheckError(f"{name}: expects {len(params)} sym param value(s) ({', '.join(v.name for v in params)}), got {len(vals)}")
    return {v: int(x) for v, x in zip(params, vals)}


def bind_syms(func: TensorFunc, arrays: Sequence[np.ndarray], sym_params: SymValues = None, name: str = "kernel") -> list[int]:
    """The kernel sym var values (``kernel_syms`` order) that the arrays' shapes imply.

    ``sym_params`` gives the values of ``func.sym_params`` (a sequence in their order), or of
    any kernel sym vars (a mapping by var or name). Other vars are bound by their first bare
    occurrence as a dim; every dim is then checked, as is each var's declared range. Raises ``RuntimeCheckError`` naming the
    argument, the dim and where the var was bound.
    """
    bufs = func.buffers
    if len(arrays) != len(bufs):
        raise RuntimeCheckError(f"{name}: expects {len(bufs)} arrays, got {len(arrays)}")
    env = _given_env(func, sym_params, name)
    where: dict[SymVar, str] = {v: "the given sym values" for v in env}
    for i, (b, a) in enumerate(zip(bufs, arrays)):
        if a.ndim != len(b.shape):
            raise RuntimeCheckError(f"{name}: {_arg_name(func, i)} has rank {a.ndim}, expected {len(b.shape)}")
        for k, d in enumerate(b.shape):
            if isinstance(d, SymVar) and d not in env:
                env[d] = int(a.shape[k])
                where[d] = f"{_arg_name(func, i)} shape[{k}]"
    for v, val in env.items():
        if val < v.lo or (v.hi is not None and val > v.hi):
            hi = "" if v.hi is None else f", <= {v.hi}"
            raise RuntimeCheckError(f"{name}: {v.name} = {val} (from {where[v]}) is outside its range (>= {v.lo}{hi})")
    out = []
    for v in kernel_syms(func):
        if v not in env:
            raise RuntimeCheckError(f"{name}: sym var {v.name} cannot be derived from the argument shapes; pass it as a sym param")
        out.append(env[v])
    for i, (b, a) in enumerate(zip(bufs, arrays)):
        for k, d in enumerate(b.shape):
            want = sym_walk.evaluate(d, env)
            if a.shape[k] != want:
                src = ", ".join(f"{v.name} = {env[v]}, bound by {where[v]}" for v in sym_walk.free_vars(d))
                detail = f" ({src})" if src else ""
                raise RuntimeCheckError(f"{name}: {_arg_name(func, i)} shape[{k}] = {a.shape[k]} but {sym.to_str(d)} = {want}{detail}")
    return out


_MAX_SYM = 1 << 62


def call_checker(func: TensorFunc, name: str = "kernel") -> Callable[[Sequence[Any], Any], None]:
    """A check of one call ``kernel(arrays, sym_values)`` as a VM makes it (sym values in
    ``kernel_syms`` order), for code that is not trusted to make it right: the arrays' count,
    type, dtype, layout and writability (``check_arrays``), the sym values' count, type and
    declared ranges, and every buffer's shape against its dims evaluated at those values, so
    that a call that passes is one the kernel's loops stay inside. Raises ``RuntimeCheckError``
    naming the kernel and the argument."""
    syms = kernel_syms(func)
    bufs = func.buffers
    nb, ns, first_out = len(bufs), len(syms), len(bufs) - func.num_outputs
    dtypes = [np_dtype(b.dtype) for b in bufs]
    ranges = [(v.lo, _MAX_SYM if v.hi is None else v.hi) for v in syms]
    # each dim as (sym index, None) when it is a var of ``syms``, (None, int) when constant,
    # (None, expr) otherwise (evaluated at the call)
    position = {v: j for j, v in enumerate(syms)}
    dims: list[list[tuple[int | None, Any]]] = [[(position[d], None) if isinstance(d, SymVar) and d in position else (None, d) for d in b.shape] for b in bufs]

    def fail(arrays: Sequence[Any], sym_values: Any) -> None:
        """The detailed checks, run when the fast one below did not pass: they raise with the
        message, or return when the call is right in a form the fast check does not take
        (NumPy ints as sym values)."""
        check_arrays(func, arrays, name)
        if not isinstance(sym_values, (tuple, list)) or len(sym_values) != ns:
            raise RuntimeCheckError(f"{name}: expects {ns} sym value(s) ({', '.join(v.name for v in syms)}), got {sym_values!r:.200}")
        env: dict[SymVar, int] = {}
        for v, val in zip(syms, sym_values):
            if not isinstance(val, (int, np.integer)) or isinstance(val, bool) or not -_MAX_SYM < int(val) < _MAX_SYM:
                raise RuntimeCheckError(f"{name}: sym value {v.name} = {val!r:.80} is not an int")
            val = int(val)
            if val < v.lo or (v.hi is not None and val > v.hi):
                hi = "" if v.hi is None else f", <= {v.hi}"
                raise RuntimeCheckError(f"{name}: {v.name} = {val} is outside its range (>= {v.lo}{hi})")
            env[v] = val
        for i, (b, a) in enumerate(zip(bufs, arrays)):
            if a.ndim != len(b.shape):
                raise RuntimeCheckError(f"{name}: {_arg_name(func, i)} has rank {a.ndim}, expected {len(b.shape)}")
            for k, d in enumerate(b.shape):
                try:
                    want = sym_walk.evaluate(d, env)
                except (ArithmeticError, KeyError, ValueError) as e:
                    raise RuntimeCheckError(f"{name}: {_arg_name(func, i)} shape[{k}] = {sym.to_str(d)} cannot be evaluated at the given sym values: {e}") from None
                if a.shape[k] != want:
                    raise RuntimeCheckError(f"{name}: {_arg_name(func, i)} shape[{k}] = {a.shape[k]} but {sym.to_str(d)} = {want} at the given sym values")

    def check(arrays: Sequence[Any], sym_values: Any) -> None:
        if len(arrays) != nb or type(sym_values) not in (tuple, list) or len(sym_values) != ns:
            return fail(arrays, sym_values)
        for val, (lo, hi) in zip(sym_values, ranges):
            if type(val) is not int or not lo <= val <= hi:
                return fail(arrays, sym_values)
        env: dict[SymVar, int] | None = None
        for i, a in enumerate(arrays):
            if type(a) is not np.ndarray or a.dtype != dtypes[i] or not a.flags.c_contiguous or (i >= first_out and not a.flags.writeable):
                return fail(arrays, sym_values)
            shape = a.shape
            want = dims[i]
            if len(shape) != len(want):
                return fail(arrays, sym_values)
            for got, (j, d) in zip(shape, want):
                if j is not None:
                    if got != sym_values[j]:
                        return fail(arrays, sym_values)
                elif type(d) is int:
                    if got != d:
                        return fail(arrays, sym_values)
                else:
                    if env is None:
                        env = dict(zip(syms, sym_values))
                    try:
                        ok = got == sym_walk.evaluate(d, env)
                    except (ArithmeticError, KeyError, ValueError):
                        ok = False
                    if not ok:
                        return fail(arrays, sym_values)
        return None

    return check
