"""The loop level: tensor programs over buffers with symbolic shapes.

A ``TensorFunc`` takes buffers (inputs first, then outputs: destination-passing) and sym vars
that no buffer shape supplies. Its body is made of loops, blocks and stores. A ``Block`` is a
named computation with its iteration vars (spatial or reduction), each bound to an expression
of the enclosing loop vars; it is the unit that analyses and schedules work on.

Scalar expressions (``PExpr``) compute values; integer index arithmetic is done with
``sym`` dims (an ``int`` or ``SymExpr`` is a valid int64 scalar expression), so loop indices
simplify and bound with the same machinery as shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence, Union

from tilework.ir import sym_walk
from tilework.ir.dtype import is_float_dtype, itemsize
from tilework.ir.graph import EMPTY_ATTRS, Attrs
from tilework.ir.sym import Dim, ScalarOperand, SymExpr, SymVar

# -- scalar expressions -------------------------------------------------------------------


class PExpr(ScalarOperand):
    """Base of loop-level scalar expressions; every subclass has a ``dtype``.

    Operators build expressions with dtype promotion (see ``binary``): ``+ - * / // % **``,
    unary ``-`` and ``abs``, ``< <= > >=``, ``&`` / ``|`` / ``~`` on bools. ``==`` keeps identity
    semantics (nodes are hashable by identity); use ``.eq`` / ``.ne`` to build comparisons.
    ``/`` on integers truncates toward zero (C semantics); ``//`` and ``%`` floor (Python).
    """

    __slots__ = ()
    if TYPE_CHECKING:  # a dataclass field in most subclasses, a property in a few

        @property
        def dtype(self) -> str: ...

    def __add__(self, o: Operand) -> "PExpr":
        return binary("+", self, o)

    def __radd__(self, o: Operand) -> "PExpr":
        return binary("+", o, self)

    def __sub__(self, o: Operand) -> "PExpr":
        return binary("-", self, o)

    def __rsub__(self, o: Operand) -> "PExpr":
        return binary("-", o, self)

    def __mul__(self, o: Operand) -> "PExpr":
        return binary("*", self, o)

    def __rmul__(self, o: Operand) -> "PExpr":
        return binary("*", o, self)

    def __truediv__(self, o: Operand) -> "PExpr":
        return binary("/", self, o)

    def __rtruediv__(self, o: Operand) -> "PExpr":
        return binary("/", o, self)

    def __floordiv__(self, o: Operand) -> "PExpr":
        return binary("//", self, o)

    def __rfloordiv__(self, o: Operand) -> "PExpr":
        return binary("//", o, self)

    def __mod__(self, o: Operand) -> "PExpr":
        return binary("%", self, o)

    def __rmod__(self, o: Operand) -> "PExpr":
        return binary("%", o, self)

    def __pow__(self, o: Operand) -> "PExpr":
        return binary("pow", self, o)

    def __rpow__(self, o: Operand) -> "PExpr":
        return binary("pow", o, self)

    def __neg__(self) -> "PExpr":
        return Unary("neg", self, self.dtype)

    def __abs__(self) -> "PExpr":
        return Intrin("abs", (self,), self.dtype)

    def __lt__(self, o: Operand) -> "PExpr":
        return binary("<", self, o)

    def __le__(self, o: Operand) -> "PExpr":
        return binary("<=", self, o)

    def __gt__(self, o: Operand) -> "PExpr":
        return binary(">", self, o)

    def __ge__(self, o: Operand) -> "PExpr":
        return binary(">=", self, o)

    def eq(self, o: Operand) -> "PExpr":
        return binary("==", self, o)

    def ne(self, o: Operand) -> "PExpr":
        return binary("!=", self, o)

    def __and__(self, o: Operand) -> "PExpr":
        return binary("and", self, o)

    def __rand__(self, o: Operand) -> "PExpr":
        return binary("and", o, self)

    def __or__(self, o: Operand) -> "PExpr":
        return binary("or", self, o)

    def __ror__(self, o: Operand) -> "PExpr":
        return binary("or", o, self)

    def __invert__(self) -> "PExpr":
        if self.dtype != "bool":
            raise TypeError(f"~ is logical not and needs a bool expression, got {self.dtype}")
        return Unary("not", self, "bool")

    def astype(self, dtype: str) -> "PExpr":
        return self if self.dtype == dtype else Cast(dtype, self)

    def __bool__(self) -> bool:
        raise TypeError(
            "a loop-level expression has no truth value while building; "
            "use select/if_then_else for conditions and & / | to combine them"
        )


Scalar = Union[PExpr, int, SymExpr]  # an int or SymExpr is an int64 index value
Operand = Union[Scalar, float]  # what operators and te helpers take; Python numbers are weakly typed

BINARY_OPS = ("+", "-", "*", "/", "//", "%", "min", "max", "pow")
COMPARE_OPS = ("<", "<=", "==", "!=", ">", ">=")
LOGICAL_OPS = ("and", "or")
UNARY_OPS = ("neg", "not")
INTRINSICS = (
    "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "floor", "ceil", "round",
    "sin", "cos", "atan", "asin", "acos", "log1p", "expm1", "isnan", "isinf",
    "check_nonzero",  # an integer divisor, unchanged; zero raises IntegerDivisionByZero at run time
    "check_range",  # (v, lo, hi): the integer v, unchanged; outside [lo, hi) raises IndexOutOfRange at run time
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",  # two's complement bits of integers
    "bitcast",  # the argument's bits read as the result's dtype (same size)
    "prefetch",  # of a load: 0; a hint that its element is read soon (the load is not performed)
    "prefetch_l2",  # the same, into the second-level cache only: read later, or among much else
    "dot_bf16x2",  # (acc, a0, a1, b0, b1): acc + a1 * b1 + a0 * b0, float32 acc, bfloat16 pairs (see DOT_BF16X2)
    "dot_u8i8x4",  # (acc, u0..u3, s0..s3): acc + u0 * s0 + ... + u3 * s3, int32 acc (wrapping), uint8 u, int8 s (see DOT_U8I8X4)
)  # fmt: skip
PREFETCHES = {"prefetch": 1, "prefetch_l2": 2}  # the hints (their argument is a load whose address they take) and the cache level each fills
INTRINSIC_ARITY = {"bitwise_and": 2, "bitwise_or": 2, "bitwise_xor": 2, "dot_bf16x2": 5, "dot_u8i8x4": 9, "check_range": 3}  # the others take one argument
# ``dot_bf16x2(acc, a0, a1, b0, b1)``: the float32 ``acc`` plus the dot product of two pairs of
# bfloat16 values, ``(acc + a1 * b1) + a0 * b0`` in float32 (each product of two bfloat16 values
# is exact in float32: two roundings, in that order): the operation of AVX-512 BF16's
# ``vdpbf16ps`` on one lane (whose hardware may flush subnormal inputs and results to zero). In a
# vectorized loop whose ``a0``/``a1`` are loads contiguous in the loop's var and whose ``b0``/``b1``
# do not depend on it, the C emitter makes each 16 lanes one ``vdpbf16ps`` where the compiler
# targets AVX-512 BF16 (``tilework.codegen.c.emit``); elsewhere it is that float32 arithmetic.
DOT_BF16X2 = "dot_bf16x2"
DOT_BF16X2_LANES = 16  # the float32 lanes of one vdpbf16ps: a kernel's vector of dot_bf16x2 lanes
# ``dot_u8i8x4(acc, u0, u1, u2, u3, s0, s1, s2, s3)``: the int32 ``acc`` plus the dot product of
# four uint8 values ``u`` and four int8 values ``s``, ``acc + u0 * s0 + u1 * s1 + u2 * s2 + u3 * s3``
# wrapping as int32 (each product is exact; no saturation): the operation of AVX-512 VNNI's
# ``vpdpbusd`` on one lane. In a vectorized loop whose four ``u`` (or four ``s``) are elements side
# by side of one buffer, four a step of the loop's var, and whose other four do not depend on it,
# the C emitter makes each 16 lanes one ``vpdpbusd`` where the compiler targets AVX-512 VNNI
# (``tilework.codegen.c.dot``); elsewhere it is that int32 arithmetic. A lane operand may read
# the other byte dtype's buffer through a cast (int8 and uint8 reinterpret the same byte).
DOT_U8I8X4 = "dot_u8i8x4"
DOT_U8I8X4_LANES = 16  # the int32 lanes of one vpdpbusd: a kernel's vector of dot_u8i8x4 lanes


def dtype_of(x: Scalar) -> str:
    return "int64" if isinstance(x, (int, SymExpr)) else x.dtype


def index_dims(xs: Sequence[Scalar]) -> tuple[Dim, ...] | None:
    """``xs`` as dims when every one is an index value (an ``int`` or ``SymExpr``), else None."""
    dims = tuple(x for x in xs if isinstance(x, (int, SymExpr)))
    return dims if len(dims) == len(xs) else None


@dataclass(frozen=True, slots=True, eq=False)
class Const(PExpr):
    value: Union[int, float, bool]
    dtype: str


@dataclass(frozen=True, slots=True, eq=False)
class Load(PExpr):
    buffer: "Buffer"
    indices: tuple[Scalar, ...]

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


@dataclass(frozen=True, slots=True, eq=False)
class Binary(PExpr):
    op: str
    a: Scalar
    b: Scalar
    dtype: str


@dataclass(frozen=True, slots=True, eq=False)
class Unary(PExpr):
    op: str
    a: Scalar
    dtype: str


@dataclass(frozen=True, slots=True, eq=False)
class Cast(PExpr):
    dtype: str
    value: Scalar


@dataclass(frozen=True, slots=True, eq=False)
class Select(PExpr):
    cond: Scalar
    a: Scalar
    b: Scalar
    dtype: str


@dataclass(frozen=True, slots=True, eq=False)
class Intrin(PExpr):
    name: str
    args: tuple[Scalar, ...]
    dtype: str


# -- dtype promotion and expression helpers ---------------------------------------------

def promote_dtypes(a: str, b: str) -> str:
    """The dtype two typed operands are computed in: floats beat ints beat bool, the wider
    wins, float16 with bfloat16 gives float32; an unsigned and a signed int meet in the
    narrowest signed int holding both (NumPy's rule: uint8 with int8 gives int16, uint64
    with any signed int float64)."""
    if a == b:
        return a
    fa, fb = is_float_dtype(a), is_float_dtype(b)
    if fa and fb:
        return "float64" if "float64" in (a, b) else "float32"
    if fa or fb:
        return a if fa else b
    if a == "bool" or b == "bool":
        return b if a == "bool" else a
    ua, ub = a.startswith("uint"), b.startswith("uint")
    if ua != ub:
        u, s = (a, b) if ua else (b, a)
        if itemsize(s) > itemsize(u):
            return s
        return {1: "int16", 2: "int32", 4: "int64"}.get(itemsize(u), "float64")
    return a if itemsize(a) >= itemsize(b) else b


def const(value: Union[int, float, bool], dtype: str) -> Const:
    """A constant of ``dtype``; the value is normalized to the dtype's Python kind."""
    if dtype == "bool":
        return Const(bool(value), dtype)
    if is_float_dtype(dtype):
        return Const(float(value), dtype)
    if isinstance(value, float) and not value.is_integer():
        raise TypeError(f"constant {value!r} is not an integer and cannot be {dtype}")
    return Const(int(value), dtype)


