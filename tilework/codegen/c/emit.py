"""C99 + OpenMP code for loop-level TensorFuncs (CPU kernels).

Kernel ABI
----------
Every TensorFunc ``f`` registered under ``name`` becomes one exported C function::

    int32_t tw_<name>(void* const* data, const int64_t* syms);

- ``data[i]`` points to the first element of buffer ``i`` of ``f.buffers`` (inputs, then
  outputs), a dense row-major (C-contiguous) array of the buffer's dtype. Buffers must not
  overlap (they are ``restrict``-qualified). Storage: float16 is IEEE half, bfloat16 the upper
  16 bits of a float32, bool one byte holding 0 or 1.
- ``syms[j]`` is the value of ``tilework.ir.loop.kernel_syms(f)[j]``: the sym vars of the buffer shapes (in
  param order, first occurrence), then the sym params not already listed. The kernel trusts
  these values and the array shapes they imply (the caller checks them, see ``tilework.ir.kernel_abi.bind_syms``).
- The return value is 0 on success, 1 when scratch memory could not be allocated.

``<name>`` is the registered name with every character outside ``[A-Za-z0-9_]`` replaced by
``_`` (deduplicated with a numeric suffix, also against the prelude's ``tw_`` helpers);
``c_symbols`` gives the mapping. The library also exports ``tw_call_objects(fn, objs, n,
offset, syms)``, which reads each data pointer at ``offset`` bytes into ``objs[i]`` (a NumPy
array object's address) and calls ``fn``: the cheap path ``library.Kernel`` uses.

Semantics are those of ``tilework.codegen.interp`` (which runs the same program serially on
NumPy arrays); the loop kinds map to ``#pragma omp parallel`` around a loop over shares of
its chunks (parallel, below), ``#pragma omp simd`` (vectorized) and ``#pragma GCC unroll``
(unrolled). A parallel or vectorized loop whose iterations provably write one element (a
reduction loop) is emitted serial, with a comment.
A parallel loop forks threads only when its work (``tilework.codegen.c.parallel``: iterations,
a statement of many loads counting more, an exp or other costly intrinsic ``COSTLY_WORK`` more)
reaches ``TW_PARALLEL_MIN_WORK`` (small shapes of a symbolic kernel run serially). Its
iterations go in chunks (``tw_chunk(n, work)``: at most ``TW_CHUNKS_PER_THREAD`` chunks a
thread, each of ``TW_CHUNK_MIN_WORK`` work at least) into shares, one a thread
(``tw_shares_take``, the prelude): a thread runs its own share front to back, then takes chunks
from the back of the others' shares. Where the threads keep pace each runs one contiguous run
of iterations, as under a static schedule (a kernel that hints the data of its next iteration,
the paged attention's decode, relies on it); a thread that cannot run (its core taken by
another thread pool still spinning after its call, onnxruntime's or BLAS's, or by another
tenant) leaves its share to the others instead of holding them all at the loop's end, as under
a dynamic one. Chunks taken as threads came free (``schedule(dynamic)``, in use before) had
measured, on a 2-core Zen 3, the MLP 1024 -> 4096 -> silu -> 1024 called in turn with
onnxruntime's: n = 128 24.8 -> 13.2 ms, n = 256 35.4 -> 24.9 ms against equal shares fixed in
advance; the shares then measured on a 2-core Zen 4, alone, n = 32 3.8-3.9 -> 3.3-3.6 ms and
n = 128 12.3-13.8 -> 10.6-11.8 against those chunks (the same beside onnxruntime), and the
paged attention's decode at batch 8 about 6% faster (medians a layer).
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping


from tilework.codegen.c import lowp
from tilework.codegen.c.dot import DotEmitter, byte_pair, flat_dim
from tilework.codegen.c.hoist import divmods, invariant_exprs, nested_divmods, positive_linear, stmt_dims, unswitch_plan, unswitch_select
from tilework.codegen.c.parallel import loop_conflict, parallel_work
from tilework.codegen.c.prelude import PRELUDE
from tilework.codegen.loop_emit import comment, const_value
from tilework.errors import WellFormedError
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.dtype import DTYPE_TABLE, is_float_dtype, is_int_dtype, is_lowp_dtype
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
    PExpr,
    PREFETCHES,
    DOT_BF16X2,
    DOT_U8I8X4,
    Scalar,
    Select,
    Stmt,
    Store,
    TensorFunc,
    Unary,
    dtype_of,
    index_dims,
    kernel_syms,
    stmt_scalars,
    walk_scalars,
    walk_stmts,
)
from tilework.ir.sym import Dim, FloorDiv, FloorMod, Max, Min, Poly, SymExpr, SymVar

STACK_LIMIT = 32 * 1024  # scratch of a static size up to this many bytes lives on the stack
_NARROW_INTS = ("int8", "int16", "uint8", "uint16")
_FLOAT_FN = {
    "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "sin": "sin",
    "cos": "cos", "atan": "atan", "asin": "asin", "acos": "acos", "log1p": "log1p",
    "expm1": "expm1", "abs": "fabs", "floor": "floor", "ceil": "ceil", "round": "rint",
}  # fmt: skip
_C_KEYWORDS = frozenset(
    "auto break case char const continue default do double else enum extern float for goto if "
    "inline int long register restrict return short signed sizeof static struct switch typedef "
    "union unsigned void volatile while bool true false main".split()
)
# library names a kernel may use: a buffer or var named so would shadow them
_C_LIBRARY_NAMES = frozenset(
    [f"{fn}{sfx}" for fn in (*_FLOAT_FN.values(), "pow", "fmod", "fma", "copysign") for sfx in ("", "f")]
    + ["isnan", "isinf", "memcpy", "malloc", "free", "NAN", "INFINITY"]
)


UNIT_CHARS = 16_000  # kernels of a library are grouped into translation units of about this much C
_UNIT_HEADER = "#define TW_NO_CALL_OBJECTS 1\n"


@dataclass(frozen=True)
class CUnit:
    """One translation unit of a library built in parts: the prelude and some kernels
    (``lines`` as in ``CModule``, within ``text``). The trampoline ``tw_call_objects`` is left
    out of each (``TW_NO_CALL_OBJECTS``); a unit of the prelude alone provides it. ``flags``
    follow the library's compiler flags for this unit alone (a later ``-O`` wins)."""

    text: str
    lines: dict[str, tuple[int, int]]
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class CModule:
    """Generated C text for a set of kernels; ``lines[name]`` is the 1-based inclusive line
    range of kernel ``name``'s function, ``symbols[name]`` its exported C symbol.

    ``units``: the same kernels as translation units that compile separately (in parallel,
    each cached on its own) and link into a library equivalent to ``text``'s: a large kernel
    is a unit of its own, small neighbours share one (each unit parses the prelude again).
    Empty when ``text`` is one unit's worth."""

    text: str
    symbols: dict[str, str]
    lines: dict[str, tuple[int, int]]
    units: tuple[CUnit, ...] = ()


