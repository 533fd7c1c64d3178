"""Builtin functions the VM calls by name (``vm.builtin.*``).

Lowered graph functions reach the run time only through calls; the builtins here allocate
tensors, match and build shapes through the shape heap, check struct info at function
boundaries, and handle tuples, views and conditions. Each is a plain Python function found by
name once, when the VM loads an executable, never per call.

The shape heap is a list of ints, one slot per distinct sym var or derived dim of a function.
``match_shape`` reads a tensor's (or shape value's) dims with one code per dim:
``STORE`` binds a slot, ``ASSERT_IMM`` checks a constant, ``ASSERT_SLOT`` checks an already
bound slot, ``SKIP`` ignores the dim. Failed checks raise ``RuntimeCheckError`` with a message
that names the function, the argument, the dim and the sym var, and where the var was bound.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import numpy as np

from tilework.errors import BuildError, RuntimeCheckError
from tilework.op.vm import ASSERT_IMM, ASSERT_SLOT, DIM_OPS, STORE
from tilework.runtime.memory import CarveSite, Memory, carve, empty_tensor
from tilework.runtime.tensor import describe
from tilework.ir.dtype import np_dtype


BUILTINS: dict[str, Callable[..., Any]] = {}


def builtin(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        BUILTINS[name] = fn
        return fn

    return deco


class ShapeHeap(list):
    """Slots of sym var values; ``names`` and ``bounds`` describe them for error messages and
    ``origin`` records where each var was bound in this call (``y.shape[1]``)."""

    __slots__ = ("names", "bounds", "origin")

    def __init__(self, size: int, names: Sequence[str], bounds: Sequence[tuple[int, int | None]]) -> None:
        super().__init__([0] * size)
        self.names = names
        self.bounds = bounds
        self.origin: list[str] = [""] * size


@builtin("vm_alloc_shape_heap")
def alloc_shape_heap(size: int, names: tuple[str, ...], bounds: tuple[tuple[int, int | None], ...]) -> ShapeHeap:
    return ShapeHeap(size, names, bounds)


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return describe(value)


@builtin("vm_check_tensor_info")
def check_tensor_info(value: Any, ndim: int, dtype: str | None, where: str) -> None:
    if not isinstance(value, np.ndarray):
        raise RuntimeCheckError(f"{where} expects a tensor, got {_describe(value)}")
    if ndim != -1 and value.ndim != ndim:
        raise RuntimeCheckError(f"{where} expects a tensor of rank {ndim}, got rank {value.ndim} (shape {tuple(value.shape)})")
    if dtype is not None and value.dtype != np_dtype(dtype):
        raise RuntimeCheckError(f"{where} expects dtype {dtype}, got {value.dtype}")


@builtin("vm_check_static_tensors")
def check_static_tensors(*args: Any) -> None:
    """``args``: the values, then shapes, dtypes, labels and where (see ``vm_check_static_tensors``).
    The fast path compares each value's shape tuple and dtype; a mismatch is reported by the
    detailed checks, with their messages."""
    *values, shapes, dtypes, labels, where = args
    for value, shape, dtype, label in zip(values, shapes, dtypes, labels):
        if isinstance(value, np.ndarray) and value.shape == shape and value.dtype == np_dtype(dtype):
            continue
        here = f"{where} {label}"
        check_tensor_info(value, len(shape), dtype, here)
        for i, (got, want) in enumerate(zip(value.shape, shape)):
            if got != want:
                raise RuntimeCheckError(f"{here}: {label}.shape[{i}] = {got} but it must be {want}")


@builtin("vm_check_tuple_info")
def check_tuple_info(value: Any, size: int, where: str) -> None:
    if not isinstance(value, tuple) or len(value) != size:
        raise RuntimeCheckError(f"{where} expects a tuple of {size}, got {_describe(value)}")


@builtin("vm_check_shape_info")
def check_shape_info(value: Any, ndim: int, where: str) -> None:
    if not isinstance(value, tuple) or (ndim != -1 and len(value) != ndim):
        raise RuntimeCheckError(f"{where} expects a shape of rank {ndim}, got {_describe(value)}")


@builtin("vm_check_prim_info")
def check_prim_info(value: Any, dtype: str | None, where: str) -> None:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return
    if not isinstance(value, (int, float, bool, np.generic)):
        raise RuntimeCheckError(f"{where} expects a {dtype or 'scalar'} value, got {_describe(value)}")


@builtin("vm_match_shape")
def match_shape(value: Any, heap: ShapeHeap, codes: tuple[int, ...], where: str, label: str) -> None:
    """Match the dims of ``value`` against ``codes`` (pairs of code and operand per dim); a
    scalar (a Prim value) is matched as one dim."""
    scalar = not isinstance(value, (np.ndarray, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 0 and len(codes) == 2)
    dims = (value,) if scalar else value.shape if isinstance(value, np.ndarray) else value
    for i in range(len(codes) // 2):
        code, operand = codes[2 * i], codes[2 * i + 1]
        d = int(dims[i])
        at = label if scalar else f"{label}[{i}]"
        if code == STORE:
            lo, hi = heap.bounds[operand]
            name = heap.names[operand]
            if d < lo or (hi is not None and d > hi):
                rng = f"{name} <= {hi}" if hi is not None and d > hi else f"{name} >= {lo}"
                raise RuntimeCheckError(f"{where}: {at} = {d} but {rng}")
            heap[operand] = d
            heap.origin[operand] = at
        elif code == ASSERT_IMM:
            if d != operand:
                raise RuntimeCheckError(f"{where}: {at} = {d} but it must be {operand}")
        elif code == ASSERT_SLOT:
            if d != heap[operand]:
                name = heap.names[operand]
                origin = heap.origin[operand]
                bound = f", bound by {origin}" if origin else ""
                raise RuntimeCheckError(f"{where}: {at} = {d} but {name} = {heap[operand]}{bound}")


_DIM_CHECKS: dict[str, Callable[[int, int], bool]] = {
    "eq": lambda x, y: x == y,
    "broadcast": lambda x, y: x == y or (x == 1 and y >= 1) or (y == 1 and x >= 1),
    "ge": lambda x, y: x >= y,
    "divides": lambda x, y: y != 0 and x % y == 0,
    "expands": lambda x, y: x == y or x == 1,
}


def _slot_values(heap: ShapeHeap, slots: Sequence[int]) -> str:
    """``h // 2 = 0``: each slot's name (its dim expression) and value in this call, a constant's
    slot (its name is its value, a check's bound) left out; ``, ``-separated."""
    parts = []
    for s in dict.fromkeys(slots):
        name, value = heap.names[s], heap[s]
        if name != str(value):
            parts.append(f"{name} = {value}")
    return ", ".join(parts)


@builtin("vm_check_dims")
def check_dims(heap: ShapeHeap, checks: tuple[Any, ...], where: str) -> None:
    """Facts between slots that inference assumed: ``(kind, slot_a, slot_b, message)``. A failed
    one names the values of its dim expressions: ``must be positive: h // 2 = 0``. The exported
    C runtime gives the same text (``twrt_dim_fail``)."""
    for kind, a, b, message in checks:
        x, y = heap[a], heap[b]
        if not _DIM_CHECKS[kind](x, y):
            values = _slot_values(heap, (a, b))
            raise RuntimeCheckError(f"{where}: {message}: {values}" if values else f"{where}: {message}")


@builtin("vm_make_shape")
def make_shape(heap: ShapeHeap, codes: tuple[int, ...]) -> tuple[int, ...]:
    """A shape value from pairs (0, imm) / (1, slot)."""
    return tuple(codes[i + 1] if codes[i] == 0 else heap[codes[i + 1]] for i in range(0, len(codes), 2))


@builtin("vm_alloc_tensor")
def alloc_tensor(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return empty_tensor(shape, np_dtype(dtype))


BUILTINS["vm_alloc_tensor_from_storage"] = carve


@builtin("vm_view")
def reshape(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A view of ``x`` with a new shape (no copy: ``x`` is contiguous)."""
    return x.reshape(shape)


@builtin("vm_read_if_cond")
def read_if_cond(x: Any) -> bool:
    if isinstance(x, np.ndarray):
        if x.size != 1:
            raise RuntimeCheckError(f"an If condition must be a scalar, got a tensor of shape {tuple(x.shape)}")
        return bool(x.reshape(()))
    return bool(x)


@builtin("vm.make_tuple")
def make_tuple(*fields: Any) -> tuple[Any, ...]:
    return fields


@builtin("vm.tuple_getitem")
def tuple_getitem(t: tuple[Any, ...], index: int) -> Any:
    return t[index]


@builtin("vm.shape_of")
def shape_of(x: np.ndarray) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


@builtin("vm_tensor_to_shape")
def tensor_to_shape(x: np.ndarray) -> tuple[int, ...]:
    return tuple(int(v) for v in np.asarray(x).reshape(-1))


# -- derived dims: small arithmetic programs over heap slots --------------------------------

_BINARY: dict[str, Callable[[int, int], int]] = {
    "floordiv": operator.floordiv,
    "floormod": operator.mod,
    "min": min,
    "max": max,
}
_MAX_PROGRAM_DEPTH = 64


def compile_dim_program(program: Any, heap_size: int | None = None, depth: int = 0) -> Callable[[list[int]], int]:
    """A function of the heap computing a ``vm_shape_func`` program (``tilework.op.vm
    .dim_program``); the structure is checked (known operations, their arity, int operands,
    slots inside the heap), so a malformed program is an error here, at load, not at run time."""
    if not isinstance(program, tuple) or not program or program[0] not in DIM_OPS or depth > _MAX_PROGRAM_DEPTH:
        raise RuntimeCheckError(f"invalid dim program {program!r}")
    op, args = program[0], program[1:]
    arity = DIM_OPS[op]
    if (arity >= 0 and len(args) != arity) or (arity < 0 and len(args) < 2):
        raise RuntimeCheckError(f"invalid dim program {program!r}: {op} takes {arity if arity >= 0 else 'two or more'} operand(s)")
    if op in ("slot", "const"):
        v = args[0]
        if type(v) is not int or (op == "slot" and (v < 0 or (heap_size is not None and v >= heap_size))):
            raise RuntimeCheckError(f"invalid dim program {program!r}")
        if op == "slot":
            return lambda h: h[v]
        return lambda h: v
    fns = [compile_dim_program(a, heap_size, depth + 1) for a in args]
    if op == "add":
        return lambda h: sum(f(h) for f in fns)
    if op == "mul":

        def product(h: list[int]) -> int:
            out = 1
            for f in fns:
                out *= f(h)
            return out

        return product
    fa, fb = fns
    fn = _BINARY[op]
    if op in ("floordiv", "floormod"):

        def divide(h: list[int]) -> int:
            b = fb(h)
            if b == 0:
                raise RuntimeCheckError("a derived dim divides by zero")
            return fn(fa(h), b)

        return divide
    return lambda h: fn(fa(h), fb(h))


@builtin("vm_shape_func")
def shape_func(heap: ShapeHeap, slots: tuple[int, ...], programs: tuple[Callable[[list[int]], int], ...]) -> None:
    """Compute derived slots in order; ``programs`` were compiled when the VM loaded."""
    for slot, fn in zip(slots, programs):
        heap[slot] = fn(heap)


@builtin("vm_load_dim")
def load_dim(heap: ShapeHeap, slot: int) -> int:
    return heap[slot]


@builtin("vm_kill")
def kill(x: Any) -> None:
    """Returns None into the register that held ``x``: the value is freed after its last use."""
    return None


@builtin("vm.copy")
def copy_ref(x: Any) -> Any:
    return x


# Hooks run once when the VM loads a call: they rewrite its static arguments into what the
# builtin wants at run time (here: dim programs into functions of the heap).
Arg = tuple[str, Any]


def _prepare_shape_func(args: list[Arg]) -> list[Arg]:
    heap, slots, (kind, programs) = args
    if kind != "i" or not isinstance(programs, tuple):
        raise RuntimeCheckError("vm_shape_func needs its programs as an immediate")
    return [heap, slots, (kind, tuple(compile_dim_program(p) for p in programs))]


def _dim_source(program: Any) -> str:
    """A Python expression of the heap ``h`` computing a dim program that ``compile_dim_program``
    accepted (so its operations, arities and int operands are known good)."""
    op, args = program[0], program[1:]
    if op == "slot":
        return f"h[{int(args[0])}]"
    if op == "const":
        return f"({int(args[0])})"
    parts = [_dim_source(a) for a in args]
    if op in ("add", "mul"):
        return "(" + (" + " if op == "add" else " * ").join(parts) + ")"
    if op in ("min", "max"):
        return f"{op}({parts[0]}, {parts[1]})"
    return f"{'fdiv' if op == 'floordiv' else 'fmod'}({parts[0]}, {parts[1]})"


def _divisor(b: int) -> int:
    if b == 0:
        raise RuntimeCheckError("a derived dim divides by zero")
    return b


_DIM_ENV = {"fdiv": lambda a, b: a // _divisor(b), "fmod": lambda a, b: a % _divisor(b)}


def _generated(src: str, name: str) -> Callable[..., Any]:
    env = dict(_DIM_ENV)
    exec(compile(src, f"<vm {name}>", "exec"), env)  # noqa: S102 - generated from checked ints only
    fn: Callable[..., Any] = env["f"]
    return fn


def _bind_shape_func(memory: Memory, args: list[Arg]) -> Bound:
    """One generated function of the heap computing every derived slot of the call, in order."""
    heap, (skind, slots), (pkind, programs) = args
    if skind != "i" or pkind != "i" or not isinstance(slots, tuple) or not isinstance(programs, tuple) or len(slots) != len(programs):
        raise RuntimeCheckError("vm_shape_func needs its slots and programs as immediates of one length")
    for slot, p in zip(slots, programs):
        compile_dim_program(p)  # checks the program
        if type(slot) is not int or slot < 0:
            raise RuntimeCheckError(f"vm_shape_func: invalid slot {slot!r}")
    body = "".join(f"    h[{slot}] = {_dim_source(p)}\n" for slot, p in zip(slots, programs)) or "    pass\n"
    return _generated("def f(h):\n" + body, "vm_shape_func"), [heap]


def _bind_make_shape(memory: Memory, args: list[Arg]) -> Bound:
    """A generated function of the heap building the shape (pairs (0, imm) / (1, slot))."""
    heap, (kind, codes) = args
    if kind != "i" or not isinstance(codes, tuple) or len(codes) % 2 or not all(type(c) is int for c in codes) or any(c not in (0, 1) for c in codes[::2]):
        return make_shape, args
    dims = [f"({codes[i + 1]})" if codes[i] == 0 else f"h[{codes[i + 1]}]" for i in range(0, len(codes), 2)]
    return _generated("def f(h):\n    return (" + "".join(d + ", " for d in dims) + ")\n", "vm_make_shape"), [heap]


PREPARE: dict[str, Callable[[list[Arg]], list[Arg]]] = {"vm_shape_func": _prepare_shape_func}


def _prepare_carve(args: list[Arg]) -> list[Arg]:
    storage, shape, offset, (kind, dtype) = args
    return [storage, shape, offset, (kind, np_dtype(dtype))]


PREPARE["vm_alloc_tensor_from_storage"] = _prepare_carve


# Builtins that act on the VM's own memory (``tilework.runtime.memory``): when a VM loads a
# call of one of these, ``BIND[name](memory, args)`` gives the callee and its arguments, so the
# call goes straight to that VM's allocator (a static arena's slot is made here, once).
Bound = tuple[Callable[..., Any], list[Arg]]


def _bind_alloc_tensor(memory: Memory, args: list[Arg]) -> Bound:
    shape, (kind, dtype) = args
    return memory.alloc_fresh, [shape, (kind, np_dtype(dtype))]


def _bind_alloc_storage(memory: Memory, args: list[Arg]) -> Bound:
    size, (_, static), (_, label) = args
    if not static:
        return memory.acquire, [size]
    kind, capacity = size
    if kind != "i":
        raise BuildError(f"static storage {label!r} needs a constant size, got a run-time value")
    return memory.static_slot(int(capacity), label).get, []


def _bind_free_storage(memory: Memory, args: list[Arg]) -> Bound:
    return memory.release, args


def _bind_carve(memory: Memory, args: list[Arg]) -> Bound:
    storage, shape, offset, (_, dtype) = args
    return CarveSite(np_dtype(dtype)), [storage, shape, offset]


BIND: dict[str, Callable[[Memory, list[Arg]], Bound]] = {
    "vm_shape_func": _bind_shape_func,
    "vm_make_shape": _bind_make_shape,
    "vm_alloc_tensor": _bind_alloc_tensor,
    "vm_alloc_storage": _bind_alloc_storage,
    "vm_free_storage": _bind_free_storage,
    "vm_alloc_tensor_from_storage": _bind_carve,
}