def convert(x: object, dtype: str) -> Scalar:
    """``x`` as a scalar of ``dtype``: a Python number becomes a constant, an index value
    (``int`` or ``SymExpr``) or a typed expression of another dtype is cast."""
    if isinstance(x, PExpr):
        return x if x.dtype == dtype else Cast(dtype, x)
    if isinstance(x, SymExpr):
        return x if dtype == "int64" else Cast(dtype, x)
    if isinstance(x, (bool, int, float)):
        if dtype == "int64" and isinstance(x, int) and not isinstance(x, bool):
            return x
        return const(x, dtype)
    raise TypeError(f"not a scalar expression: {type(x).__name__} {x!r}")


def _weak_dtype(x: object) -> str:
    """The dtype a weakly typed operand (a Python number or an index value) would have alone."""
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, float):
        return "float32"
    if isinstance(x, (int, SymExpr)):
        return "int64"
    raise TypeError(f"not a scalar expression: {type(x).__name__} {x!r}")


def operand_dtype(op: str, a: object, b: object) -> str:
    """Typed expressions promote among themselves; a weak operand takes the typed one's dtype,
    except that a Python float with an integer expression computes in float32 and a number
    with a bool expression in arithmetic computes in int64."""
    ta = a.dtype if isinstance(a, PExpr) else None
    tb = b.dtype if isinstance(b, PExpr) else None
    if ta is not None and tb is not None:
        return promote_dtypes(ta, tb)
    if ta is None and tb is None:
        return promote_dtypes(_weak_dtype(a), _weak_dtype(b))
    strong, weak = (ta, b) if ta is not None else (tb, a)
    assert strong is not None
    wd = _weak_dtype(weak)
    if wd == "float32" and not is_float_dtype(strong):
        return "float32"
    if strong == "bool" and wd != "bool" and op not in LOGICAL_OPS:
        return wd
    return strong