_PRELUDE_NAMES = frozenset(re.findall(r"\b(tw_\w+)", PRELUDE)) | {
    f"tw_{op}{s}" for op in ("max", "min", "maxc", "minc", "fmod", "fdiv") for s in ("_f", "_d")
}


def c_symbols(names: list[str]) -> dict[str, str]:
    """The exported C symbol of each kernel name (see the ABI above)."""
    out: dict[str, str] = {}
    taken: set[str] = set(_PRELUDE_NAMES)
    for n in names:
        base = "tw_" + re.sub(r"\W", "_", n, flags=re.ASCII)
        s, k = base, 1
        while s in taken:
            s, k = f"{base}_{k}", k + 1
        taken.add(s)
        out[n] = s
    return out


def emit_module(funcs: Mapping[str, TensorFunc]) -> CModule:
    """One C translation unit holding every kernel of ``funcs``."""
    symbols = c_symbols(list(funcs))
    texts = {name: emit_function(func, symbols[name], name) for name, func in funcs.items()}
    text, lines = _join(_head(texts.values()) + PRELUDE, texts)
    groups: list[dict[str, str]] = [{}]
    size = 0
    for name, t in texts.items():
        if groups[-1] and size + len(t) > UNIT_CHARS:
            groups.append({})
            size = 0
        groups[-1][name] = t
        size += len(t)
    units: tuple[CUnit, ...] = ()
    if len(groups) > 1:
        units = (CUnit(_NO_INTRINSICS + PRELUDE, {}), *(CUnit(*_join(_UNIT_HEADER + _head(g.values()) + PRELUDE, g)) for g in groups))
    return CModule(text, symbols, lines, units)


_NO_INTRINSICS = "#define TW_NO_INTRINSICS 1\n"
_INTRINSIC_MACROS = ("TW_DOT_BF16", "TW_DOT_U8I8")  # the prelude's, which kernels test


def _head(texts: Iterable[str]) -> str:
    """What goes before the prelude of C holding the kernel ``texts``: ``TW_NO_INTRINSICS``
    where none of them uses the prelude's intrinsics (``_INTRINSIC_MACROS``), so that the unit does
    not parse immintrin.h: under -march=native on an AVX-512 host 0.14 of a prelude's 0.16 s of
    compile time (a unit of DenseNet-121's kernels about 0.44 s, of 49 units)."""
    return "" if any(m in t for t in texts for m in _INTRINSIC_MACROS) else _NO_INTRINSICS


