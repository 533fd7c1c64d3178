"""The core of ``tilework.nn``: the trace, ``Tensor`` and ``Parameter`` (``Module`` is in
``tilework.nn.module``).

A ``Tensor`` is a symbolic proxy: it wraps a graph expression whose struct info gives its
(symbolic) shape and dtype. Every operation on it emits one binding through the BlockBuilder of
the export in progress (a *trace*); outside an export there is nothing to emit into and an
operation is an error. A ``Parameter`` is a Tensor with a declared static shape and dtype and an
optional NumPy value; during an export it stands for the trailing function parameter (or the
constant) the exporter bound to it.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence, TypeGuard, TypeVar

import numpy as np

from tilework import op
from tilework.errors import InferenceError, ParameterError, ShapeError, TileworkError
from tilework.ir import sym
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Constant, Expr, TupleGetItem
from tilework.ir.dtype import DTYPES, FLOAT_DTYPES
from tilework.ir.info import TensorInfo, shape_str
from tilework.ir.sym import Dim, SymExpr
from tilework.ir.dtype import dtype_name, np_dtype
from tilework.runtime.tensor import from_torch, is_torch_tensor

INITS = ("normal", "zeros", "ones")
T = TypeVar("T")


# -- the trace: where operations emit --------------------------------------------------------


class Trace:
    """One method being exported: its builder, the path of every module, the expression bound
    to every parameter (by identity), and the stack of modules whose forward is running."""

    def __init__(self, bb: BlockBuilder, paths: Mapping[int, str], params: Mapping[int, Expr]) -> None:
        self.bb = bb
        self.paths = paths
        self.params = params
        self.scope: list[str] = []

    def name_hint(self) -> str | None:
        """The running module's path as an identifier, the name given to what it emits."""
        path = self.scope[-1] if self.scope else ""
        return path.replace(".", "_") or None


_local = threading.local()


def _stack() -> list[Trace]:
    if not hasattr(_local, "traces"):
        _local.traces = []
    stack: list[Trace] = _local.traces
    return stack


@contextmanager
def tracing(trace: Trace) -> Iterator[Trace]:
    """Make ``trace`` the one operations emit into while the ``with`` lasts."""
    _stack().append(trace)
    try:
        yield trace
    finally:
        _stack().pop()


def current_trace() -> Trace:
    stack = _stack()
    if not stack:
        raise TileworkError("tilework.nn tensors and modules run only while a module is exported: call module.export(spec), module.compile(spec) or tilework.compile(module, spec)")
    return stack[-1]


def emit(expr: Expr) -> "Tensor":
    """Bind ``expr`` in the current trace (named after the running module) as a Tensor."""
    trace = current_trace()
    return Tensor(trace.bb.emit(expr, trace.name_hint()))


def emit_tuple(expr: Expr, n: int) -> tuple["Tensor", ...]:
    """Bind ``expr``, a call with ``n`` tensor results (a tuple), in the current trace: its
    results as Tensors."""
    trace = current_trace()
    bound = trace.bb.emit(expr, trace.name_hint())
    return tuple(emit(TupleGetItem(bound, i)) for i in range(n))


# -- Tensor ----------------------------------------------------------------------------------


def describe(value: object) -> str:
    """A short account of a forward argument for error messages: shape and dtype of a tensor."""
    if isinstance(value, Tensor):
        info = value.info
        return f"{shape_str(info.shape) if info.shape is not None else f'rank {info.ndim}'} {info.dtype or '?'}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def scalar_constant(value: bool | int | float, like: "Tensor") -> Constant:
    """A Python number as a 0-d constant of ``like``'s dtype (a float with an integer tensor is
    refused rather than truncated)."""
    dtype = like.dtype
    if isinstance(value, float) and dtype not in FLOAT_DTYPES:
        raise InferenceError(f"cannot combine a {dtype} tensor with the float {value!r}; cast the tensor with .astype first")
    return Constant.of(np.asarray(value, dtype=np_dtype(dtype)))


def as_expr(value: object, like: "Tensor | None" = None) -> Expr:
    """A Tensor's expression; a Python number (in ``like``'s dtype) or an array as a constant."""
    if isinstance(value, Tensor):
        return value.expr
    if isinstance(value, np.generic) and value.ndim == 0 and like is not None:
        value = value.item()
    if isinstance(value, (bool, int, float)) and like is not None:
        return scalar_constant(value, like)
    if isinstance(value, np.ndarray):
        return Constant.of(value)
    raise TileworkError(f"expected an nn.Tensor{', a number' if like is not None else ''} or a NumPy array, got {type(value).__name__}: {describe(value)}")


