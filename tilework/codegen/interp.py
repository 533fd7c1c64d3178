"""The reference interpreter: runs a TensorFunc on NumPy arrays, serially.

It is the oracle for the C code and for schedules, so it follows the loop-level semantics
literally and independently of ``tilework.codegen.c``:

- every loop kind runs as a serial loop; a block binds its iter vars from their bindings and
  runs ``init`` whenever all its reduction iter vars are 0, then its body (an init whose
  reduction may be empty was first moved out of the reduce loops, ``LoopEmitter``);
- ``Allocate`` makes a fresh array (floats filled with NaN, integers with a marker value, so a
  read before a write shows); ``IfThenElse`` and ``Select`` evaluate only the chosen side;
- values are NumPy scalars of their dtype, so float32 arithmetic happens in float32 and
  narrow integers wrap; float16 and bfloat16 values compute in float32 and are rounded to
  their dtype (to nearest even) when stored or cast, as the C code does;
- index values (ints and SymExprs) are Python ints: ``//`` and ``%`` floor; integer ``/``
  truncates toward zero; float ``//`` and ``%`` follow NumPy; ``min``/``max`` of floats
  propagate NaN; a negative index is an error (NumPy would wrap it).

The program is translated once into a Python function (cached per TensorFunc) and run.
"""

from __future__ import annotations

import keyword
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tilework.ir.kernel_abi import SymValues, bind_syms, check_arrays, kernel_syms
from tilework.codegen.loop_emit import EMPTY_REDUCTION, LoopEmitter, comment, const_value
from tilework.codegen.target import Target, register_target
from tilework.errors import IndexOutOfRange, IntegerDivisionByZero, RuntimeCheckError, WellFormedError
from tilework.ir import sym
from tilework.ir import lowp
from tilework.ir.dtype import DTYPE_TABLE, SUBBYTE_INT_DTYPES, compute_dtype, is_float_dtype, is_lowp_dtype, np_dtype
from tilework.ir.loop import (
    Allocate,
    Binary,
    Block,
    Buffer,
    Cast,
    Const,
    For,
    IfThenElse,
    Intrin,
    Load,
    PREFETCHES,
    DOT_BF16X2,
    DOT_U8I8X4,
    Scalar,
    Select,
    SeqStmt,
    Store,
    TensorFunc,
    Unary,
    dtype_of,
)
from tilework.ir.sym import FloorDiv, FloorMod, Max, Min, Poly, SymExpr
from tilework.runtime.kernels import KernelCall, KernelInfo, KernelModule
from tilework.transform.fold_constant import register_kernel_evaluator

_F32 = np.float32
_RESERVED = frozenset({"range", "min", "max", "abs", "int", "np"})


def run(func: TensorFunc, args: Sequence[np.ndarray], sym_values: SymValues = None) -> None:
    """Execute ``func`` on ``args`` (inputs, then outputs, written in place).

    ``sym_values`` gives sym var values the shapes cannot supply (the sym params), as a
    mapping by var or name, or a sequence in ``func.sym_params`` order; the rest are derived
    from the arrays' shapes and checked (``tilework.ir.kernel_abi.bind_syms``).
    """
    check_arrays(func, args, "interp", contiguous=False)
    syms = bind_syms(func, args, sym_values, "interp")
    fn = _compiled(func)
    with np.errstate(all="ignore"):
        fn(list(args), syms)


_CACHE: dict[TensorFunc, Callable[[list[np.ndarray], list[int]], None]] = {}


def _compiled(func: TensorFunc) -> Callable[[list[np.ndarray], list[int]], None]:
    fn = _CACHE.get(func)
    if fn is None:
        if len(_CACHE) > 256:
            _CACHE.clear()
        fn = _Translator(func).build()
        _CACHE[func] = fn
    return fn


def source(func: TensorFunc) -> str:
    """The Python text the interpreter runs for ``func`` (for debugging)."""
    t = _Translator(func)
    t.translate()
    return "\n".join(t.lines)


# -- helpers the generated code calls ---------------------------------------------------------


def _icast(x: Any, t: type) -> Any:
    return (np.int64(x) if isinstance(x, int) else x).astype(t)


def _iwrap(v: int, t: type) -> Any:
    """``v`` wrapped to the integer type ``t`` (two's complement)."""
    info = np.iinfo(t)
    span = int(info.max) - int(info.min) + 1
    return t((v - int(info.min)) % span + int(info.min))