def _join(head: str, texts: Mapping[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """``head`` followed by the kernel ``texts``, and each kernel's line range."""
    lines: dict[str, tuple[int, int]] = {}
    line = head.count("\n") + 1
    for name, text in texts.items():
        n = text.count("\n")  # the function's lines, then one blank line
        lines[name] = (line, line + n - 2)
        line += n
    return head + "".join(texts.values()), lines


def emit_function(func: TensorFunc, symbol: str, name: str | None = None) -> str:
    """The C definition of one kernel, exported as ``symbol``."""
    return _Emitter(func, symbol, name or symbol).run()


# -- literals -------------------------------------------------------------------------------


def _float_literal(v: float, suffix: str) -> str:
    if math.isnan(v):
        return "NAN" if suffix else "(double)NAN"
    if math.isinf(v):
        s = "INFINITY" if suffix else "(double)INFINITY"
        return s if v > 0 else f"(-{s})"
    r = repr(v)
    if "." not in r and "e" not in r:
        r += ".0"
    return f"{r}{suffix}" if v >= 0 else f"({r}{suffix})"


def _int_literal(v: int) -> str:
    if v == -(1 << 63):
        return "(-INT64_C(9223372036854775807) - 1)"
    if abs(v) >= 1 << 31:
        return f"INT64_C({v})" if v >= 0 else f"(-INT64_C({-v}))"
    return str(v) if v >= 0 else f"({v})"


def _float_int_round_trip(func: TensorFunc) -> bool:
    """Whether ``func`` converts a float to an integer and an integer to a float. Under
    ``-fno-trapping-math`` GCC turns ``(float)(int64_t)x`` into ``truncf(x)`` (with SSE4.1's
    rounding instructions), which keeps the sign of ``-0.2`` (``-0.0``) where the conversions
    give ``+0.0`` (torch, NumPy, the interpreter); such a kernel is compiled with trapping
    math, which leaves the conversions as they are (and still vectorizes them)."""
    to_int = to_float = False
    for st in walk_stmts(func.body):
        for x in stmt_scalars(st):
            for e in walk_scalars(x):
                if isinstance(e, Cast) and e.dtype != "bool":
                    src = dtype_of(e.value)
                    to_int = to_int or (is_float_dtype(src) and is_int_dtype(e.dtype))
                    to_float = to_float or (is_int_dtype(src) and is_float_dtype(e.dtype))
    return to_int and to_float



class _Emitter(DotEmitter):
    def __init__(self, func: TensorFunc, symbol: str, name: str) -> None:
        super().__init__(func, name)
        self.symbol = symbol
        self.parallel = 0
        self.hoisted: set[Block] = set()
        self.written = {s.buffer for s in walk_stmts(func.body) if isinstance(s, Store)}
        self.bindings: dict[SymVar, Dim] = {}  # iter var -> its binding, inside its block
        self.hoisted_divmods: dict[SymExpr, str] = {}  # floor div/mod -> the variable holding it
        self.hoisted_exprs: dict[PExpr, str] = {}  # loop-invariant expression -> its variable
        self.dot_fallback = False  # emitting the portable copy of a dot_bf16x2 or dot_u8i8x4 loop
        self.decided: dict[Select, bool] = {}  # an unswitched select -> the side this copy takes
        self.unswitching: set[For] = set()  # vectorized loops being emitted in unswitched copies

    def legal_name(self, base: str) -> str:
        if base[0].isdigit() or base in _C_KEYWORDS or base in _C_LIBRARY_NAMES or base.startswith(("tw_", "TW_")):
            return "v_" + base
        return base

    def run(self) -> str:
        f = self.func
        head = f"int32_t {self.symbol}(void* const* restrict tw_data, const int64_t* restrict tw_syms) {{"
        if _float_int_round_trip(f):
            head = f'__attribute__((optimize("trapping-math"))) {head}'
        self.lines = [f"/* kernel {comment(self.kname)} */", head]
        for i, b in enumerate(f.buffers):
            ct = DTYPE_TABLE[b.dtype].c_storage
            q = "" if b in self.written else "const "
            self.line(f"{q}{ct}* restrict {self.bind(b, b.name)} = ({q}{ct}*)tw_data[{i}];")
        for j, v in enumerate(kernel_syms(f)):
            self.line(f"const int64_t {self.bind(v, v.name)} = tw_syms[{j}];")
            self.scope.add(v)
        for _, ext in self.empty_reduction_checks():
            self.line(f"if ({self.dim(ext)} < 1) return 3; /* a reduction over an empty domain */")
        self.line("int32_t tw_err = 0;")
        self.stmt(f.body)
        self.line("return tw_err;")
        self.lines.append("}")
        return "\n".join(self.lines) + "\n\n"

    def error(self, msg: str) -> WellFormedError:
        return WellFormedError(f"kernel {self.kname}: {msg}")

    # -- statements -----------------------------------------------------------------------

    def emit_if(self, s: IfThenElse) -> None:
        self.line(f"if ({self.expr(s.cond)}) {{")
        self.nested(s.then_body)
        if s.else_body is not None:
            self.line("} else {")
            self.nested(s.else_body)
        self.line("}")

    def emit_store(self, s: Store) -> None:
        b = s.buffer
        name = self.known(b, f"store to buffer {b.name}")
        value = self.expr(s.value)
        if b.dtype == "float16":
            value = f"TW_F2H({value})"
        elif b.dtype == "bfloat16":
            value = f"tw_f2bf({value})"
        else:
            value = lowp.store(b.dtype, value) or value
        self.line(f"{name}[{self.flat(b, s.indices)}] = {value};")

    def emit_for(self, s: For) -> None:
        if s.kind == "vectorized" and (s in self.unswitching or unswitch_plan(s, self.scope)):
            found = unswitch_select(s, self.scope, self.decided)
            if found is not None:
                self.emit_unswitched(s, *found)
                return
        if s.kind == "vectorized" and not self.dot_fallback and loop_conflict(s) is None and self.emit_dot(s):
            return
        if s.kind not in ("serial", "parallel", "vectorized", "unrolled"):
            raise self.error(f"unknown loop kind {s.kind!r}")
        ext = self.dim(s.extent)
        var = self.bind(s.var, s.var.name)
        hoist = self.hoist_init(s)
        if hoist is not None:
            self.emit_hoisted_init(*hoist)
        parallel = s.kind == "parallel" and self.parallel == 0
        invariants: list[PExpr] = []
        if s.kind in ("parallel", "vectorized"):
            why = loop_conflict(s)
            if why is not None:
                self.line(f"/* {comment(s.kind)} loop emitted serial: {comment(why)} */")
                parallel = False
            elif parallel:
                work = parallel_work(s)
                cond = "" if work is None else f" if({self.dim(work)} >= TW_PARALLEL_MIN_WORK)"
                chunk = f"tw_chunk({ext}, {0 if work is None else self.dim(work)})"
                # the chunks in shares (prelude: tw_shares_take), one a thread
                self.line("{")
                self.line(f"tw_shares tw_sh; tw_shares_init(&tw_sh, {ext}, {chunk});")
                self.line(f"#pragma omp parallel{cond}")
                self.line("{")
                self.line("int64_t tw_lo, tw_hi;")
                self.line("while (tw_shares_take(&tw_sh, TW_THREAD_NUM(), &tw_lo, &tw_hi)) {")
            elif s.kind == "vectorized":
                invariants = self.hoist_invariants(s)
                self.line("#pragma omp simd")
        elif s.kind == "unrolled":
            n = s.extent if isinstance(s.extent, int) else 8
            self.line(f"#pragma GCC unroll {max(1, min(n, 64))}")
        start, end = ("tw_lo", "tw_hi") if parallel else ("0", ext)
        self.line(f"for (int64_t {var} = {start}; {var} < {end}; ++{var}) {{")
        self.scope.add(s.var)
        self.depth += 1
        hoisted = self.hoist_divmods(s)
        self.depth -= 1
        self.parallel += parallel
        self.nested(s.body)
        self.parallel -= parallel
        for d in hoisted:
            del self.hoisted_divmods[d]
        for x in invariants:
            del self.hoisted_exprs[x]
        self.scope.discard(s.var)
        self.line("}")
        if parallel:
            self.line("}")  # while a chunk is left
            self.line("}")  # the parallel region
            self.line("}")  # the shares' scope

    def emit_unswitched(self, s: For, sel: Select, ivs: list[tuple[SymVar, Dim]]) -> None:
        """Loop ``s`` once where ``sel``'s invariant condition holds, once where it does not,
        each with ``sel`` as the side it takes (``hoist.unswitch_plan``); the condition reads
        block iter vars ``ivs`` as their bindings."""
        self.unswitching.add(s)
        with self.read_as_bindings(ivs):
            self.line(f"if ({self.expr(sel.cond)}) {{")
        for taken in (True, False):
            self.decided[sel] = taken
            self.nested(s)
            self.line("} else {" if taken else "}")
        del self.decided[sel]
        if not self.decided:
            self.unswitching.discard(s)

    def element(self, x: Load | Store) -> str:
        """The C lvalue of the element ``x`` loads or stores (``&`` of it is its address)."""
        what = "load from" if isinstance(x, Load) else "store to"
        return f"{self.known(x.buffer, f'{what} buffer {x.buffer.name}')}[{self.flat(x.buffer, x.indices)}]"

    def hoist_invariants(self, s: For) -> list[PExpr]:
        """Declare, before vectorized loop ``s``, its loop-invariant float subexpressions
        (``tilework.codegen.c.hoist``); their uses in the loop read the variable."""
        ivs, found = invariant_exprs(s, self.scope)
        if not found:
            return []
        same: dict[tuple[str, str], str] = {}  # equal loads read one variable
        with self.read_as_bindings(ivs):
            for x in found:
                text, ct = self.expr(x), DTYPE_TABLE[x.dtype].c_storage
                name = same.get((ct, text))
                if name is None:
                    name = same[(ct, text)] = self.bind(("inv", x), "inv")
                    self.line(f"const {ct} {name} = {text};")
                self.hoisted_exprs[x] = name
        return found

    @contextlib.contextmanager
    def read_as_bindings(self, ivs: list[tuple[SymVar, Dim]]) -> Iterator[None]:
        """Within: block iter vars ``ivs`` read as their bindings (outside their blocks)."""
        saved = {v: self.names.get(v) for v, _ in ivs}
        fresh = [v for v, _ in ivs if v not in self.scope]
        for v, binding in ivs:
            self.names[v] = f"({self.dim(binding)})"
            self.scope.add(v)
        yield
        self.scope.difference_update(fresh)
        for v, name in saved.items():
            if name is None:
                self.names.pop(v, None)
            else:
                self.names[v] = name

    def expr(self, x: Scalar) -> str:
        name = self.hoisted_exprs.get(x) if isinstance(x, PExpr) else None
        return name if name is not None else super().expr(x)

    def hoist_divmods(self, s: For) -> list[SymExpr]:
        """Declare, at the top of loop ``s``'s body, every floor division and modulo in the body
        that depends on ``s.var`` and otherwise only on vars already in scope; their uses below
        read the variable. The C compiler cannot move a division out of the conditions and
        blocks it sits in (it may trap), so a fused loop's index arithmetic would otherwise run
        in the innermost loop. A divisor not proven nonzero is tested first: the hoisted value
        may be computed where the original expression would not have been."""
        found: dict[SymExpr, None] = {}
        for d in stmt_dims(s.body):
            for a in nested_divmods(d):
                if a not in self.hoisted_divmods and s.var in sym_walk.free_vars(a) and set(sym_walk.free_vars(a)) <= self.scope:
                    found[a] = None
        for a in found:  # inner ones first: an outer one's text reads them
            assert isinstance(a, (FloorDiv, FloorMod))
            text = self.render_divmod(a)
            if not (sym.prove_ge(a.b, 1) or sym.prove_le(a.b, -1)):
                text = f"({self.dim(a.b)} != 0 ? {text} : 0)"
            self.line(f"const int64_t {self.bind(('divmod', a), 'ix')} = {text};")
            self.hoisted_divmods[a] = self.names[("divmod", a)]
        return list(found)

    def dim(self, d: Dim) -> str:
        name = None if isinstance(d, int) else self.hoisted_divmods.get(d)
        return name if name is not None else super().dim(d)

    def emit_block(self, b: Block) -> None:
        self.line(f"{{ /* block {comment(b.name)} */")
        self.depth += 1
        for iv in b.iter_vars:
            if isinstance(iv.binding, SymVar) and iv.binding in self.scope:
                self.names[iv.var] = self.names[iv.binding]
            else:
                value = self.dim(iv.binding)
                self.line(f"const int64_t {self.bind(iv.var, iv.var.name)} = {value};")
            self.scope.add(iv.var)
            self.bindings[iv.var] = iv.binding
        if b.init is not None and b not in self.hoisted:
            reds = [iv.var for iv in b.iter_vars if iv.kind == "reduce"]
            cond = " && ".join(f"{self.names[v]} == 0" for v in reds) or "1"
            self.line(f"if ({cond}) {{")
            self.nested(b.init)
            self.line("}")
        self.stmt(b.body)
        for iv in b.iter_vars:
            self.scope.discard(iv.var)
            self.bindings.pop(iv.var, None)
        self.depth -= 1
        self.line("}")

    def hoist_init(self, s: For) -> tuple[Block, list[Dim]] | None:
        """The block whose init can run once before loop ``s`` instead of inside it: ``s``
        starts a perfect nest of loops ending in the block, the nest's vars feed only reduce
        iter vars, each reduce binding is a positive combination of them (zero exactly when
        they all are), and every nest var is used. The init then runs when every extent of
        the nest is positive; an init whose reduction may be empty never gets here (it was moved
        out by ``init_empty_reductions``, or the kernel refuses that case on entry)."""
        chain: list[For] = []
        node: Stmt = s
        while isinstance(node, For):
            chain.append(node)
            node = node.body
        if not isinstance(node, Block) or node.init is None:
            return None
        nest = {lp.var for lp in chain}
        used: set[SymVar] = set()
        for iv in node.iter_vars:
            fv = set(sym_walk.free_vars(iv.binding))
            if iv.kind != "reduce":
                if fv & nest:
                    return None
                continue
            if not fv <= nest or not positive_linear(iv.binding):
                return None
            used |= fv
        if used != nest:
            return None
        return node, [lp.extent for lp in chain]

    def emit_hoisted_init(self, b: Block, extents: list[Dim]) -> None:
        self.hoisted.add(b)
        guard = [f"{self.dim(e)} > 0" for e in extents if not sym.prove_ge(e, 1)]
        self.line(f"if ({' && '.join(guard)}) {{" if guard else "{")
        self.depth += 1
        self.line(f"/* init of block {comment(b.name)} */")
        declared: list[SymVar] = []
        for iv in b.iter_vars:
            if iv.kind == "reduce":
                self.line(f"const int64_t {self.bind(iv.var, iv.var.name)} = 0;")
            elif isinstance(iv.binding, SymVar) and iv.binding in self.scope:
                self.names[iv.var] = self.names[iv.binding]
            else:
                value = self.dim(iv.binding)
                self.line(f"const int64_t {self.bind(iv.var, iv.var.name)} = {value};")
            self.scope.add(iv.var)
            declared.append(iv.var)
        assert b.init is not None
        self.stmt(b.init)
        for v in declared:
            self.scope.discard(v)
        self.depth -= 1
        self.line("}")

    def emit_allocate(self, s: Allocate) -> None:
        b = s.buffer
        ct = DTYPE_TABLE[b.dtype].c_storage
        size = sym.product(b.shape)
        self.line("{")
        self.depth += 1
        if isinstance(size, int) and size * DTYPE_TABLE[b.dtype].itemsize <= STACK_LIMIT:
            # accessed through a restrict pointer: GCC then keeps a small array that a loop
            # accumulates into in registers even when the loop also reads another local array
            array = self.bind(("storage", b), b.name)
            self.line(f"{ct} {array}[{max(size, 1)}] __attribute__((aligned(64)));")
            self.line(f"{ct}* restrict {self.bind(b, b.name + '_p')} = {array};")
            self.stmt(s.body)
        else:
            name = self.bind(b, b.name)
            self.line(f"{ct}* restrict {name} = ({ct}*)tw_alloc({self.dim(size)}, {DTYPE_TABLE[b.dtype].itemsize});")
            self.line(f"if ({name} == NULL) {{")
            self.depth += 1
            self.line("#pragma omp atomic write")
            self.line("tw_err = 1;")
            self.depth -= 1
            self.line("} else {")
            self.nested(s.body)
            self.line(f"    tw_free({name});")
            self.line("}")
        self.depth -= 1
        self.line("}")

    # -- index arithmetic (int64) ---------------------------------------------------------

    def render_int(self, v: int) -> str:
        return _int_literal(v)

    def render_divmod(self, d: FloorDiv | FloorMod) -> str:
        a, b = self.dim(d.a), self.dim(d.b)
        op, fn = ("/", "tw_floordiv") if isinstance(d, FloorDiv) else ("%", "tw_floormod")
        if sym.prove_ge(d.a, 0) and sym.prove_ge(d.b, 1):
            return f"({a} {op} {b})"
        return f"{fn}({a}, {b})"

    def render_minmax(self, d: Min | Max) -> str:
        fn = "tw_min_i64" if isinstance(d, Min) else "tw_max_i64"
        return f"{fn}({self.dim(d.a)}, {self.dim(d.b)})"

    def render_poly(self, d: Poly) -> str:
        parts: list[str] = []
        for mono, c in d.terms:
            factors = [self.dim(a) for a in mono]
            if abs(c) != 1:
                factors.insert(0, _int_literal(abs(c)))
            parts.append(("- " if c < 0 else "+ ") + " * ".join(factors))
        if d.const:
            parts.append(("- " if d.const < 0 else "+ ") + _int_literal(abs(d.const)))
        text = " ".join(parts)
        return "(" + (text[2:] if text.startswith("+ ") else "-" + text[2:]) + ")"

    def flat(self, b: Buffer, indices: tuple[Scalar, ...]) -> str:
        """The row-major element offset of ``indices`` in ``b``."""
        if len(indices) != len(b.shape):
            raise self.error(f"buffer {b.name} of rank {len(b.shape)} accessed with {len(indices)} indices")
        if not indices:
            return "0"
        off = flat_dim(b, indices)
        if off is not None:
            if self.bindings and divmods(off):
                # In the loop vars a division often cancels (a packed weight's ``j // 32`` with
                # ``j = 32 * j_0 + j_1``, ``j_1 < 32``, is ``j_0``): an index the C compiler
                # vectorizes, where the division would make it gather. Taken when it divides
                # by nothing the iter var bindings do not already divide by.
                flat = sym_walk.substitute(off, self.bindings)
                if divmods(flat) <= set().union(*(divmods(v) for v in self.bindings.values())):
                    off = flat
            return self.dim(off)
        # an index computed from a load: the indices up to the last such one as text, the
        # symbolic ones after it as one offset (whose divisions may cancel, as above)
        last = max(k for k, i in enumerate(indices) if not isinstance(i, (int, SymExpr)))
        text = self.index(indices[0])
        for i, ext in zip(indices[1 : last + 1], b.shape[1 : last + 1]):
            text = f"({text} * {self.dim(ext)} + {self.index(i)})"
        if last + 1 == len(indices):
            return text
        tail: Dim = 0
        for d, ext in zip(index_dims(indices[last + 1 :]) or (), b.shape[last + 1 :]):
            tail = sym.add(sym.mul(tail, ext), d)
        return f"({text} * {self.dim(sym.product(b.shape[last + 1 :]))} + {self.dim(tail)})"

    def index(self, i: Scalar) -> str:
        if isinstance(i, (int, SymExpr)):
            return self.dim(i)
        if not is_int_dtype(dtype_of(i)):
            raise self.error(f"index of dtype {dtype_of(i)} is not an integer")
        return f"(int64_t){self.expr(i)}"

    # -- scalar expressions ---------------------------------------------------------------

    def render_load(self, x: Load) -> str:
        b = x.buffer
        text = f"{self.known(b, f'load of buffer {b.name}')}[{self.flat(b, x.indices)}]"
        if b.dtype == "float16":
            return f"TW_H2F({text})"
        return f"tw_bf2f({text})" if b.dtype == "bfloat16" else lowp.load(b.dtype, text) or text

    def render_unary(self, x: Unary) -> str:
        a = self.expr(x.a)
        if x.op == "not":
            return f"(!{a})"
        return f"(({DTYPE_TABLE[x.dtype].c_value})(-{a}))" if x.dtype in _NARROW_INTS else f"(-{a})"

    def render_select(self, x: Select) -> str:
        taken = self.decided.get(x)
        if taken is not None:
            return self.expr(x.a if taken else x.b)
        return f"({self.expr(x.cond)} ? {self.expr(x.a)} : {self.expr(x.b)})"

    def render_const(self, c: Const) -> str:
        v = const_value(c)
        if c.dtype == "bool":
            return "true" if v else "false"
        if c.dtype == "float64":
            return _float_literal(float(v), "")
        if is_float_dtype(c.dtype):
            return _float_literal(float(v), "f")
        if c.dtype == "int64":
            return _int_literal(int(v))
        return f"(({DTYPE_TABLE[c.dtype].c_value}){_int_literal(int(v))})"

    def render_cast(self, x: Cast) -> str:
        src, dst = dtype_of(x.value), x.dtype
        a = self.expr(x.value)
        if src == dst:
            return a
        narrow = lowp.cast(src, dst, a)
        if narrow is not None:
            return narrow
        if dst == "float16":
            return f"tw_round_h_f({a})" if src in ("float32", "float16", "bfloat16") else f"tw_round_h_d((double)({a}))"
        if dst == "bfloat16":
            return f"tw_round_bf((float)({a}))"
        if dst == "bool":
            return f"({a} != 0)"
        return f"(({DTYPE_TABLE[dst].c_value})({a}))"

    def render_binary(self, x: Binary) -> str:
        low = byte_pair(x)
        if low is not None:
            return f"((int32_t)tw_u16_at(&{self.element(low)}))"
        a, b, op = self.expr(x.a), self.expr(x.b), x.op
        dt = dtype_of(x.a)
        ct = DTYPE_TABLE[dt].c_value
        fl = is_float_dtype(dt)
        sfx = "_d" if dt == "float64" else "_f"
        if op in ("<", "<=", ">", ">=", "==", "!="):
            return f"({a} {op} {b})"
        if op in ("and", "or"):
            return f"({a} {'&&' if op == 'and' else '||'} {b})"
        if op == "/" and not fl:
            return f"(({ct})tw_truncdiv({a}, {b}))"  # never traps (docs/semantics.md)
        if op in ("+", "-", "*", "/"):
            text = f"({a} {op} {b})"
            return f"(({ct}){text})" if dt in _NARROW_INTS else text
        if op in ("//", "%"):
            if fl:
                return f"tw_{'fdiv' if op == '//' else 'fmod'}{sfx}({a}, {b})"
            if isinstance(x.a, (int, SymExpr)) and isinstance(x.b, (int, SymExpr)):
                return self.dim(sym.floordiv(x.a, x.b) if op == "//" else sym.floormod(x.a, x.b))
            fn = "tw_floordiv" if op == "//" else "tw_floormod"
            return f"(({ct}){fn}({a}, {b}))"
        if op in ("min", "max"):
            if fl and isinstance(x.b, Const) and x.b.value == x.b.value:  # a bound that is not NaN
                return f"tw_{op}c{sfx}({a}, {b})"
            if fl:
                return f"tw_{op}{sfx}({a}, {b})"
            return f"(({ct})tw_{op}_i64({a}, {b}))"
        if op == "pow":
            if fl:
                return f"pow{'' if dt == 'float64' else 'f'}({a}, {b})"
            return f"(({ct})pow((double)({a}), (double)({b})))"
        raise self.error(f"unknown binary op {op!r}")

    def render_bits(self, x: Intrin) -> str:
        """The bitwise intrinsics on integers and ``bitcast`` (through the unsigned integer of
        the same size; ``tw_*_bits``/``tw_bits_*`` copy the bytes of floats)."""
        ct = DTYPE_TABLE[x.dtype].c_value
        args = [self.expr(a) for a in x.args]
        if x.name == "bitwise_not":
            return f"(({ct})(~{args[0]}))"
        if x.name != "bitcast":
            op = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}[x.name]
            return f"(({ct})({args[0]} {op} {args[1]}))"
        src, dst = dtype_of(x.args[0]), x.dtype
        u = f"uint{8 * DTYPE_TABLE[src].itemsize}_t"
        to_bits = {"float32": "(uint32_t)tw_f_bits({})", "float64": "(uint64_t)tw_d_bits({})", "float16": "tw_h_bits({})", "bfloat16": "tw_f2bf({})"}
        bits = lowp.store(src, args[0]) or to_bits.get(src, f"(({u})({{}}))").format(args[0])
        if is_lowp_dtype(dst):  # read the low byte as the dtype's one-byte code
            return f"tw_from_{dst}((uint8_t)({bits}))"
        from_bits = {"float32": "tw_bits_f((int32_t)({}))", "float64": "tw_bits_d((int64_t)({}))", "float16": "tw_bits_h({})", "bfloat16": "tw_bf2f({})", "bool": "({} != 0)"}
        return from_bits.get(dst, f"(({ct})({{}}))").format(bits)

    def render_intrin(self, x: Intrin) -> str:
        if x.name.startswith("bitwise_") or x.name == "bitcast":
            return self.render_bits(x)
        if x.name in (DOT_BF16X2, DOT_U8I8X4):  # the prelude's scalar forms
            return f"tw_{x.name}({', '.join(self.expr(a) for a in x.args)})"
        if x.name == "check_range":
            v, lo, hi = (self.expr(a) for a in x.args)
            return f"(({DTYPE_TABLE[x.dtype].c_value})tw_check_range({v}, {lo}, {hi}, &tw_err))"
        arg = x.args[0]
        if x.name in PREFETCHES:  # the load's address, not its value
            if not isinstance(arg, Load):
                raise self.error(f"intrinsic {x.name} takes a load")
            addr = f"&{self.element(arg)}"
            # cache level 1 -> locality 3 (x86: prefetcht0), level 2 -> locality 2 (prefetcht1: a
            # stream of pages ahead sent to L1 evicted what the loop was reading; SmolLM2's
            # batch-8 decode attention at 512 tokens 1.3x faster with it, Zen 4)
            return f"(__builtin_prefetch({addr}, 0, {4 - PREFETCHES[x.name]}), ({DTYPE_TABLE[x.dtype].c_value})0)"
        a = self.expr(arg)
        dt = dtype_of(arg)
        if x.name in ("isnan", "isinf"):
            return f"({x.name}({a}) != 0)" if is_float_dtype(dt) else "false"
        if x.name == "check_nonzero":
            return f"(({DTYPE_TABLE[dt].c_value})tw_check_nonzero({a}, &tw_err))"
        if not is_float_dtype(dt):
            if x.name == "abs":
                return f"(({DTYPE_TABLE[dt].c_value})tw_abs_i64({a}))"
            if x.name in ("floor", "ceil", "round"):
                return a
            raise self.error(f"intrinsic {x.name} needs a float argument, got {dt}")
        s = "" if dt == "float64" else "f"
        one = "1.0" if dt == "float64" else "1.0f"
        if x.name == "rsqrt":
            return f"({one} / sqrt{s}({a}))"
        if x.name == "sigmoid":  # the prelude's inlinable, vectorizable float sigmoid
            return f"tw_sigmoid_f({a})" if s else f"({one} / ({one} + exp(-{a})))"
        if s and x.name in ("exp", "tanh", "erf"):
            return f"tw_{x.name}_f({a})"
        if x.name not in _FLOAT_FN:
            raise self.error(f"unknown intrinsic {x.name!r}")
        return f"{_FLOAT_FN[x.name]}{s}({a})"


__all__ = ["CModule", "emit_module", "emit_function", "c_symbols"]