class Tensor:
    """A symbolic tensor inside an export; see the module docstring.

    ``shape`` is a tuple of dims (ints and symbolic expressions, usable in ``reshape``),
    operators ``+ - * / ** @`` and unary ``-`` emit elementwise ops and ``matmul`` (a Python
    number takes the tensor's dtype), indexing takes ints, slices (symbolic bounds allowed) and
    ``...``.
    """

    __slots__ = ("_expr",)
    __array_ufunc__ = None  # ``array + tensor`` defers to ``Tensor.__radd__``

    def __init__(self, expr: Expr) -> None:
        if not isinstance(expr.info, TensorInfo):
            raise TileworkError(f"nn.Tensor wraps a tensor-valued expression, got one with {expr.info}")
        self._expr = expr

    @property
    def expr(self) -> Expr:
        return self._expr

    @property
    def info(self) -> TensorInfo:
        info = self.expr.info
        assert isinstance(info, TensorInfo)
        return info

    @property
    def shape(self) -> tuple[Dim, ...]:
        shape = self.info.shape
        if shape is None:
            raise ShapeError(f"the shape of this tensor is not known (rank {self.info.ndim}); match_cast it or keep shapes static")
        return shape

    @property
    def ndim(self) -> int:
        return self.info.ndim

    @property
    def dtype(self) -> str:
        dtype = self.info.dtype
        if dtype is None:
            raise InferenceError("the dtype of this tensor is not known")
        return dtype

    def __repr__(self) -> str:
        return f"nn.Tensor({describe(self)})"

    # -- arithmetic ----------------------------------------------------------------------------

    def _binary(self, name: str, other: object, reflected: bool = False) -> "Tensor":
        a, b = self.expr, as_expr(other, self)
        return emit(op.elementwise.binary(name, b, a) if reflected else op.elementwise.binary(name, a, b))

    def __add__(self, other: object) -> "Tensor":
        return self._binary("add", other)

    def __radd__(self, other: object) -> "Tensor":
        return self._binary("add", other, True)

    def __sub__(self, other: object) -> "Tensor":
        return self._binary("subtract", other)

    def __rsub__(self, other: object) -> "Tensor":
        return self._binary("subtract", other, True)

    def __mul__(self, other: object) -> "Tensor":
        return self._binary("multiply", other)

    def __rmul__(self, other: object) -> "Tensor":
        return self._binary("multiply", other, True)

    def __truediv__(self, other: object) -> "Tensor":
        return self._binary("divide", other)

    def __rtruediv__(self, other: object) -> "Tensor":
        return self._binary("divide", other, True)

    def __pow__(self, other: object) -> "Tensor":
        return self._binary("power", other)

    def __matmul__(self, other: object) -> "Tensor":
        return emit(op.matmul(self.expr, as_expr(other)))

    def __rmatmul__(self, other: object) -> "Tensor":
        return emit(op.matmul(as_expr(other), self.expr))

    def __neg__(self) -> "Tensor":
        return emit(op.neg(self.expr))

    def __bool__(self) -> bool:
        raise TileworkError("an nn.Tensor has no truth value while tracing (its values exist only at run time); use nn.where for data-dependent choices")

    def __iter__(self) -> Iterator["Tensor"]:
        raise TileworkError("an nn.Tensor cannot be iterated while tracing; index it or use nn.split")

    # -- shape manipulation -----------------------------------------------------------------

    def reshape(self, *shape: Dim | Sequence[Dim]) -> "Tensor":
        """The same elements in a new shape (``reshape(b, s, 4, 16)`` or ``reshape((b, s, -1))``)."""
        return emit(op.reshape(self.expr, _one_or_many(shape, "reshape")))

    def permute(self, *axes: int | Sequence[int]) -> "Tensor":
        """Dims reordered: output dim ``i`` is input dim ``axes[i]``."""
        return emit(op.permute_dims(self.expr, _one_or_many(axes, "permute")))

    def transpose(self, a: int, b: int) -> "Tensor":
        """Dims ``a`` and ``b`` swapped."""
        order = list(range(self.ndim))
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    def astype(self, dtype: str) -> "Tensor":
        return self if self.info.dtype == dtype else emit(op.astype(self.expr, dtype))

    def __getitem__(self, key: object) -> "Tensor":
        return _index(self, key if isinstance(key, tuple) else (key,))