# Integer division as the C target computes it (docs/semantics.md): a zero divisor gives 0,
# INT_MIN / -1 wraps; no warning, no trap.
def _tdiv(a: Any, b: Any, t: type) -> Any:
    a, b = int(a), int(b)
    if b == 0:
        return t(0)
    q = abs(a) // abs(b)
    return _iwrap(-q if (a < 0) != (b < 0) else q, t)


def _fdiv(a: Any, b: Any, t: type) -> Any:
    b = int(b)
    return t(0) if b == 0 else _iwrap(int(a) // b, t)


def _fmod(a: Any, b: Any, t: type) -> Any:
    b = int(b)
    return t(0) if b == 0 else _iwrap(int(a) % b, t)


def _check_nonzero(b: Any) -> Any:
    if b == 0:
        raise IntegerDivisionByZero("integer division by zero (the source framework raises here, e.g. torch's ZeroDivisionError)")
    return b


def _check_range(v: Any, lo: Any, hi: Any) -> Any:
    if not int(lo) <= int(v) < int(hi):
        raise IndexOutOfRange(f"index {int(v)} is out of range [{int(lo)}, {int(hi)}) (the source framework raises here, e.g. torch's IndexError)")
    return v


def _ipow(a: Any, b: Any, t: type) -> Any:
    return _icast(int(np.float64(a) ** np.float64(b)), t)


def _nonneg(i: Any, extent: int) -> Any:
    if i < 0 or i >= extent:
        raise IndexError(f"index {i} is out of range [0, {extent})")
    return i


def _erf(x: Any) -> Any:
    return type(x)(math.erf(float(x)))


def _bf16(x: Any) -> Any:
    return _F32(_F32(x).astype(np_dtype("bfloat16")))


def _f16_from_f32(x: Any) -> Any:
    return _F32(np.float16(x))


def _f16_from_f64(x: Any) -> Any:
    return _F32(np.float16(np.float64(x)))


def _bitop(op: str, t: type, *xs: Any) -> Any:
    """A bitwise intrinsic on integers of type ``t`` (index values are Python ints)."""
    vs = [t(x) if isinstance(x, int) else x for x in xs]
    if op == "bitwise_not":
        return np.invert(vs[0])
    fn = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor}[op]
    return t(fn(vs[0], vs[1]))


def _bitcast(x: Any, src: str, dst: str) -> Any:
    """The bytes of ``x`` (a value of dtype ``src``) read as ``dst``, as the C target does:
    float16/bfloat16 values compute in float32, and a byte read as bool is true when nonzero."""
    bits = np.asarray(x).astype(np_dtype(src)).view(np.dtype(f"u{np.dtype(np_dtype(src)).itemsize}"))
    if dst == "bool":
        return np.bool_(bits != 0)
    out = bits.view(np_dtype(dst))[()]
    if dst in SUBBYTE_INT_DTYPES:
        return _lowp(out, dst)
    return _F32(out) if compute_dtype(dst) != dst else out


def _dot_bf16x2(acc: Any, a0: Any, a1: Any, b0: Any, b1: Any) -> Any:
    """``tilework.ir.loop.DOT_BF16X2``: two float32 roundings, the odd pair's product first."""
    return _F32(_F32(_F32(acc) + _F32(a1) * _F32(b1)) + _F32(a0) * _F32(b0))


def _dot_u8i8x4(acc: Any, *bytes_: Any) -> Any:
    """``tilework.ir.loop.DOT_U8I8X4``: the exact sum of the four products, added to ``acc``
    wrapping as int32."""
    us, ss = bytes_[:4], bytes_[4:]
    return _iwrap(int(acc) + sum(int(u) * int(s) for u, s in zip(us, ss)), np.int32)


def _lowp(x: Any, dst: str) -> Any:
    """``x`` converted to low-precision ``dst`` (``tilework.ir.lowp``): a float32 for the
    float formats, an int8/uint8 for the sub-byte integers (their values in computation)."""
    if is_float_dtype(dst):
        return _F32(lowp.round_scalar(float(x), dst))
    return (np.int8 if DTYPE_TABLE[dst].kind == "int" else np.uint8)(lowp.int_scalar(x, dst))


def _fill(dtype: str) -> Any:
    if is_float_dtype(dtype):
        return np.nan
    return True if dtype == "bool" else 77


