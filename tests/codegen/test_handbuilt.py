"""Hand-written TensorFuncs (the shapes schedules produce): parallel, vectorized and unrolled
loops, split loops with guards, Allocate on the stack and the heap, reductions whose init is
hoisted or guarded, floor division with negative operands. Each runs through the interpreter
and compiled C and is compared with NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tilework.codegen import CKernelModule, build_library, interp
from tilework.codegen.c import emit_function
from tilework.ir import sym
from tilework.ir.loop import (
    Allocate,
    Block,
    Buffer,
    For,
    IfThenElse,
    IterVar,
    Load,
    SeqStmt,
    Stmt,
    Store,
    TensorFunc,
    binary,
    const,
    convert,
)
from tilework.ir.sym import Dim, SymVar


def make_block(name: str, specs: list[tuple[str, Dim, Dim, str]], make_body, make_init=None) -> Block:  # type: ignore[no-untyped-def]
    ivs = [IterVar(SymVar(n, 0), ext, kind, binding) for n, ext, binding, kind in specs]
    vs = [iv.var for iv in ivs]
    body = make_body(*vs)
    init = make_init(*vs) if make_init is not None else None
    reads = tuple({e.buffer: None for e in _loads(body, init)})
    writes = tuple({s.buffer: None for s in _stores(body, init)})
    return Block(name, tuple(ivs), reads, writes, body, init)


def _stores(*stmts: Stmt | None) -> list[Store]:
    from tilework.ir.loop import walk_stmts

    return [s for st in stmts if st is not None for s in walk_stmts(st) if isinstance(s, Store)]


def _loads(*stmts: Stmt | None) -> list[Load]:
    from tilework.ir.loop import walk_scalars

    out = []
    for s in _stores(*stmts):
        for x in (*s.indices, s.value):
            out += [e for e in walk_scalars(x) if isinstance(e, Load)]
    return out


def scheduled_elementwise() -> TensorFunc:
    """B[i, j] = tmp[15 - j] + 1 with tmp[j] = A[i, j] * 2 in stack scratch per row; rows in a
    parallel loop; also C[i] = A[i, 0] * 3 through a split, guarded, vectorized loop."""
    n = tw.dim("n")
    A, B, C = Buffer("A", (n, 16), "float32"), Buffer("B", (n, 16), "float32"), Buffer("C", (n,), "float32")
    tmp = Buffer("tmp", (16,), "float32")
    i, j, j2, io, ii = SymVar("i", 0), SymVar("j", 0, 15), SymVar("j2", 0, 15), SymVar("io", 0), SymVar("ii", 0, 3)
    fill = make_block("t", [("vj", 16, j, "spatial")], lambda vj: Store(tmp, (vj,), binary("*", Load(A, (i, vj)), 2)))
    use = make_block("o", [("vi", n, i, "spatial"), ("vj", 16, j2, "spatial")],
                     lambda vi, vj: Store(B, (vi, vj), binary("+", Load(tmp, (15 - vj,)), 1)))
    row = Allocate(tmp, SeqStmt((For(j, 16, fill, "vectorized"), For(j2, 16, use, "unrolled"))))
    rows = For(i, n, row, "parallel")
    guarded = make_block("c", [("vi", n, io * 4 + ii, "spatial")], lambda vi: Store(C, (vi,), binary("*", Load(A, (vi, 0)), 3)))
    split = For(io, sym.ceildiv(n, 4), For(ii, 4, IfThenElse(binary("<", io * 4 + ii, n), guarded), "vectorized"), "parallel")
    return TensorFunc((A, B, C), SeqStmt((rows, split)), 2)


def heap_scratch() -> TensorFunc:
    """out[i] = sum_j s[j] * A[i] where s[j] = j + 1 lives in heap scratch of size m, filled
    inside a parallel loop (one heap allocation per iteration)."""
    n, m = tw.dim("n"), tw.dim("m")
    A, out = Buffer("A", (n,), "float64"), Buffer("out", (n,), "float64")
    s = Buffer("s", (m,), "float64")
    i, j, k = SymVar("i", 0), SymVar("j", 0), SymVar("k", 0)
    fill = make_block("fill", [("vj", m, j, "spatial")], lambda vj: Store(s, (vj,), binary("+", convert(vj, "float64"), 1.0)))
    acc = make_block("acc", [("vi", n, i, "spatial"), ("vk", m, k, "reduce")],
                     lambda vi, vk: Store(out, (vi,), binary("+", Load(out, (vi,)), binary("*", Load(s, (vk,)), Load(A, (vi,))))),
                     lambda vi, vk: Store(out, (vi,), const(0.0, "float64")))
    body = For(i, n, Allocate(s, SeqStmt((For(j, m, fill), For(k, m, acc)))), "parallel")
    return TensorFunc((A, out, m), body, 1)


def split_reduction(hoistable: bool, parallel_k: bool = False, k_min: int = 0) -> TensorFunc:
    """C[i, j] = sum_k A[i, k] * B[k, j] with k split into ko * 4 + ki. Hoistable order:
    i, j, ko, ki; otherwise i, ko, j, ki (the init must stay guarded in the block)."""
    n, m, K4 = tw.dim("n"), tw.dim("m"), tw.dim("K4", k_min)
    A, B, C = Buffer("A", (n, K4 * 4), "float32"), Buffer("B", (K4 * 4, m), "float32"), Buffer("C", (n, m), "float32")
    i, j, ko, ki = SymVar("i", 0), SymVar("j", 0), SymVar("ko", 0), SymVar("ki", 0, 3)
    blk = make_block(
        "C", [("vi", n, i, "spatial"), ("vj", m, j, "spatial"), ("vk", K4 * 4, ko * 4 + ki, "reduce")],
        lambda vi, vj, vk: Store(C, (vi, vj), binary("+", Load(C, (vi, vj)), binary("*", Load(A, (vi, vk)), Load(B, (vk, vj))))),
        lambda vi, vj, vk: Store(C, (vi, vj), const(0.0, "float32")),
    )
    kind = "parallel" if parallel_k else "serial"
    if hoistable:
        body = For(i, n, For(j, m, For(ko, K4, For(ki, 4, blk, "unrolled"), kind)))
    else:
        body = For(i, n, For(ko, K4, For(j, m, For(ki, 4, blk, "vectorized")), kind), "parallel")
    return TensorFunc((A, B, C, K4), body, 1)


def floor_ops() -> TensorFunc:
    """out[i, 0] = (i - c) // d, out[i, 1] = (i - c) % d, out[i, 2] = min(i - c, d) with sym
    params c, d of either sign."""
    n = tw.dim("n")
    c, d = SymVar("c", -50, 50), SymVar("d", -9, 9)
    out = Buffer("out", (n, 3), "int64")
    i = SymVar("i", 0)
    vals = [sym.floordiv(i - c, d), sym.floormod(i - c, d), sym.min_(i - c, d)]
    stores = SeqStmt(tuple(Store(out, (i, q), v) for q, v in enumerate(vals)))
    return TensorFunc((out, c, d), For(i, n, stores), 1)


def fused_parallel() -> TensorFunc:
    """B[i, j] = A[i, j] + j over one fused parallel loop f in [0, n * m): i = f // m, j = f % m."""
    n, m = tw.dim("n"), tw.dim("m")
    A, B = Buffer("A", (n, m), "float32"), Buffer("B", (n, m), "float32")
    f = SymVar("f", 0)
    blk = make_block("B", [("vi", n, f // m, "spatial"), ("vj", m, f % m, "spatial")],
                     lambda vi, vj: Store(B, (vi, vj), binary("+", Load(A, (vi, vj)), vj)))
    return TensorFunc((A, B), For(f, n * m, blk, "parallel"), 1)


def gathered_rows() -> TensorFunc:
    """out[i, j] = src[idx[i], j // 4, j % 4]: a row picked by a loaded index, read along its
    last two axes by one vectorized loop."""
    n, r = tw.dim("n"), tw.dim("r")
    src, idx, out = Buffer("src", (r, 2, 4), "float32"), Buffer("idx", (n,), "int32"), Buffer("out", (n, 8), "float32")
    i, j = SymVar("i", 0), SymVar("j", 0)
    value = Load(src, (convert(Load(idx, (i,)), "int64"), sym.floordiv(j, 4), sym.floormod(j, 4)))
    return TensorFunc((src, idx, out), For(i, n, For(j, 8, Store(out, (i, j), value), "vectorized")), 1)


FUNCS = {
    "gathered": gathered_rows(),
    "fused": fused_parallel(),
    "elementwise": scheduled_elementwise(),
    "heap": heap_scratch(),
    "red_hoist": split_reduction(True),
    "red_guard": split_reduction(False),
    "red_par_k": split_reduction(True, parallel_k=True),
    "floor_ops": floor_ops(),
}


@pytest.fixture(scope="module")
def lib() -> CKernelModule:
    return build_library(FUNCS)


def _both(lib: CKernelModule, name: str, inputs: list[np.ndarray], outputs: list[np.ndarray], params: dict | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    a = [o.copy() for o in outputs]
    b = [o.copy() for o in outputs]
    interp.run(FUNCS[name], [*inputs, *a], params)
    lib[name].run([*inputs, *b], params)
    return a, b


@pytest.mark.parametrize("n", [1, 7, 33, 130])
def test_scheduled_elementwise(lib: CKernelModule, n: int) -> None:
    a = np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)
    (bi, ci), (bc, cc) = _both(lib, "elementwise", [a], [np.zeros((n, 16), np.float32), np.zeros(n, np.float32)])
    want_b = (a * 2)[:, ::-1] + 1
    for got in (bi, bc):
        np.testing.assert_allclose(got, want_b, rtol=1e-6)
    for got in (ci, cc):
        np.testing.assert_allclose(got, a[:, 0] * 3, rtol=1e-6)


@pytest.mark.parametrize("n,m", [(1, 1), (7, 33), (130, 3)])
def test_fused_parallel_loop(lib: CKernelModule, n: int, m: int) -> None:
    a = np.random.default_rng(n).standard_normal((n, m)).astype(np.float32)
    for got in _both(lib, "fused", [a], [np.zeros((n, m), np.float32)]):
        np.testing.assert_allclose(got[0], a + np.arange(m, dtype=np.float32), rtol=1e-6)
    text = emit_function(FUNCS["fused"], "tw_x")
    assert "#pragma omp parallel" in text and "tw_shares_take(" in text and "(f / m)" in text and "(f % m)" in text


def test_scheduled_elementwise_pragmas() -> None:
    text = emit_function(FUNCS["elementwise"], "tw_x")
    assert text.count("#pragma omp parallel") == text.count("tw_shares_take(") == 2
    assert "#pragma omp simd" in text
    assert "#pragma GCC unroll 16" in text
    assert "float tmp[16] __attribute__((aligned(64)));" in text
    assert "((n + 3) / 4)" in text  # ceildiv with non-negative operands uses plain C division


@pytest.mark.parametrize("n,m", [(1, 1), (7, 5), (33, 130)])
def test_heap_scratch(lib: CKernelModule, n: int, m: int) -> None:
    a = np.random.default_rng(n).standard_normal(n)
    for got in _both(lib, "heap", [a], [np.zeros(n)], {"m": m}):
        np.testing.assert_allclose(got[0], a * (m * (m + 1) / 2), rtol=1e-12)
    assert "tw_alloc(" in emit_function(FUNCS["heap"], "tw_x")


@pytest.mark.parametrize("name", ["red_hoist", "red_guard", "red_par_k"])
@pytest.mark.parametrize("n,k4,m", [(1, 1, 1), (7, 3, 5), (33, 2, 17)])
def test_split_reduction(lib: CKernelModule, name: str, n: int, k4: int, m: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, 4 * k4)).astype(np.float32)
    b = rng.standard_normal((4 * k4, m)).astype(np.float32)
    for got in _both(lib, name, [a, b], [np.full((n, m), 5.0, np.float32)], {"K4": k4}):
        np.testing.assert_allclose(got[0], a @ b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["red_hoist", "red_guard"])
def test_empty_reduction_follows_block_semantics(lib: CKernelModule, name: str) -> None:
    """With zero reduction iterations the init still runs (block semantics): both targets
    give the sum over an empty axis, 0, in either loop order."""
    a, b = np.zeros((3, 0), np.float32), np.zeros((0, 2), np.float32)
    gi, gc = _both(lib, name, [a, b], [np.full((3, 2), 5.0, np.float32)], {"K4": 0})
    np.testing.assert_array_equal(gi[0], np.zeros((3, 2), np.float32))
    np.testing.assert_array_equal(gc[0], gi[0])


def test_init_placement_in_c() -> None:
    for name in ("red_hoist", "red_guard"):  # K4 may be 0: the init leaves the reduce loops
        text = emit_function(FUNCS[name], "tw_x")
        assert "block C_init" in text and "== 0) {" not in text, name
    hoisted = emit_function(split_reduction(True, k_min=1), "tw_x")  # K4 >= 1: left to C
    guarded = emit_function(split_reduction(False, k_min=1), "tw_x")
    assert "/* init of block C */" in hoisted and "== 0) {" not in hoisted
    assert "/* init of block C */" not in guarded
    assert "if (vk == 0) {" in guarded


def test_offset_after_a_loaded_index_is_one_linear_term(lib: CKernelModule) -> None:
    """The symbolic indices after a loaded one are one offset, where ``4 * (j // 4) + j % 4``
    is ``j`` (a contiguous vector load, not a gather)."""
    src = np.random.default_rng(0).standard_normal((5, 2, 4)).astype(np.float32)
    idx = np.array([4, 0, 2, 2, 1, 3, 0], np.int32)
    for got in _both(lib, "gathered", [src, idx], [np.zeros((7, 8), np.float32)]):
        np.testing.assert_array_equal(got[0], src[idx].reshape(7, 8))
    text = emit_function(FUNCS["gathered"], "tw_x")
    assert "src[((int64_t)((int64_t)(idx[i])) * 8 + j)]" in text


def test_parallel_reduction_loop_is_emitted_serial() -> None:
    text = emit_function(FUNCS["red_par_k"], "tw_x")
    assert "#pragma omp parallel" not in text
    assert "parallel loop emitted serial: every iteration writes the same element of C" in text


@pytest.mark.parametrize("c,d", [(5, 3), (5, -3), (-7, 4), (0, -1), (13, 9), (-50, -9)])
def test_floor_division_negative(lib: CKernelModule, c: int, d: int) -> None:
    n = 20
    i = np.arange(n)
    want = np.stack([(i - c) // d, (i - c) % d, np.minimum(i - c, d)], axis=1)
    for got in _both(lib, "floor_ops", [], [np.zeros((n, 3), np.int64)], {"c": c, "d": d}):
        np.testing.assert_array_equal(got[0], want)
    text = emit_function(FUNCS["floor_ops"], "tw_x")
    assert "tw_floordiv(" in text and "tw_floormod(" in text


def test_kernel_abi_direct_call(lib: CKernelModule) -> None:
    """The fast path takes the kernel sym values in ABI order: shape vars, then sym params."""
    k = lib["floor_ops"]
    assert k.info.syms == ("n", "c", "d")
    out = np.zeros((4, 3), np.int64)
    k([out], [4, 1, 2])
    np.testing.assert_array_equal(out[:, 0], (np.arange(4) - 1) // 2)


def test_failed_scratch_allocation_is_a_memory_error(lib: CKernelModule) -> None:
    out = np.zeros(1)
    with pytest.raises(MemoryError, match="scratch memory could not be allocated"):
        lib["heap"]([np.ones(1), out], [1, 1 << 58])


def test_fast_path_accepts_array_subclasses_and_views(lib: CKernelModule) -> None:
    class Sub(np.ndarray):
        pass

    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.zeros((2, 16), np.float32).view(Sub)
    c = np.zeros(4, np.float32)[1:3]  # a contiguous view with an offset data pointer
    lib["elementwise"]([a, b, c], [2])
    np.testing.assert_allclose(np.asarray(b), (a * 2)[:, ::-1] + 1)
    np.testing.assert_allclose(c, a[:, 0] * 3)


def _parallel_map(name: str, fn) -> TensorFunc:  # type: ignore[no-untyped-def]
    """``out[i] = fn(a[i])`` over a symbolic ``n`` in one parallel loop."""
    n = SymVar("n", 0)
    a, out = Buffer("a", (n,), "float32"), Buffer("out", (n,), "float32")
    i = SymVar("i", 0)
    body = make_block(name, [("vi", n, i, "spatial")], lambda vi: Store(out, (vi,), fn(Load(a, (vi,)))))
    return TensorFunc((a, out, n), For(i, n, body, "parallel"), 1)


def test_a_costly_intrinsic_weighs_on_the_parallel_threshold() -> None:
    """A loop of exps forks at fewer elements than a loop of adds: each exp counts
    COSTLY_WORK more towards the work compared with TW_PARALLEL_MIN_WORK."""
    from tilework.codegen.c.parallel import COSTLY_WORK
    from tilework.ir.loop import Intrin

    cheap = emit_function(_parallel_map("add1", lambda x: binary("+", x, const(1.0, "float32"))), "tw_cheap")
    costly = emit_function(_parallel_map("exp", lambda x: Intrin("exp", (x,), "float32")), "tw_costly")
    assert "if(n >= TW_PARALLEL_MIN_WORK)" in cheap
    assert f"if(({1 + COSTLY_WORK} * n) >= TW_PARALLEL_MIN_WORK)" in costly


def _parallel_taps(name: str, taps: int) -> TensorFunc:
    """``out[i] = sum_t a[i + t]`` for ``taps`` taps in one expression (a depthwise conv's
    shape of statement), over a symbolic ``n`` in one parallel loop."""
    n = SymVar("n", 0)
    a, out = Buffer("a", (sym.add(n, taps - 1),), "float32"), Buffer("out", (n,), "float32")
    i = SymVar("i", 0)

    def total(vi: SymVar):  # type: ignore[no-untyped-def]
        acc = Load(a, (vi,))
        for t in range(1, taps):
            acc = binary("+", acc, Load(a, (sym.add(vi, t),)))
        return acc

    body = make_block(name, [("vi", n, i, "spatial")], lambda vi: Store(out, (vi,), total(vi)))
    return TensorFunc((a, out, n), For(i, n, body, "parallel"), 1)


def test_a_statement_of_many_loads_weighs_on_the_parallel_threshold() -> None:
    """A statement reading 25 elements (a 5x5 depthwise conv's taps) counts one per
    LOADS_PER_WORK loads towards the work, so it forks at fewer outputs than a copy; up to
    3 loads count one, as a copy does. The values are the sums at any n."""
    from tilework.codegen.c.parallel import LOADS_PER_WORK

    assert "if(n >= TW_PARALLEL_MIN_WORK)" in emit_function(_parallel_taps("taps3", 3), "tw_taps3")
    assert f"if(({25 // LOADS_PER_WORK} * n) >= TW_PARALLEL_MIN_WORK)" in emit_function(_parallel_taps("taps25", 25), "tw_taps25")
    lib = build_library({"taps25": _parallel_taps("taps25", 25)})
    for n in (0, 1, 7, 20001):
        a = np.random.default_rng(n).standard_normal(n + 24).astype(np.float32)
        out = np.zeros(n, np.float32)
        lib["taps25"].run([a, out], {"n": n})
        np.testing.assert_allclose(out, np.convolve(a, np.ones(25, np.float32), "valid") if n else out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [0, 1, 7, 9000, 20001])  # 9000 exps fork, 9000 adds do not
def test_a_parallel_loop_of_exps_computes_exp(n: int) -> None:
    from tilework.ir.loop import Intrin

    lib = build_library({"pexp": _parallel_map("exp", lambda x: Intrin("exp", (x,), "float32"))})
    a = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    out = np.zeros(n, np.float32)
    lib["pexp"].run([a, out], {"n": n})
    np.testing.assert_allclose(out, np.exp(a), rtol=2e-6)


def test_prefetch_hints_name_their_cache_level() -> None:
    """``prefetch`` hints into L1 (locality 3, x86 prefetcht0), ``prefetch_l2`` into L2
    (locality 2, prefetcht1); both take the load's address, perform no load, and leave the
    values alone (compiled and interpreted)."""
    from tilework.ir.loop import Intrin

    n = SymVar("n", 1)
    x, y = Buffer("x", (n,), "float32"), Buffer("y", (n,), "float32")
    i = SymVar("i", 0)
    ahead = sym.min_(sym.add(i, 16), sym.sub(n, 1))
    hints = [Intrin(name, (Load(x, (ahead,)),), "float32") for name in ("prefetch", "prefetch_l2")]
    value = binary("+", binary("+", Load(x, (i,)), hints[0]), hints[1])  # each hint's value is 0
    func = TensorFunc((x, y), For(i, n, Store(y, (i,), value), "serial"), 1)
    text = emit_function(func, "tw_x")
    assert "__builtin_prefetch(&x[" in text and ", 0, 3)" in text and ", 0, 2)" in text
    a = np.arange(37, dtype=np.float32)
    for run in (build_library({"hinted": func})["hinted"].run, lambda arrays: interp.run(func, arrays)):
        out = np.full_like(a, np.nan)
        run([a, out])
        np.testing.assert_array_equal(out, a)


def _dot_func(vectorized: bool = True, form: str = "rows") -> TensorFunc:
    """``acc[r, j] += sum_p a[r, p, 0, j] * b[p, 0] + a[r, p, 1, j] * b[p, 1]`` over pairs ``p``
    by ``dot_bf16x2``: ``j`` (lanes, 32 of them) the vectorized loop, ``a``'s two rows of a pair
    contiguous in ``j`` (``pairs``: ``a[r, p, j, 0]``, ``a[r, p, j, 1]``, a pair's two side by
    side; ``round``: float32 rows rounded to bfloat16 as they are read), ``b``'s pair shared by
    the lanes (a decode attention's keys and query)."""
    from tilework.ir.loop import Cast
    from tilework.ir.loop import DOT_BF16X2, Intrin

    rows, pairs = SymVar("rows", 0), SymVar("pairs", 0)
    a = Buffer("a", (rows, pairs, 32, 2) if form == "pairs" else (rows, pairs, 2, 32), "float32" if form == "round" else "bfloat16")
    b = Buffer("b", (pairs, 2), "bfloat16")
    acc = Buffer("acc", (rows, 32), "float32")
    r, p, j = SymVar("r", 0), SymVar("p", 0), SymVar("j", 0)
    a0, a1 = (Load(a, (r, p, j, 0)), Load(a, (r, p, j, 1))) if form == "pairs" else (Load(a, (r, p, 0, j)), Load(a, (r, p, 1, j)))
    if form == "round":
        a0, a1 = Cast("bfloat16", a0), Cast("bfloat16", a1)
    dot = Intrin(DOT_BF16X2, (Load(acc, (r, j)), a0, a1, Load(b, (p, 0)), Load(b, (p, 1))), "float32")
    lanes = For(j, 32, Block("dot", (), (acc, a, b), (acc,), Store(acc, (r, j), dot)), "vectorized" if vectorized else "serial")
    return TensorFunc((a, b, acc), For(r, rows, For(p, pairs, lanes, "serial"), "parallel"), 2)


@pytest.mark.parametrize("form", ["rows", "pairs", "round"])
@pytest.mark.parametrize("rows,pairs", [(0, 3), (1, 0), (1, 1), (3, 7), (5, 32)])
def test_dot_bf16x2_pairs(rows: int, pairs: int, form: str) -> None:
    """``dot_bf16x2``: compiled (one ``vdpbf16ps`` a 16 lanes where the compiler targets AVX-512
    BF16, the portable float32 loop elsewhere) and interpreted, against NumPy's float32 of the
    same two roundings; the vectorized loop emits both forms (two rows interleaved in registers,
    pairs loaded as they are, or float32 rows rounded and interleaved)."""
    from tilework.ir.dtype import np_dtype

    func = _dot_func(form=form)
    text = emit_function(func, "tw_x")
    portable = "tw_pair_at(" if form == "pairs" else "tw_dot_bf16x2("  # pairs read as 32-bit words
    assert "_mm512_dpbf16_ps(" in text and portable in text and "#if defined(TW_DOT_BF16)" in text
    assert {"rows": "tw_bf16_pairs(", "pairs": "_mm512_loadu_si512(", "round": "tw_f32_pairs("}[form] in text
    assert "_mm512_dpbf16_ps(" not in emit_function(_dot_func(vectorized=False), "tw_x")
    rng = np.random.default_rng(rows * 100 + pairs)
    bf = np_dtype("bfloat16")
    a32 = rng.standard_normal((rows, pairs, 2, 32)).astype(np.float32)
    a = a32.astype(bf)
    b = rng.standard_normal((pairs, 2)).astype(bf)
    start = rng.standard_normal((rows, 32)).astype(np.float32)
    want = start.copy()
    af, bf32 = a.astype(np.float32), b.astype(np.float32)
    for p in range(pairs):  # the odd product first, each addition rounded to float32
        want = (want + af[:, p, 1] * bf32[p, 1]) + af[:, p, 0] * bf32[p, 0]
    given = {"rows": a, "pairs": np.ascontiguousarray(a.transpose(0, 1, 3, 2)), "round": a32}[form]
    for run in (build_library({"dot": func})["dot"].run, lambda arrays, syms=None: interp.run(func, arrays)):
        out = start.copy()
        run([given, b, out])
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


def test_dot_bf16x2_needs_bfloat16_pairs() -> None:
    """The verifier names a ``dot_bf16x2`` whose operands are not bfloat16."""
    from tilework.errors import WellFormedError
    from tilework.ir.loop import DOT_BF16X2, Intrin
    from tilework.ir.module import IRModule
    from tilework.ir.verify import verify

    n = SymVar("n", 0)
    x, y = Buffer("x", (n,), "float32"), Buffer("y", (n,), "float32")
    i = SymVar("i", 0)
    dot = Intrin(DOT_BF16X2, (Load(y, (i,)), Load(x, (i,)), Load(x, (i,)), Load(x, (i,)), Load(x, (i,))), "float32")
    with pytest.raises(WellFormedError, match="dot_bf16x2 takes a float32 accumulator and four bfloat16"):
        verify(IRModule({"f": TensorFunc((x, y), For(i, n, Store(y, (i,), dot), "serial"), 1)}))

