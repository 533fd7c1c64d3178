"""VM bytecode as C: each graph function of an executable becomes one straight-line C function.

The translation follows the VM instruction by instruction (``tilework.runtime.bytecode``):
registers are ``tw_val`` slots on the model's register stack, ``goto``/``if`` become C
``goto``s to labels (bytecode jumps only forward), kernel calls call the kernels' C symbols
directly with their data pointers and sym values, ``func`` calls call the other translated
function, and every builtin becomes the C helper of the same name in ``c/tw_runtime.c`` (same
checks, same messages) or, where its operands are static, inline C: the shape heap is a local
array per call, ``make_shape``/``load_dim``/``shape_func``/``check_dims`` read and write its slots
directly, static storage is an offset into the model's static pool. Library calls go through
``tilework.export.externs`` (a symbol without a C implementation is an ``ExportError`` naming
it and its backend).

Immediates that are values (a shape passed to an extern, a constant int) become file-scope
``static const tw_val`` initializers, so a call costs nothing to set them up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tilework.errors import BuildError
from tilework.export.externs import ExportError, extern_call, exports, refusal
from tilework.ir.dtype import DTYPE_TABLE
from tilework.runtime.bytecode import VMFunction
from tilework.runtime.kernels import KernelInfo

DTYPES = list(DTYPE_TABLE)
STORE, ASSERT_IMM, ASSERT_SLOT, SKIP = 0, 1, 2, 3


def dtype_index(name: Any) -> int:
    if name is None:
        return -1
    if name not in DTYPE_TABLE:
        raise ExportError(f"dtype {name!r} cannot be exported (known: {', '.join(DTYPES)})")
    return DTYPES.index(name)


def dl_type(name: str) -> tuple[int, int]:
    """DLPack's (type code, bits) of a dtype (``tw_model.h``)."""
    d = DTYPE_TABLE[name]
    if name in _DL_LOWP:
        return _DL_LOWP[name]
    return {"bool": 6, "int": 0, "uint": 1}.get(d.kind, 4 if name == "bfloat16" else 2), 8 * d.itemsize


# DLPack's codes of the float8 types; float4 and the sub-byte integers, stored one element per
# byte (DLPack's 4- and 2-bit types are packed), take tilework's own codes from 128 up.
_DL_LOWP = {
    "float8_e4m3fn": (10, 8), "float8_e4m3fnuz": (11, 8), "float8_e5m2": (12, 8), "float8_e5m2fnuz": (13, 8),
    "float8_e8m0fnu": (14, 8), "float4_e2m1fn": (128, 8), "int4": (129, 8), "uint4": (130, 8), "int2": (131, 8),
    "uint2": (132, 8),
}  # fmt: skip


def c_string(s: str) -> str:
    """A C string literal holding the UTF-8 bytes of ``s``."""
    out = ['"']
    for b in s.encode("utf-8"):
        ch = chr(b)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= b < 127 and ch != "?":
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")
    out.append('"')
    return "".join(out)


def c_int(v: int) -> str:
    if not -(1 << 63) <= v < (1 << 63):
        raise ExportError(f"the integer {v} does not fit in int64")
    return f"INT64_C({v})" if -(1 << 31) <= v < (1 << 31) else f"(INT64_C({v + 1}) - 1)" if v == -(1 << 63) else f"INT64_C({v})"


def c_double(v: float) -> str:
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    return v.hex()


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to about ``limit`` characters (an immediate may be a serialized model)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


@dataclass
class ModuleText:
    """File-scope declarations shared by the translated functions."""

    decls: list[str] = field(default_factory=list)
    _consts: dict[Any, str] = field(default_factory=dict)

    def static_val(self, value: Any) -> str:
        """A ``static const tw_val`` holding the immediate ``value``; returns its name."""
        key = (type(value).__name__, repr(value))
        name = self._consts.get(key)
        if name is not None:
            return name
        name = f"tw_imm{len(self._consts)}"
        self._consts[key] = name
        if value is None:
            init = "{.kind = TW_NONE}"
        elif isinstance(value, bool) or isinstance(value, int):
            init = f"{{.kind = TW_INT, .i = {c_int(int(value))}}}"
        elif isinstance(value, float):
            init = f"{{.kind = TW_FLOAT, .f = {c_double(value)}}}"
        elif isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            if len(value) > 16:
                raise ExportError(f"a shape value of {len(value)} dims (the export holds at most 16)")
            dims = ", ".join(c_int(v) for v in value) or "0"
            init = f"{{.kind = TW_SHAPE, .ndim = {len(value)}, .shape = {{{dims}}}}}"
        else:
            raise ExportError(f"the immediate {_short(value)} cannot be a value in the exported C")
        self.decls.append(f"static const tw_val {name} = {init};")
        return name