def binary(op: str, a: object, b: object) -> PExpr:
    """``a op b`` with both operands converted to their common dtype (``operand_dtype``);
    comparisons and logical ops give bool."""
    if op not in BINARY_OPS and op not in COMPARE_OPS and op not in LOGICAL_OPS:
        raise ValueError(f"unknown binary op {op!r}")
    dt = operand_dtype(op, a, b)
    if op in LOGICAL_OPS and dt != "bool":
        raise TypeError(f"'{op}' needs bool operands, got {dt}")
    if op in BINARY_OPS and dt == "bool":
        raise TypeError(f"arithmetic '{op}' on bool operands; cast them first")
    ca, cb = convert(a, dt), convert(b, dt)
    out = "bool" if op in COMPARE_OPS or op in LOGICAL_OPS else dt
    return Binary(op, ca, cb, out)


# -- buffers and statements ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Buffer:
    """A dense row-major array. Identity makes it unique, like a var."""

    name: str
    shape: tuple[Dim, ...]
    dtype: str

    def __repr__(self) -> str:
        return f"Buffer({self.name})"


class Stmt:
    __slots__ = ()


@dataclass(frozen=True, slots=True, eq=False)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[Scalar, ...]
    value: Scalar


LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled")


@dataclass(frozen=True, slots=True, eq=False)
class For(Stmt):
    """``for var in range(extent)``: ``var`` runs over ``[0, extent)``."""

    var: SymVar
    extent: Dim
    body: Stmt
    kind: str = "serial"