_HELPERS: dict[str, Any] = {
    "np": np,
    "_RuntimeCheckError": RuntimeCheckError,
    "_icast": _icast,
    "_lowp": _lowp,
    "_tdiv": _tdiv,
    "_fdiv": _fdiv,
    "_fmod": _fmod,
    "_check_nonzero": _check_nonzero,
    "_check_range": _check_range,
    "_ipow": _ipow,
    "_bitop": _bitop,
    "_bitcast": _bitcast,
    "_dot_bf16x2": _dot_bf16x2,
    "_dot_u8i8x4": _dot_u8i8x4,
    "_nonneg": _nonneg,
    "_erf": _erf,
    "_bf16": _bf16,
    "_f16_from_f32": _f16_from_f32,
    "_f16_from_f64": _f16_from_f64,
    "_F32": _F32,
}
_NP_FN = {
    "exp": "np.exp", "log": "np.log", "sqrt": "np.sqrt", "tanh": "np.tanh", "sin": "np.sin",
    "cos": "np.cos", "atan": "np.arctan", "asin": "np.arcsin", "acos": "np.arccos",
    "log1p": "np.log1p", "expm1": "np.expm1", "abs": "np.abs",
    "floor": "np.floor", "ceil": "np.ceil", "round": "np.rint", "erf": "_erf",
}  # fmt: skip