@dataclass
class FunctionC:
    """The C of one VM function."""

    fn: VMFunction
    index: int
    module: ModuleText
    kernels: Mapping[str, tuple[KernelInfo, str]]  # name -> (table entry, C symbol)
    func_symbols: Mapping[str, str]
    num_constants: int
    static_offset: Callable[[int], int]  # capacity -> offset in the static pool
    linkage: str = "static"  # of the function's C definition ("TW_PRIVATE" where model.c is split in units)
    body: list[str] = field(default_factory=list)
    heaps: dict[int, tuple[str, int]] = field(default_factory=dict)  # register -> (heap var, size)
    heap_decls: list[str] = field(default_factory=list)
    temps: int = 0

    # -- operands ---------------------------------------------------------------------------

    def where(self, pc: int) -> str:
        return f"{self.fn.name}, instruction {pc}"

    def val(self, arg: tuple[str, Any]) -> str:
        """A ``const tw_val*`` expression for the argument."""
        tag, v = arg
        if tag == "r":
            return f"&r[{v}]"
        if tag == "c":
            return f"twrt_array(m, {v})"
        return f"&{self.module.static_val(v)}"

    def integer(self, arg: tuple[str, Any]) -> str:
        tag, v = arg
        if tag == "i":
            if not isinstance(v, int):
                raise ExportError(f"{self.fn.name}: expected an integer immediate, got {v!r}")
            return c_int(v)
        return f"twrt_i({self.val(arg)})"

    def imm(self, arg: tuple[str, Any], what: str) -> Any:
        tag, v = arg
        if tag != "i":
            raise ExportError(f"{self.fn.name}: {what} must be an immediate in exported code")
        return v

    def heap(self, arg: tuple[str, Any]) -> str:
        tag, v = arg
        if tag != "r" or v not in self.heaps:
            raise ExportError(f"{self.fn.name}: a shape heap that is not this function's own cannot be exported")
        return self.heaps[v][0]

    def data(self, arg: tuple[str, Any], what: str) -> str:
        tag, v = arg
        if tag == "i":
            raise ExportError(f"{self.fn.name}: {what} is an immediate, not a tensor")
        return f"({self.val(arg)})->data"

    def emit(self, line: str) -> None:
        self.body.append("    " + line)

    # -- instructions -----------------------------------------------------------------------

    def translate(self) -> str:
        targets = {ins[1] for ins in self.fn.code if ins[0] == "goto"} | {ins[2] for ins in self.fn.code if ins[0] == "if"}
        for pc, ins in enumerate(self.fn.code):
            if pc in targets:
                self.body.append(f"L{pc}:;")
            op = ins[0]
            if op == "ret":
                self.emit(f"*ret = r[{ins[1]}];")
                self.emit(f"twrt_pop_regs(m, {self.fn.num_regs});")
                self.emit("return 0;")
            elif op == "goto":
                self.emit(f"goto L{ins[1]};")
            elif op == "if":
                self.emit(f"if (!r[{ins[1]}].i) goto L{ins[2]};")
            else:
                _, dst, (kind, name), args = ins
                if kind == "builtin":
                    self.builtin(pc, dst, name, list(args))
                elif kind == "kernel":
                    self.kernel(dst, name, list(args))
                elif kind == "func":
                    self.call_func(dst, name, list(args))
                else:
                    self.extern(dst, name, list(args))
        sym = self.func_symbols[self.fn.name]
        head = [
            f"/* {self.fn.name}({', '.join(self.fn.params)}) */",
            f"{self.linkage} int {sym}(tw_model* m, const tw_val* args, tw_val* ret) {{",
            f"    tw_val* r = twrt_push_regs(m, {self.fn.num_regs});",
            *("    " + d for d in self.heap_decls),
        ]
        if self.fn.params:
            head.append(f"    for (int i = 0; i < {len(self.fn.params)}; ++i) r[i] = args[i];")
        return "\n".join([*head, *self.body, "}"])

    def kernel(self, dst: int, name: str, args: list[tuple[str, Any]]) -> None:
        entry = self.kernels.get(name)
        if entry is None:
            raise ExportError(f"{self.fn.name} calls kernel {name!r}, which the executable does not hold")
        info, symbol = entry
        if len(args) != len(info.buffers) + 1:
            raise ExportError(f"{self.fn.name}: kernel {name} takes {len(info.buffers)} buffers and its sym values, the call passes {len(args)} arguments")
        ptrs = ", ".join(self.data(a, f"an argument of kernel {name}") for a in args[:-1]) or "NULL"
        syms = f"({self.val(args[-1])})->shape"
        self.emit(f"{{ void* const d_[] = {{{ptrs}}}; int32_t rc_ = {symbol}(d_, {syms}); if (rc_) return twrt_kernel_fail(m, {c_string(name)}, rc_); }}")

    def call_func(self, dst: int, name: str, args: list[tuple[str, Any]]) -> None:
        sym = self.func_symbols.get(name)
        if sym is None:
            raise ExportError(f"{self.fn.name} calls function {name!r}, which the executable does not hold")
        vals = ", ".join(f"*{self.val(a)}" for a in args) or "{0}"
        self.emit(f"{{ const tw_val a_[] = {{{vals}}}; TW_TRY({sym}(m, a_, &r[{dst}])); }}")

    def extern(self, dst: int, name: str, args: list[tuple[str, Any]]) -> None:
        if not exports(name):
            raise refusal(name, self.fn.name, [v if tag == "i" else None for tag, v in args])
        vals = [self.val(a) for a in args]
        for line in extern_call(name, vals, self.fn.name):
            self.emit(line)

    def builtin(self, pc: int, dst: int, name: str, args: list[tuple[str, Any]]) -> None:
        handler = _BUILTINS.get(name)
        if handler is None:
            raise ExportError(f"{self.fn.name} calls VM builtin {name!r}, which the C export does not implement")
        handler(self, pc, dst, args)


