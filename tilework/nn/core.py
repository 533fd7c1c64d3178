"""The core of ``tilework.nn``: ``Tensor``, ``Parameter``, ``Module`` and ``ModuleList``.

A ``Tensor`` is a symbolic proxy: it wraps a graph expression whose struct info gives its
(symbolic) shape and dtype. Every operation on it emits one binding through the BlockBuilder of
the export in progress (a *trace*); outside an export there is nothing to emit into and an
operation is an error. A ``Parameter`` is a Tensor with a declared static shape and dtype and an
optional NumPy value; during an export it stands for the trailing function parameter (or the
constant) the exporter bound to it.

A ``Module`` finds its parameters and sub-modules by walking its attributes in assignment order
(``ModuleList``, lists and tuples of modules included; attributes whose names start with ``_``
are private and skipped), so a subclass need not call ``super().__init__()``. Names are attribute
paths, ``layers.0.self_attn.q_proj.weight``; a parameter reachable by two paths (tied weights)
is one parameter, named by the first. Calling a module inside an export runs its ``forward``; a
``ShapeError`` or ``InferenceError`` raised inside is re-raised once, by the innermost module,
with the module's class, path and argument shapes in front of the message.
"""

from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import numpy as np

from tilework import op
from tilework.errors import InferenceError, ParameterError, ShapeError, TileworkError
from tilework.ir import sym
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Constant, Expr
from tilework.ir.dtype import DTYPES
from tilework.ir.info import TensorInfo, shape_str
from tilework.ir.sym import Dim, SymExpr
from tilework.ir.dtype import dtype_name, np_dtype
from tilework.runtime.tensor import from_torch, is_torch_tensor

if TYPE_CHECKING:
    from tilework.compiled import CompiledModel
    from tilework.ir.module import IRModule
    from tilework.nn.spec import DimBounds, Spec

INITS = ("normal", "zeros", "ones")
_FLOATS = ("float16", "bfloat16", "float32", "float64")


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
    if isinstance(value, float) and dtype not in _FLOATS:
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
        dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return emit(op.reshape(self.expr, dims))  # type: ignore[arg-type]

    def permute(self, *axes: int | Sequence[int]) -> "Tensor":
        """Dims reordered: output dim ``i`` is input dim ``axes[i]``."""
        order = tuple(axes[0]) if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return emit(op.permute_dims(self.expr, order))  # type: ignore[arg-type]

    def transpose(self, a: int, b: int) -> "Tensor":
        """Dims ``a`` and ``b`` swapped."""
        order = list(range(self.ndim))
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    def astype(self, dtype: str) -> "Tensor":
        return self if self.info.dtype == dtype else emit(op.astype(self.expr, dtype))

    def __getitem__(self, key: object) -> "Tensor":
        return _index(self, key if isinstance(key, tuple) else (key,))


def _is_int(v: object) -> bool:
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
            if isinstance(d, int) and not -d <= k < d:  # type: ignore[operator]
                raise ShapeError(f"index {k} is out of range for axis {axis} of shape {shape_str(shape)}")
            takes.append((axis, k))
        else:
            raise ShapeError(f"unsupported index {k!r}: use ints, slices and ...; gather with nn.take")
    out = x
    if axes:
        out = emit(op.strided_slice(out.expr, axes, begin, end, strides))  # type: ignore[arg-type]
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

    __slots__ = ("_info", "data", "init")

    def __init__(self, shape: Sequence[int], dtype: str = "float32", init: str = "normal") -> None:
        dims = tuple(shape)
        if not all(_is_int(d) and d >= 0 for d in dims):  # type: ignore[operator]
            raise ParameterError(f"a Parameter's shape must be non-negative ints, got {dims!r}")
        if dtype not in DTYPES:
            raise ParameterError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        if init not in INITS:
            raise ParameterError(f"unknown init {init!r}; expected one of {', '.join(INITS)}")
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

    def __repr__(self) -> str:
        return f"nn.Parameter({describe(self)}{'' if self.data is not None else ', no value'})"

    def checked_value(self, value: Any, name: str) -> np.ndarray:
        """``value`` as this parameter's array: the shape must match exactly; floating-point
        values are converted to the parameter's float dtype, anything else must match it."""
        a = to_numpy(value)
        want = tuple(int(d) for d in self.shape)  # type: ignore[arg-type]
        if tuple(a.shape) != want:
            raise ParameterError(f"{name}: a value of shape {tuple(a.shape)} for a parameter of shape {want}")
        got = dtype_name(a.dtype)
        if got != self.dtype:
            if got not in _FLOATS or self.dtype not in _FLOATS:
                raise ParameterError(f"{name}: a {got} value for a {self.dtype} parameter")
            a = a.astype(np_dtype(self.dtype))
        return np.ascontiguousarray(a)

    def random_value(self, rng: np.random.Generator, scale: float) -> np.ndarray:
        shape = tuple(int(d) for d in self.shape)  # type: ignore[arg-type]
        dt = np_dtype(self.dtype)
        if self.init == "zeros":
            return np.zeros(shape, dt)
        if self.init == "ones":
            return np.ones(shape, dt)
        if self.dtype not in _FLOATS:
            return rng.integers(0, 2, size=shape).astype(dt)
        return (scale * rng.standard_normal(shape)).astype(dt)