class _Translator(LoopEmitter):
    def __init__(self, func: TensorFunc) -> None:
        super().__init__(func, "interp")
        self.taken.update(_RESERVED)
        self.env: dict[str, Any] = dict(_HELPERS)

    def legal_name(self, base: str) -> str:
        if base[0].isdigit() or base.startswith("_") or keyword.iskeyword(base):
            return "v_" + base
        return base

    def value(self, v: Any, hint: str = "c") -> str:
        name = f"_{hint}{len(self.env)}"
        self.env[name] = v
        return name

    def error(self, msg: str) -> WellFormedError:
        return WellFormedError(f"interp: {msg}")

    def translate(self) -> None:
        self.lines = ["def _kernel(_bufs, _syms):"]
        for i, b in enumerate(self.func.buffers):
            self.line(f"{self.bind(b, b.name)} = _bufs[{i}]")
        for j, v in enumerate(kernel_syms(self.func)):
            self.line(f"{self.bind(v, v.name)} = _syms[{j}]")
            self.scope.add(v)
        for block, ext in self.empty_reduction_checks():
            self.line(f"if {self.dim(ext)} < 1:")
            self.line(f"    raise _RuntimeCheckError({self.value(f'block {block}: {EMPTY_REDUCTION}', 's')})")
        self.stmt(self.func.body)
        self.line("return None")

    def build(self) -> Callable[[list[np.ndarray], list[int]], None]:
        self.translate()
        code = compile("\n".join(self.lines) + "\n", "<tilework-interp>", "exec")
        exec(code, self.env)
        return self.env["_kernel"]

    # -- statements -------------------------------------------------------------------------

    def emit_seq(self, s: SeqStmt) -> None:
        super().emit_seq(s)
        if not s.stmts:
            self.line("pass")

    def emit_store(self, s: Store) -> None:
        target = self.known(s.buffer, f"buffer {s.buffer.name}")
        self.line(f"{target}[{self.indices(s.buffer, s.indices)}] = {self.expr(s.value)}")

    def emit_for(self, s: For) -> None:
        ext = self.dim(s.extent)
        v = self.bind(s.var, s.var.name)
        self.line(f"for {v} in range({ext}):  # {comment(s.kind)}")
        self.scope.add(s.var)
        self.nested(s.body)
        self.scope.discard(s.var)

    def emit_if(self, s: IfThenElse) -> None:
        self.line(f"if {self.expr(s.cond)}:")
        self.nested(s.then_body)
        if s.else_body is not None:
            self.line("else:")
            self.nested(s.else_body)

    def emit_allocate(self, s: Allocate) -> None:
        b = s.buffer
        shape = ", ".join(self.dim(d) for d in b.shape)
        dt = self.value(np_dtype(b.dtype), "t")
        self.line(f"{self.bind(b, b.name)} = np.full(({shape}{',' if len(b.shape) == 1 else ''}), {self.value(_fill(b.dtype), 'f')}, {dt})")
        self.stmt(s.body)

    def emit_block(self, b: Block) -> None:
        self.line(f"# block {comment(b.name)}")
        for iv in b.iter_vars:
            value = self.dim(iv.binding)
            self.line(f"{self.bind(iv.var, iv.var.name)} = {value}")
        for iv in b.iter_vars:
            self.scope.add(iv.var)
        if b.init is not None:
            reds = [self.names[iv.var] for iv in b.iter_vars if iv.kind == "reduce"]
            self.line(f"if {' and '.join(f'{r} == 0' for r in reds) or 'True'}:")
            self.nested(b.init)
        self.stmt(b.body)
        for iv in b.iter_vars:
            self.scope.discard(iv.var)

    def indices(self, b: Buffer, idx: tuple[Scalar, ...]) -> str:
        if len(idx) != len(b.shape):
            raise self.error(f"buffer {b.name} of rank {len(b.shape)} accessed with {len(idx)} indices")
        if not idx:
            return "()"
        parts = []
        for i, ext in zip(idx, b.shape):
            text = self.dim(i) if isinstance(i, (int, SymExpr)) else f"int({self.expr(i)})"
            if not (isinstance(i, (int, SymExpr)) and sym.prove_ge(i, 0)):
                text = f"_nonneg({text}, {self.dim(ext)})"
            parts.append(text)
        return ", ".join(parts)

    # -- expressions ------------------------------------------------------------------------

    def render_int(self, v: int) -> str:
        return f"({v})"

    def render_divmod(self, d: FloorDiv | FloorMod) -> str:
        return f"({self.dim(d.a)} {'//' if isinstance(d, FloorDiv) else '%'} {self.dim(d.b)})"

    def render_minmax(self, d: Min | Max) -> str:
        return f"{'min' if isinstance(d, Min) else 'max'}({self.dim(d.a)}, {self.dim(d.b)})"

    def render_poly(self, d: Poly) -> str:
        terms = [f"({c} * {' * '.join(self.dim(a) for a in m)})" for m, c in d.terms]
        return "(" + " + ".join([*terms, str(d.const)]) + ")"

    def render_const(self, x: Const) -> str:
        v = const_value(x)
        t = np_dtype(compute_dtype(x.dtype)).type
        return self.value(t(v))

    def render_load(self, x: Load) -> str:
        text = f"{self.known(x.buffer, f'buffer {x.buffer.name}')}[{self.indices(x.buffer, x.indices)}]"
        if x.buffer.dtype in SUBBYTE_INT_DTYPES:
            return f"_lowp({text}, {x.buffer.dtype!r})"
        return f"_F32({text})" if compute_dtype(x.buffer.dtype) != x.buffer.dtype else text

    def render_unary(self, x: Unary) -> str:
        return f"(not {self.expr(x.a)})" if x.op == "not" else f"(-{self.expr(x.a)})"

    def render_select(self, x: Select) -> str:
        return f"({self.expr(x.a)} if {self.expr(x.cond)} else {self.expr(x.b)})"

    def render_cast(self, x: Cast) -> str:
        src, dst = dtype_of(x.value), x.dtype
        a = self.expr(x.value)
        if src == dst:
            return a
        if is_lowp_dtype(dst):
            return f"_lowp({a}, {dst!r})"
        if dst == "float16":
            return f"_f16_from_f32({a})" if compute_dtype(src) == "float32" else f"_f16_from_f64({a})"
        if dst == "bfloat16":
            return f"_bf16({a})"
        if dst == "bool":
            return f"np.bool_({a} != 0)"
        if is_float_dtype(dst):
            return f"{self.value(np_dtype(dst).type, 't')}({a})"
        return f"_icast({a}, {self.value(np_dtype(dst).type, 't')})"

    def render_binary(self, x: Binary) -> str:
        a, b, op = self.expr(x.a), self.expr(x.b), x.op
        dt = dtype_of(x.a)
        fl = is_float_dtype(dt)
        if op in ("<", "<=", ">", ">=", "==", "!="):
            return f"({a} {op} {b})"
        if op in ("and", "or"):
            return f"({a} {op} {b})"
        if op in ("//", "%") and not fl:
            return f"_{'fdiv' if op == '//' else 'fmod'}({a}, {b}, {self.value(np_dtype(dt).type, 't')})"
        if op in ("+", "-", "*", "//", "%"):
            return f"({a} {op} {b})"
        if op == "/":
            return f"({a} / {b})" if fl else f"_tdiv({a}, {b}, {self.value(np_dtype(dt).type, 't')})"
        if op in ("min", "max"):
            return f"np.{op}imum({a}, {b})" if fl else f"{op}({a}, {b})"
        if op == "pow":
            return f"({a} ** {b})" if fl else f"_ipow({a}, {b}, {self.value(np_dtype(dt).type, 't')})"
        raise self.error(f"unknown binary op {op!r}")

    def render_intrin(self, x: Intrin) -> str:
        if x.name == "bitcast":
            return f"_bitcast({self.expr(x.args[0])}, {dtype_of(x.args[0])!r}, {x.dtype!r})"
        if x.name.startswith("bitwise_"):
            args = ", ".join(self.expr(a) for a in x.args)
            return f"_bitop({x.name!r}, {self.value(np_dtype(x.dtype).type, 't')}, {args})"
        if x.name in PREFETCHES:  # a hint for compiled code; its load is not performed
            return self.value(np_dtype(x.dtype).type(0))
        if x.name in (DOT_BF16X2, DOT_U8I8X4):
            return f"_{x.name}({', '.join(self.expr(a) for a in x.args)})"
        if x.name == "check_range":
            return f"_check_range({', '.join(self.expr(a) for a in x.args)})"
        arg = x.args[0]
        a = self.expr(arg)
        dt = dtype_of(arg)
        if x.name in ("isnan", "isinf"):
            return f"np.{x.name}({a})" if is_float_dtype(dt) else "False"
        if x.name == "check_nonzero":
            return f"_check_nonzero({a})"
        if not is_float_dtype(dt):
            if x.name == "abs":
                return f"_icast(abs(int({a})), {self.value(np_dtype(dt).type, 't')})"
            if x.name in ("floor", "ceil", "round"):
                return a
            raise self.error(f"intrinsic {x.name} needs a float argument, got {dt}")
        one = self.value((np.float64 if dt == "float64" else _F32)(1.0))
        if x.name == "rsqrt":
            return f"({one} / np.sqrt({a}))"
        if x.name == "sigmoid":
            return f"({one} / ({one} + np.exp(-{a})))"
        if x.name not in _NP_FN:
            raise self.error(f"unknown intrinsic {x.name!r}")
        return f"{_NP_FN[x.name]}({a})"


