"""Helpers the default schedule rules share: finding loop nests, trying a primitive, and the
standard treatment of a spatial nest (fuse the outer loops, run them in parallel, vectorize
the innermost)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Callable

from tilework.errors import ScheduleError
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.dtype import DTYPE_TABLE
from tilework.ir.loop import Allocate, Block, For, IfThenElse, SeqStmt, Stmt, Store, TensorFunc
from tilework.ir.sym import Dim, SymVar
from tilework.schedule import loop_primitives as lp
from tilework.schedule.dependence import INDEPENDENT, dependence_of
from tilework.schedule.analysis import loads_of
from tilework.schedule.tree import Path, block_names, dim_vars, find_loop, get_at, subst_scalar, walk

VECTOR_BYTES = 64  # one AVX-512 register; narrower ISAs just split the vector loop
MIN_PARALLEL_WORK = 4096  # a static nest with fewer iterations runs on one thread
TRANSPOSE_TILE = 16  # a transpose moves 16 x 16 tiles: 16 cache lines each way
ROW_WORK = 64  # iterations assumed inside each row of a nest that is not perfect


@dataclass(frozen=True)
class VectorRegisters:
    """The host's vector register file: register width in bytes and how many there are."""

    width: int
    count: int

    def lanes(self, dtype: str) -> int:
        return max(1, self.width // (DTYPE_TABLE[dtype].itemsize if dtype in DTYPE_TABLE else 4))


@functools.lru_cache(maxsize=1)
def host_registers() -> VectorRegisters:
    """The vector registers of the CPU the kernels are compiled for (``-march=native``):
    AVX-512 has 32 of 64 bytes, AVX/AVX2 16 of 32, NEON 32 of 16, else 16 of 16. A register
    tile sized for the wrong file spills (an 8 x 32 float tile is 32 AVX2 registers, twice the
    file), so tile sizes come from here. ``TILEWORK_VECTOR_REGISTERS=<bytes>x<count>``
    overrides (e.g. ``32x16``). Only speed depends on it: every schedule is correct anywhere."""
    forced = os.environ.get("TILEWORK_VECTOR_REGISTERS", "")
    if forced:
        width, _, count = forced.partition("x")
        return VectorRegisters(int(width), int(count))
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
        flags = set(line.split(":", 1)[-1].split())
    except OSError:
        pass
    if "avx512f" in flags:
        return VectorRegisters(64, 32)
    if "avx" in flags:
        return VectorRegisters(32, 16)
    if "asimd" in flags:
        return VectorRegisters(16, 32)
    if not flags:  # no /proc/cpuinfo: the 64-byte vectors the other rules assume
        return VectorRegisters(VECTOR_BYTES, 32)
    return VectorRegisters(16, 16)


@functools.lru_cache(maxsize=1)
def host_threads() -> int:
    """The CPUs this process may run on: the threads a parallel kernel gets by default."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def lanes(dtype: str) -> int:
    """How many elements of ``dtype`` fill one vector register."""
    return max(1, VECTOR_BYTES // (DTYPE_TABLE[dtype].itemsize if dtype in DTYPE_TABLE else 4))


def attempt(func: TensorFunc, prim: Callable[..., TensorFunc], *args: object) -> TensorFunc:
    """``prim(func, *args)``, or ``func`` unchanged when the primitive refuses."""
    try:
        return prim(func, *args)
    except ScheduleError:
        return func


def top_nests(func: TensorFunc, branches: bool = False) -> list[For]:
    """The outermost loops of ``func``, in order (under allocations and sequences; with
    ``branches`` also under top-level tests, e.g. a hand-built kernel's copies chosen at run
    time)."""
    out: list[For] = []

    def go(s: Stmt) -> None:
        if isinstance(s, For):
            out.append(s)
        elif isinstance(s, Allocate):
            go(s.body)
        elif isinstance(s, SeqStmt):
            for c in s.stmts:
                go(c)
        elif branches and isinstance(s, IfThenElse):
            go(s.then_body)
            if s.else_body is not None:
                go(s.else_body)

    go(func.body)
    return out


def chain(f: For) -> list[For]:
    """``f`` and the loops perfectly nested in it, outermost first."""
    out = [f]
    while isinstance(out[-1].body, For):
        out.append(out[-1].body)
    return out


def leaf_of(f: For) -> Stmt:
    """What the perfect nest starting at ``f`` ends in, through guards."""
    s: Stmt = chain(f)[-1].body
    while isinstance(s, IfThenElse) and s.else_body is None:
        s = s.then_body
    return s


def path_of(func: TensorFunc, f: For) -> Path:
    return next(p for p, s in walk(func.body) if s is f)


def loop(func: TensorFunc, var: SymVar) -> For:
    return find_loop(func, var)[1]


def independent(func: TensorFunc, var: SymVar) -> bool:
    return dependence_of(loop(func, var)).kind == INDEPENDENT


def new_blocks(before: TensorFunc, after: TensorFunc) -> list[str]:
    """Names of the blocks ``after`` has that ``before`` has not."""
    old = block_names(before)
    return sorted(block_names(after) - old)


def block_loops(func: TensorFunc, name: str) -> list[For]:
    """The loops around block ``name``, outermost first."""
    for p, s in walk(func.body):
        if isinstance(s, Block) and s.name == name:
            return [a for a in (get_at(func.body, p[:k]) for k in range(len(p))) if isinstance(a, For)]
    raise ScheduleError(f"no block {name!r}")


def worth_parallel(extents: list[Dim]) -> bool:
    """Whether a nest with these extents has enough iterations to pay for threads."""
    total = sym.product(extents)
    return not isinstance(total, int) or total >= MIN_PARALLEL_WORK


def vectorize_innermost(func: TensorFunc, var: SymVar) -> TensorFunc:
    """Vectorize loop ``var`` when it is innermost and independent."""
    return attempt(func, lp.vectorize, var)


def spatial_nest(func: TensorFunc, top: For, dtype: str) -> TensorFunc:
    """Fuse the outer loops of the perfect nest at ``top`` and run them in parallel; vectorize
    the innermost loop. A single loop is split so that both can happen. Loops that carry a
    dependence are left alone."""
    ch = chain(top)
    if any(f.kind != "serial" for f in ch):
        return func
    n_work = [f.extent for f in ch]
    if len(ch) == 1:
        if sym.prove_le(ch[0].extent, lanes(dtype)):
            return vectorize_innermost(func, ch[0].var)
        try:
            func, (outer, inner) = lp.split_vars(func, ch[0].var, [None, lanes(dtype) * 4])
        except ScheduleError:
            return func
        outers, inner_var = [outer], inner
    else:
        outers, inner_var = [f.var for f in ch[:-1]], ch[-1].var
        across = _transposed_loop(ch)
        if across is not None:  # a transpose: cache-sized tiles of both loops
            p = path_of(func, ch[0])
            try:
                func = lp.tile(func, [across.var, inner_var], [TRANSPOSE_TILE, TRANSPOSE_TILE])
            except ScheduleError:
                return func
            top_now = get_at(func.body, p)
            assert isinstance(top_now, For)
            tiled = chain(top_now)  # ..., across_0, inner_0, across_1, inner_1
            outers, inner_var = [f.var for f in tiled[:-2]], tiled[-1].var
    # Only a prefix of independent loops can be fused and parallelized.
    k = 0
    while k < len(outers) and independent(func, outers[k]):
        k += 1
    inner_extent = loop(func, inner_var).extent
    short = isinstance(inner_extent, int) and inner_extent < SHORT_INNER_VECTORS * lanes(dtype)
    par = _parallel_prefix(func, outers[:k]) if short else outers[:k]
    func = vectorize_innermost(func, inner_var)
    if par and worth_parallel(n_work):
        if len(par) > 1:
            p = path_of(func, loop(func, par[0]))
            func = attempt(func, lp.fuse, *par)
            par_loop = get_at(func.body, p)
            assert isinstance(par_loop, For)
            func = attempt(func, lp.parallel, par_loop.var)
        else:
            func = attempt(func, lp.parallel, par[0])
    return func


PARALLEL_ITERATIONS_PER_THREAD = 32  # a short-innermost nest's parallel loop: at least this many iterations a thread
SHORT_INNER_VECTORS = 2  # an innermost loop shorter than this many vectors is short


def _parallel_prefix(func: TensorFunc, loops: list[SymVar]) -> list[SymVar]:
    """For a nest whose innermost loop is short: the outer ``loops`` to fuse into the parallel
    loop, the shortest prefix whose iterations (a symbolic extent at its lower bound) give every
    thread ``PARALLEL_ITERATIONS_PER_THREAD``; the rest stay nested inside it, so that their
    indices are counted, not recomputed by a division and a remainder for every few elements
    (im2col's 9-float runs ran 7x slower fused)."""
    want, total = PARALLEL_ITERATIONS_PER_THREAD * host_threads(), 1
    for i, v in enumerate(loops):
        e = loop(func, v).extent
        lo = e if isinstance(e, int) else sym.bounds(e)[0]
        total *= max(lo or 1, 1)
        if total >= want:
            return loops[: i + 1]
    return loops


def _transposed_loop(ch: list[For]) -> For | None:
    """The outer loop of the nest along which a load of its block walks memory contiguously
    while the innermost loop does not (a transpose), or None. A load the innermost loop does
    not move (a per-channel bias or scale, ``b[c]``) is a broadcast scalar, not a transpose."""
    leaf = leaf_of(ch[0])
    if not isinstance(leaf, Block) or not isinstance(leaf.body, Store):
        return None
    inner = ch[-1].var
    binds = {iv.var: iv.binding for iv in leaf.iter_vars}
    for ld in loads_of(leaf.body.value):
        if not ld.indices:
            continue
        last = subst_scalar(ld.indices[-1], binds)
        if not isinstance(last, (int, sym.SymExpr)) or inner in dim_vars(last):
            continue
        rest = [subst_scalar(i, binds) for i in ld.indices[:-1]]
        if all(isinstance(i, (int, sym.SymExpr)) and inner not in dim_vars(i) for i in rest):
            continue  # invariant along the innermost loop
        for f in ch[:-1]:
            if _unit_stride(last, f.var):
                return f
    return None


def _unit_stride(e: Dim, v: SymVar) -> bool:
    if v not in dim_vars(e):
        return False
    base = sym_walk.substitute(e, {v: 0})
    return sym.prove_eq(sym.sub(sym_walk.substitute(e, {v: 1}), base), 1)


def out_dtype(func: TensorFunc) -> str:
    outs = func.outputs
    return outs[0].dtype if outs else "float32"


def parallel_rows(func: TensorFunc, top: For) -> TensorFunc:
    """Fuse the serial, independent loops at the top of the nest ``top`` (its rows) and run
    them in parallel. Rows whose extents are static and few are left serial."""
    rows: list[SymVar] = []
    for f in chain(top):
        if f.kind != "serial" or not independent(func, f.var):
            break
        rows.append(f.var)
    if not rows or not worth_parallel([loop(func, v).extent for v in rows] + [ROW_WORK]):
        return func
    if len(rows) > 1:
        p = path_of(func, loop(func, rows[0]))
        func = attempt(func, lp.fuse, *rows)
        fused = get_at(func.body, p)
        assert isinstance(fused, For)
        rows = [fused.var]
    return attempt(func, lp.parallel, rows[0])