def _one_or_many(args: tuple[T | Sequence[T], ...], what: str) -> tuple[T, ...]:
    """The values of ``f(a, b, c)`` or of ``f((a, b, c))``."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    flat = tuple(a for a in args if not isinstance(a, Sequence))
    if len(flat) != len(args):
        raise ShapeError(f"{what} takes values or one sequence of them, got {args!r}")
    return flat


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _index(x: Tensor, key: tuple[object, ...]) -> Tensor:
    """``x[key]``: slices become one ``strided_slice``, ints a ``take`` each (dropping the axis)."""
    if sum(k is Ellipsis for k in key) > 1:
        raise ShapeError("an index can have only one ellipsis")
    n = len(key) - (1 if Ellipsis in key else 0)
    shape = x.shape
    if n > len(shape):
        raise ShapeError(f"too many indices ({n}) for a tensor of shape {shape_str(shape)}")
    items: list[object] = []
    for k in key:
        items.extend([slice(None)] * (len(shape) - n) if k is Ellipsis else [k])
    axes, begin, end, strides, takes = [], [], [], [], []
    for axis, k in enumerate(items):
        if isinstance(k, slice):
            if k == slice(None):
                continue
            step = 1 if k.step is None else k.step
            for bound in (k.start, k.stop):
                if bound is not None and not isinstance(bound, (int, SymExpr)):
                    raise ShapeError(f"slice bounds must be ints or symbolic dims, got {bound!r}")
            if not _is_int(step) or step == 0:
                raise ShapeError(f"slice steps must be non-zero ints, got {k.step!r}")
            axes.append(axis)
            begin.append(k.start)
            end.append(k.stop)
            strides.append(step)
        elif _is_int(k):
            d = shape[axis]
            if isinstance(d, int) and not -d <= k < d:
                raise ShapeError(f"index {k} is out of range for axis {axis} of shape {shape_str(shape)}")
            takes.append((axis, k))
        else:
            raise ShapeError(f"unsupported index {k!r}: use ints, slices and ...; gather with nn.take")
    out = x
    if axes:
        out = emit(op.strided_slice(out.expr, axes, begin, end, strides))
    for axis, k in reversed(takes):
        out = emit(op.take(out.expr, Constant.of(np.asarray(k, dtype=np.int64)), axis=axis))
    return out


# -- Parameter -------------------------------------------------------------------------------


def to_numpy(value: Any) -> np.ndarray:
    """An array for a parameter value: NumPy arrays and anything ``np.asarray`` takes, torch
    tensors (bfloat16 included) copied off their storage."""
    if is_torch_tensor(value):
        return np.array(from_torch(value), copy=True)
    return np.asarray(value)


class Parameter(Tensor):
    """A weight of static ``shape`` and ``dtype``; ``data`` holds its value (None until loaded
    or initialized). ``init`` says how ``Module.init_random`` fills it: ``normal`` (scaled
    standard normal), ``zeros`` or ``ones``."""

    __slots__ = ("_info", "_shape", "data", "init")

    def __init__(self, shape: Sequence[int], dtype: str = "float32", init: str = "normal") -> None:
        dims = tuple(shape)
        if not all(_is_int(d) and d >= 0 for d in dims):
            raise ParameterError(f"a Parameter's shape must be non-negative ints, got {dims!r}")
        if dtype not in DTYPES:
            raise ParameterError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        if init not in INITS:
            raise ParameterError(f"unknown init {init!r}; expected one of {', '.join(INITS)}")
        self._shape = dims
        self._info = TensorInfo(dims, dtype)
        self.data: np.ndarray | None = None
        self.init = init

    @property
    def expr(self) -> Expr:
        bound = current_trace().params.get(id(self))
        if bound is None:
            raise ParameterError(f"a Parameter {describe(self)} that is not reachable from the exported module's attributes was used; assign it (or its module) to an attribute")
        return bound

    @property
    def info(self) -> TensorInfo:
        return self._info

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def __repr__(self) -> str:
        return f"nn.Parameter({describe(self)}{'' if self.data is not None else ', no value'})"

    def checked_value(self, value: Any, name: str) -> np.ndarray:
        """``value`` as this parameter's array: the shape must match exactly; floating-point
        values are converted to the parameter's float dtype, anything else must match it."""
        a = to_numpy(value)
        want = self.shape
        if tuple(a.shape) != want:
            raise ParameterError(f"{name}: a value of shape {tuple(a.shape)} for a parameter of shape {want}")
        got = dtype_name(a.dtype)
        if got != self.dtype:
            if got not in FLOAT_DTYPES or self.dtype not in FLOAT_DTYPES:
                raise ParameterError(f"{name}: a {got} value for a {self.dtype} parameter")
            a = a.astype(np_dtype(self.dtype))
        return np.ascontiguousarray(a)

    def random_value(self, rng: np.random.Generator, scale: float) -> np.ndarray:
        shape = self.shape
        dt = np_dtype(self.dtype)
        if self.init == "zeros":
            return np.zeros(shape, dt)
        if self.init == "ones":
            return np.ones(shape, dt)
        if self.dtype not in FLOAT_DTYPES:
            return rng.integers(0, 2, size=shape).astype(dt)
        return (scale * rng.standard_normal(shape)).astype(dt)


def require_dim(got: Dim, want: Dim, what: str) -> None:
    """A ShapeError when ``got`` provably differs from ``want`` (unprovable cases are left to
    the ops' run-time checks)."""
    if sym.prove_ne(got, want):
        raise ShapeError(f"{what} is {sym.to_str(got)}, expected {sym.to_str(want)}")


__all__ = ["Tensor", "Parameter", "Trace", "tracing", "current_trace", "emit", "as_expr", "describe", "require_dim", "to_numpy"]