# -- Module ----------------------------------------------------------------------------------

M = TypeVar("M", bound="Module")


def _modules_in(value: object) -> list["Module"] | None:
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Module) for v in value):
        return list(value)
    return None


class Module:
    """Base of tilework.nn modules; see the module docstring. A subclass defines ``forward``."""

    def members(self) -> Iterator[tuple[str, "Parameter | Module"]]:
        """Direct parameters and sub-modules in attribute order (lists of modules expanded)."""
        for name, value in vars(self).items():
            if name.startswith("_"):
                continue
            if isinstance(value, (Parameter, Module)):
                yield name, value
                continue
            listed = _modules_in(value)
            for i, m in enumerate(listed or []):
                yield f"{name}.{i}", m

    def named_modules(self) -> list[tuple[str, "Module"]]:
        """Every module (this one first, as ``""``) with its path; each once."""
        out: list[tuple[str, Module]] = []
        seen: set[int] = set()

        def visit(m: Module, path: str) -> None:
            if id(m) in seen:
                return
            seen.add(id(m))
            out.append((path, m))
            for name, v in m.members():
                if isinstance(v, Module):
                    visit(v, f"{path}.{name}" if path else name)

        visit(self, "")
        return out

    def named_parameters(self) -> list[tuple[str, Parameter]]:
        """Every parameter with its path, in attribute order; a shared one once."""
        out: list[tuple[str, Parameter]] = []
        seen: set[int] = set()

        def visit(m: Module, prefix: str) -> None:
            if id(m) in seen:
                return
            seen.add(id(m))
            for name, v in m.members():
                if isinstance(v, Module):
                    visit(v, f"{prefix}{name}.")
                elif id(v) not in seen:
                    seen.add(id(v))
                    out.append((prefix + name, v))

        visit(self, "")
        return out

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    # -- values ------------------------------------------------------------------------------

    def missing_parameters(self) -> list[str]:
        """Names of the parameters that have no value yet."""
        return [name for name, p in self.named_parameters() if p.data is None]

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every parameter's value by name; a parameter without one is an error."""
        require_values(self)
        return {name: p.data for name, p in self.named_parameters() if p.data is not None}

    def ignored_state_keys(self, keys: Iterable[str]) -> set[str]:
        """Keys of a state dict that name no parameter yet are expected (buffers a checkpoint
        carries, a tied weight stored twice); ``load_state_dict`` skips them. None by default."""
        return set()

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Set parameter values from ``{name: array}`` (NumPy arrays or torch tensors). With
        ``strict``, every parameter must be given and every key must name a parameter (or be
        one of ``ignored_state_keys``). Values are checked (``Parameter.checked_value``) before
        any is set."""
        params = dict(self.named_parameters())
        ignored = self.ignored_state_keys(state.keys())
        unexpected = [k for k in state if k not in params and k not in ignored]
        missing = [k for k in params if k not in state]
        if strict and (unexpected or missing):
            parts = []
            if missing:
                parts.append(f"missing {_names(missing)}")
            if unexpected:
                parts.append(f"unexpected {_names(unexpected)}")
            raise ParameterError(f"{type(self).__name__}.load_state_dict: {'; '.join(parts)}")
        values = {k: params[k].checked_value(v, k) for k, v in state.items() if k in params}
        for k, a in values.items():
            params[k].data = a

    def init_random(self: M, seed: int = 0, scale: float = 0.02) -> M:
        """Give every parameter a random value by its ``init``; returns the module."""
        rng = np.random.default_rng(seed)
        for _, p in self.named_parameters():
            p.data = p.random_value(rng, scale)
        return self

    # -- calling, exporting ------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward = getattr(self, "forward", None)
        if not callable(forward):
            raise TileworkError(f"{type(self).__name__} defines no forward method")
        return self.run_method(forward, args, kwargs)

    def run_method(self, method: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """``method(*args, **kwargs)`` in the current trace, as this module (for naming and for
        the context errors get)."""
        trace = current_trace()
        path = trace.paths.get(id(self), "")
        trace.scope.append(path)
        try:
            return method(*args, **kwargs)
        except (ShapeError, InferenceError) as e:
            if getattr(e, "nn_module", None) is not None:
                raise
            raise _with_context(e, self, path, method, args, kwargs) from e
        finally:
            trace.scope.pop()

    def export(self, spec: "Spec", dim_bounds: "DimBounds | None" = None, weights: str = "params") -> tuple["IRModule", list[str]]:
        """The module's methods as graph functions, see ``tilework.nn.export.export``."""
        from tilework.nn.export import export

        return export(self, spec, dim_bounds, weights=weights)

    def compile(self, spec: "Spec | None" = None, dim_bounds: "DimBounds | None" = None, weights: str = "inputs") -> "CompiledModel":
        """``forward`` compiled once for every shape the spec allows; the result is called with
        arrays (NumPy or torch) and passes the parameter values itself, as they are now."""
        from tilework.nn.export import compile_module

        return compile_module(self, spec, dim_bounds, weights)

    def default_spec(self) -> "Spec | None":
        """The input spec ``compile`` uses when none is given; None: one must be given."""
        return None