# -- builtins ---------------------------------------------------------------------------------


def _alloc_shape_heap(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    size = int(f.imm(args[0], "the heap size"))
    names = tuple(f.imm(args[1], "the heap names"))
    bounds = tuple(f.imm(args[2], "the heap bounds"))
    h = f"H{f.index}_{pc}"
    n = max(size, 1)
    decl = f.module.decls
    decl.append(f"static const char* const {h}_names[] = {{{', '.join(c_string(str(x)) for x in names) or 'NULL'}}};")
    decl.append(f"static const int64_t {h}_lo[] = {{{', '.join(c_int(int(lo)) for lo, _ in bounds) or '0'}}};")
    decl.append(f"static const int64_t {h}_hi[] = {{{', '.join(c_int(int(hi)) if hi is not None else '0' for _, hi in bounds) or '0'}}};")
    decl.append(f"static const uint8_t {h}_has_hi[] = {{{', '.join('1' if hi is not None else '0' for _, hi in bounds) or '0'}}};")
    f.heap_decls.append(f"int64_t {h}_v[{n}]; const char* {h}_olab[{n}]; int32_t {h}_odim[{n}];")
    f.heap_decls.append(f"tw_heap {h} = {{{h}_v, {h}_names, {h}_lo, {h}_hi, {h}_has_hi, {h}_olab, {h}_odim, {size}}};")
    f.heaps[dst] = (h, size)
    f.emit(f"twrt_heap_reset(&{h});")


def _check_tensor_info(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    ndim, dtype, where = (f.imm(a, "a check's operand") for a in args[1:4])
    f.emit(f"TW_TRY(twrt_check_tensor_info(m, {f.val(args[0])}, {int(ndim)}, {dtype_index(dtype)}, {c_string(where)}));")


def _check_static_tensors(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    *values, shapes, dtypes, labels, where = args
    shapes_v, dtypes_v, labels_v, where_v = (f.imm(a, "a check's operand") for a in (shapes, dtypes, labels, where))
    for i, (value, shape, dt, label) in enumerate(zip(values, shapes_v, dtypes_v, labels_v)):
        arr = f"S{f.index}_{pc}_{i}"
        f.module.decls.append(f"static const int64_t {arr}[] = {{{', '.join(c_int(int(d)) for d in shape) or '0'}}};")
        f.emit(f"TW_TRY(twrt_check_static(m, {f.val(value)}, {len(shape)}, {arr}, {dtype_index(dt)}, {c_string(label)}, {c_string(where_v)}));")


def _check_tuple_info(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    size, where = (f.imm(a, "a check's operand") for a in args[1:3])
    f.emit(f"TW_TRY(twrt_check_tuple_info(m, {f.val(args[0])}, {int(size)}, {c_string(where)}));")


def _check_shape_info(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    ndim, where = (f.imm(a, "a check's operand") for a in args[1:3])
    f.emit(f"TW_TRY(twrt_check_shape_info(m, {f.val(args[0])}, {int(ndim)}, {c_string(where)}));")


def _check_prim_info(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    dtype, where = (f.imm(a, "a check's operand") for a in args[1:3])
    f.emit(f"TW_TRY(twrt_check_prim_info(m, {f.val(args[0])}, {c_string(dtype) if dtype else 'NULL'}, {c_string(where)}));")


def _match_shape(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    h = f.heap(args[1])
    codes, where, label = (f.imm(a, "a match's operand") for a in args[2:5])
    arr = f"C{f.index}_{pc}"
    f.module.decls.append(f"static const int64_t {arr}[] = {{{', '.join(c_int(int(c)) for c in codes) or '0'}}};")
    f.emit(f"TW_TRY(twrt_match_shape(m, {f.val(args[0])}, &{h}, {arr}, {len(codes)}, {c_string(where)}, {c_string(label)}));")


_DIM_CHECKS = {
    "eq": "x_ == y_",
    "broadcast": "x_ == y_ || (x_ == 1 && y_ >= 1) || (y_ == 1 && x_ >= 1)",
    "ge": "x_ >= y_",
    "divides": "y_ != 0 && x_ % y_ == 0",
    "expands": "x_ == y_ || x_ == 1",
}


def _check_dims(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    h = f.heap(args[0])
    checks, where = f.imm(args[1], "the checks"), f.imm(args[2], "where")
    for kind, a, b, message in checks:
        cond = _DIM_CHECKS.get(kind)
        if cond is None:
            raise ExportError(f"{f.fn.name}: unknown dim check {kind!r}")
        f.emit(f"{{ int64_t x_ = {h}_v[{int(a)}], y_ = {h}_v[{int(b)}]; if (!({cond})) return twrt_dim_fail(m, &{h}, {int(a)}, {int(b)}, {c_string(where)}, {c_string(message)}); }}")


def _dim_expr(program: Any, h: str, depth: int = 0) -> str:
    if not isinstance(program, tuple) or not program or depth > 64:
        raise ExportError(f"invalid dim program {program!r}")
    op, rest = program[0], program[1:]
    if op == "slot":
        return f"{h}_v[{int(rest[0])}]"
    if op == "const":
        return c_int(int(rest[0]))
    parts = [_dim_expr(p, h, depth + 1) for p in rest]
    if op in ("add", "mul") and parts:  # checked for int64 overflow (Python's ints have none)
        expr = parts[0]
        for p in parts[1:]:
            expr = f"twrt_{op}({expr}, {p}, &bad_)"
        return expr
    if op in ("floordiv", "floormod") and len(parts) == 2:
        return f"twrt_{op}({parts[0]}, {parts[1]}, &bad_)"
    if op in ("min", "max") and len(parts) == 2:
        return f"twrt_{op}({parts[0]}, {parts[1]})"
    raise ExportError(f"invalid dim program {program!r}")


def _shape_func(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    h = f.heap(args[0])
    slots, programs = f.imm(args[1], "the slots"), f.imm(args[2], "the programs")
    f.emit("{ int bad_ = 0;")
    for slot, program in zip(slots, programs):
        f.emit(f"  {h}_v[{int(slot)}] = {_dim_expr(program, h)};")
    f.emit("  if (bad_) return bad_ == 1 ? twrt_div_zero(m) : twrt_dim_overflow(m); }")


def _make_shape(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    h = f.heap(args[0])
    codes = f.imm(args[1], "the shape codes")
    n = len(codes) // 2
    if n > 16:
        raise ExportError(f"{f.fn.name}: a shape of {n} dims (the export holds at most 16)")
    dims = [c_int(int(codes[i + 1])) if codes[i] == 0 else f"{h}_v[{int(codes[i + 1])}]" for i in range(0, len(codes), 2)]
    sets = " ".join(f"r[{dst}].shape[{i}] = {d};" for i, d in enumerate(dims))
    f.emit(f"r[{dst}].kind = TW_SHAPE; r[{dst}].ndim = {n}; {sets}")


def _load_dim(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    h = f.heap(args[0])
    f.emit(f"r[{dst}].kind = TW_INT; r[{dst}].i = {h}_v[{int(f.imm(args[1], 'the slot'))}];")


def _alloc_tensor(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    f.emit(f"TW_TRY(twrt_alloc_fresh(m, &r[{dst}], {f.val(args[0])}, {dtype_index(f.imm(args[1], 'the dtype'))}));")


def _alloc_storage(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    static = f.imm(args[1], "static")
    if static:
        capacity = int(f.imm(args[0], "a static storage's size"))
        f.emit(f"twrt_static_storage(m, &r[{dst}], {f.static_offset(capacity)}, {capacity});")
    else:
        f.emit(f"TW_TRY(twrt_pool_acquire(m, &r[{dst}], {f.integer(args[0])}));")


def _alloc_from_storage(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    dtype = dtype_index(f.imm(args[3], "the dtype"))
    f.emit(f"TW_TRY(twrt_carve(m, &r[{dst}], {f.val(args[0])}, {f.val(args[1])}, {f.integer(args[2])}, {dtype}));")


def _free_storage(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    f.emit(f"twrt_pool_release(m, &r[{args[0][1]}]);" if args[0][0] == "r" else ";")


def _view(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    f.emit(f"TW_TRY(twrt_view(m, &r[{dst}], {f.val(args[0])}, {f.val(args[1])}));")


def _unary(helper: str) -> Callable[[FunctionC, int, int, list[tuple[str, Any]]], None]:
    def emit(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
        f.emit(f"TW_TRY({helper}(m, &r[{dst}], {f.val(args[0])}));")

    return emit


def _read_if_cond(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    f.emit(f"TW_TRY(twrt_read_if_cond(m, {f.val(args[0])}, &r[{dst}]));")


def _kill(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    f.emit(f"r[{dst}].kind = TW_NONE;")


def _make_tuple(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    fields = ", ".join(f.val(a) for a in args) or "NULL"
    f.emit(f"{{ const tw_val* const f_[] = {{{fields}}}; TW_TRY(twrt_make_tuple(m, &r[{dst}], {len(args)}, f_)); }}")


def _tuple_getitem(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    f.emit(f"TW_TRY(twrt_tuple_getitem(m, &r[{dst}], {f.val(args[0])}, {f.integer(args[1])}));")


def _copy(f: FunctionC, pc: int, dst: int, args: list[tuple[str, Any]]) -> None:
    f.emit(f"r[{dst}] = *{f.val(args[0])};")


_BUILTINS: dict[str, Callable[[FunctionC, int, int, list[tuple[str, Any]]], None]] = {
    "vm_alloc_shape_heap": _alloc_shape_heap,
    "vm_check_tensor_info": _check_tensor_info,
    "vm_check_static_tensors": _check_static_tensors,
    "vm_check_tuple_info": _check_tuple_info,
    "vm_check_shape_info": _check_shape_info,
    "vm_check_prim_info": _check_prim_info,
    "vm_match_shape": _match_shape,
    "vm_check_dims": _check_dims,
    "vm_shape_func": _shape_func,
    "vm_make_shape": _make_shape,
    "vm_load_dim": _load_dim,
    "vm_alloc_tensor": _alloc_tensor,
    "vm_alloc_storage": _alloc_storage,
    "vm_alloc_tensor_from_storage": _alloc_from_storage,
    "vm_free_storage": _free_storage,
    "vm_view": _view,
    "vm_tensor_to_shape": _unary("twrt_tensor_to_shape"),
    "vm.shape_of": _unary("twrt_shape_of"),
    "vm_read_if_cond": _read_if_cond,
    "vm_kill": _kill,
    "vm.make_tuple": _make_tuple,
    "vm.tuple_getitem": _tuple_getitem,
    "vm.copy": _copy,
}


def call_depth_regs(functions: Mapping[str, VMFunction]) -> int:
    """The registers of the deepest chain of calls (an ``ExportError`` for recursion, which the
    fixed register stack cannot hold)."""
    memo: dict[str, int] = {}

    def depth(name: str, seen: tuple[str, ...]) -> int:
        if name in seen:
            raise ExportError(f"function {name} calls itself (through {' -> '.join(seen)}); recursion cannot be exported")
        if name in memo:
            return memo[name]
        fn = functions[name]
        callees = {ins[2][1] for ins in fn.code if ins[0] == "call" and ins[2][0] == "func" and ins[2][1] in functions}
        memo[name] = fn.num_regs + max((depth(c, (*seen, name)) for c in callees), default=0)
        return memo[name]

    return max((depth(n, ()) for n in functions), default=0)


def check_kernel_symbols(symbols: Sequence[str]) -> None:
    """Kernel symbols live beside the runtime's names in one library."""
    for s in symbols:
        if s.startswith(("tw_model_", "twrt_", "twb_", "tw_qlinear", "tw_qexperts", "tw_imm")) or s in ("tw_val", "tw_heap", "tw_tensor", "tw_dtype", "tw_model"):
            raise BuildError(f"kernel symbol {s} would clash with a name of the exported runtime")


__all__ = ["FunctionC", "ModuleText", "DTYPES", "dl_type", "c_string", "c_int", "dtype_index", "call_depth_regs", "check_kernel_symbols"]