# -- the interpreter as a target ----------------------------------------------------------------


class InterpKernelModule(KernelModule):
    """Kernels run by the interpreter. There is no native code: ``to_bytes`` is empty and a
    module always comes back from its loop IR."""

    target = "interp"

    def __init__(self, funcs: Mapping[str, TensorFunc]) -> None:
        self.funcs = dict(funcs)
        self._functions = {name: KernelInfo.of(name, name, f) for name, f in self.funcs.items()}

    @property
    def functions(self) -> Mapping[str, KernelInfo]:
        return self._functions

    def __getitem__(self, name: str) -> KernelCall:
        func = self.funcs.get(name)
        if func is None:
            raise KeyError(f"no kernel {name!r} in the module (has: {', '.join(self.funcs) or 'none'})")
        fn = _compiled(func)

        def call(arrays: Sequence[np.ndarray], sym_values: Sequence[int]) -> None:
            with np.errstate(all="ignore"):
                fn(list(arrays), list(sym_values))

        return call

    def source(self) -> str:
        return "\n\n".join(source(f) for f in self.funcs.values())

    def to_bytes(self) -> bytes:
        return b""


class InterpTarget(Target):
    """The reference interpreter: every kernel runs serially on NumPy scalars. Slow; for
    checking, and for machines without a C compiler."""

    name = "interp"
    description = "the NumPy reference interpreter (serial, slow; no compiler needed)"

    @property
    def schedule_rules(self) -> Sequence[Any]:
        return ()  # parallel and vector loops run serially here: only the fallback rule

    def build(self, funcs: Mapping[str, TensorFunc]) -> InterpKernelModule:
        return InterpKernelModule(funcs)

    def load_native(self, data: bytes, functions: Mapping[str, KernelInfo], funcs: Mapping[str, TensorFunc]) -> InterpKernelModule:
        return InterpKernelModule(funcs)


INTERP = register_target(InterpTarget())
register_kernel_evaluator(run)  # fold_constant folds kernels with the oracle