class ModuleList(Module):
    """A list of modules, named ``0``, ``1``, ... under the attribute that holds the list."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        self._items: list[Module] = []
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> None:
        if not isinstance(module, Module):
            raise TileworkError(f"ModuleList holds modules, got {type(module).__name__}")
        self._items.append(module)

    def members(self) -> Iterator[tuple[str, Parameter | Module]]:
        for i, m in enumerate(self._items):
            yield str(i), m

    def __getitem__(self, i: int) -> Module:
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._items)


# -- helpers ---------------------------------------------------------------------------------


def _names(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def require_values(module: Module) -> None:
    missing = module.missing_parameters()
    if missing:
        raise ParameterError(
            f"{type(module).__name__}: parameter(s) without a value: {_names(missing)}; "
            "set them with module.load_state_dict({name: array}) or module.init_random(seed)"
        )


def _arguments(method: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    try:
        bound = inspect.signature(method).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    return list(bound.arguments.items())


def _with_context(e: TileworkError, module: Module, path: str, method: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> TileworkError:
    """``e`` again (same class) with the module and its argument shapes in front."""
    where = f"{type(module).__name__} '{path}'" if path else f"{type(module).__name__} (the exported module)"
    name = getattr(method, "__name__", "forward")
    call = ", ".join(f"{k}: {describe(v)}" for k, v in _arguments(method, args, kwargs))
    msg = f"in {where}.{name}({call}): {e}"
    try:
        new = type(e)(msg)
    except TypeError:
        new = ShapeError(msg) if isinstance(e, ShapeError) else InferenceError(msg)
    new.nn_module = path  # type: ignore[attr-defined]
    return new


def require_dim(got: Dim, want: Dim, what: str) -> None:
    """A ShapeError when ``got`` provably differs from ``want`` (unprovable cases are left to
    the ops' run-time checks)."""
    if sym.prove_ne(got, want):
        raise ShapeError(f"{what} is {sym.to_str(got)}, expected {sym.to_str(want)}")


__all__ = ["Tensor", "Parameter", "Module", "ModuleList", "Trace", "tracing", "current_trace", "emit", "as_expr", "describe", "require_dim", "require_values", "to_numpy"]