@dataclass(frozen=True, slots=True, eq=False)
class IterVar:
    """A block iteration var: ``var`` ranges over ``[0, extent)`` and takes ``binding``, an
    expression of the enclosing loop vars, on each execution of the block."""

    var: SymVar
    extent: Dim
    kind: str  # "spatial" | "reduce"
    binding: Dim


@dataclass(frozen=True, slots=True, eq=False)
class Block(Stmt):
    """A named computation. ``init`` runs once per spatial point before its first reduction
    step (when every reduction iter var is 0), and also when the reduction domain is empty:
    codegen moves such an init out of the reduce loops (``init_empty_reductions``)."""

    name: str
    iter_vars: tuple[IterVar, ...]
    reads: tuple[Buffer, ...]
    writes: tuple[Buffer, ...]
    body: Stmt
    init: Stmt | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Allocate(Stmt):
    """Scratch storage for ``buffer`` during ``body``."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, slots=True, eq=False)
class IfThenElse(Stmt):
    cond: Scalar
    then_body: Stmt
    else_body: Stmt | None = None


@dataclass(frozen=True, slots=True, eq=False)
class SeqStmt(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True, eq=False)
class TensorFunc:
    """A loop-level function. ``params`` are buffers and sym vars; the last ``num_outputs``
    buffers are written (destination-passing)."""

    params: tuple[Union[Buffer, SymVar], ...]
    body: Stmt
    num_outputs: int = 1
    attrs: Attrs = EMPTY_ATTRS

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return tuple(p for p in self.params if isinstance(p, Buffer))

    @property
    def inputs(self) -> tuple[Buffer, ...]:
        bufs = self.buffers
        return bufs[: len(bufs) - self.num_outputs]

    @property
    def outputs(self) -> tuple[Buffer, ...]:
        bufs = self.buffers
        return bufs[len(bufs) - self.num_outputs :]

    @property
    def sym_params(self) -> tuple[SymVar, ...]:
        return tuple(p for p in self.params if isinstance(p, SymVar))

    def replace(self, **changes: Any) -> "TensorFunc":
        return replace(self, **changes)


def walk_stmts(s: Stmt) -> Iterator[Stmt]:
    """Every statement of ``s`` in pre-order."""
    yield s
    if isinstance(s, SeqStmt):
        for x in s.stmts:
            yield from walk_stmts(x)
    elif isinstance(s, (For, Allocate)):
        yield from walk_stmts(s.body)
    elif isinstance(s, Block):
        if s.init is not None:
            yield from walk_stmts(s.init)
        yield from walk_stmts(s.body)
    elif isinstance(s, IfThenElse):
        yield from walk_stmts(s.then_body)
        if s.else_body is not None:
            yield from walk_stmts(s.else_body)


def walk_scalars(x: Scalar) -> Iterator[Scalar]:
    """Every scalar sub-expression of ``x`` in pre-order (an explicit stack: nested generators
    cost a frame per level for every value, and this walk runs over every index of every load
    while schedules are made)."""
    stack = [x]
    pop, push = stack.pop, stack.extend
    while stack:
        e = pop()
        yield e
        if isinstance(e, Load):
            push(reversed(e.indices))
        elif isinstance(e, Binary):
            push((e.b, e.a))
        elif isinstance(e, Unary):
            stack.append(e.a)
        elif isinstance(e, Cast):
            stack.append(e.value)
        elif isinstance(e, Select):
            push((e.b, e.a, e.cond))
        elif isinstance(e, Intrin):
            push(reversed(e.args))


def stmt_scalars(s: Stmt) -> Iterator[Scalar]:
    """The top-level scalar expressions that statement ``s`` itself holds (not nested stmts)."""
    if isinstance(s, Store):
        yield from s.indices
        yield s.value
    elif isinstance(s, IfThenElse):
        yield s.cond


def map_scalars(x: Scalar, f: Callable[[PExpr], Scalar | None]) -> Scalar:
    """Rebuild ``x`` bottom-up; ``f`` may replace any sub-expression (``None`` keeps it)."""
    if isinstance(x, (int, SymExpr)):
        return x
    new: Scalar
    if isinstance(x, Load):
        new = Load(x.buffer, tuple(map_scalars(i, f) for i in x.indices))
    elif isinstance(x, Binary):
        new = Binary(x.op, map_scalars(x.a, f), map_scalars(x.b, f), x.dtype)
    elif isinstance(x, Unary):
        new = Unary(x.op, map_scalars(x.a, f), x.dtype)
    elif isinstance(x, Cast):
        new = Cast(x.dtype, map_scalars(x.value, f))
    elif isinstance(x, Select):
        new = Select(map_scalars(x.cond, f), map_scalars(x.a, f), map_scalars(x.b, f), x.dtype)
    elif isinstance(x, Intrin):
        new = Intrin(x.name, tuple(map_scalars(a, f) for a in x.args), x.dtype)
    else:
        new = x
    assert isinstance(new, PExpr)
    r = f(new)
    return new if r is None else r


def kernel_syms(func: TensorFunc) -> tuple[SymVar, ...]:
    """The sym vars whose values a compiled kernel receives, in ABI order: those that appear in
    the buffer shapes (buffers in param order, dims in order, first occurrence), then the sym
    params not already listed."""
    out: dict[SymVar, None] = {}
    for b in func.buffers:
        for d in b.shape:
            for v in sym_walk.free_vars(d):
                out.setdefault(v, None)
    for v in func.sym_params:
        out.setdefault(v, None)
    return tuple(out)


def free_sym_vars(body: Stmt, buffers: Iterable[Buffer] = ()) -> tuple[SymVar, ...]:
    """The sym vars that ``buffers``' shapes and ``body`` use and ``body`` does not bind itself
    (loop vars and block iter vars are bound), in order of first use: buffer shapes, then loop
    extents, iter var extents and bindings, allocation shapes and scalar expressions. The one
    walker for "which sym vars does this loop program need from outside"."""
    bound: set[SymVar] = set()
    used: dict[SymVar, None] = {}

    def use(d: object) -> None:
        if isinstance(d, SymExpr):
            used.update(dict.fromkeys(sym_walk.free_vars(d)))

    for b in buffers:
        for d in b.shape:
            use(d)
    for st in walk_stmts(body):
        if isinstance(st, For):
            bound.add(st.var)
            use(st.extent)
        elif isinstance(st, Block):
            for iv in st.iter_vars:
                bound.add(iv.var)
                use(iv.extent)
                use(iv.binding)
        elif isinstance(st, Allocate):
            for d in st.buffer.shape:
                use(d)
        for x in stmt_scalars(st):
            for e in walk_scalars(x):
                use(e)
    return tuple(v for v in used if v not in bound)
