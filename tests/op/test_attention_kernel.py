"""The hand-built attention kernel (``tilework.op.attention_kernel``) against float64 NumPy
(and torch's SDPA where torch is installed), at many values of its symbolic dims: one query
and one key, lengths that leave partial query blocks (16 rows) and key blocks (32 keys) or
stop inside one key tile (8 keys: 7, 8, 9, 40),
causal masks with more queries than keys (rows that see nothing give zeros), grouped and
multi-query KV heads whose group does not divide a block, bool and float masks (also masking
whole rows), head dims below, between and beyond the 8-column value tiles, a symbolic head
dim, float64, float16 and bfloat16 (tasks of up to 8 rows run in the kernel's narrow copy, more
in its wide one). Also: its scratch does not grow with the sequence lengths, and the
``attention`` schedule rule keeps its loop kinds.

Only in the long tier (the module is built without them otherwise): ``mha_causal`` (causal
masks run grouped, ``gqa_causal``, and with a mask, ``float_mask_heads``), ``bool_mask_causal``
(a bool mask and a causal one run apart and a float mask with causal), ``float_mask_keys``
(float masks run broadcast over the batch, ``float_mask_heads``, and per row,
``float_mask_rows``) and ``float16`` (the low-precision path runs in ``bfloat16``), and the values of
``test_register_tiles_fit_the_vector_width[64]`` (the kernels built here by hand have 64-byte
registers)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.long import LONG
from tests.op.legalize_harness import Built, Case, build, check, envs, random_array, run, shape_at, tiered
from tests.op.test_legalize_nn import attention_ref
from tilework.codegen import build_library, interp
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.info import TensorInfo
from tilework.ir.loop import Allocate, For, TensorFunc, walk_stmts
from tilework.ir.sym import SymVar
from tilework.op.attention_kernel import MAX_SPLITS, MIN_SPLIT_BLOCKS, TASKS, attention_kernel
from tilework.schedule import default_schedule

b, s, kv, d = tw.dim("b"), tw.dim("s"), tw.dim("kv"), tw.dim("d")
SEQS = envs(
    {b: 1, s: 1, kv: 1},
    {b: 1, s: 1, kv: 513},  # decoding: one query, keys past a whole block
    {b: 2, s: 7, kv: 33},
    {b: 1, s: 33, kv: 33},
    {b: 1, s: 130, kv: 130},
    {b: 1, s: 8, kv: 8},  # short sequences: the last key block stops at its last tile of keys
    {b: 1, s: 9, kv: 9},
    {b: 2, s: 7, kv: 40},
)
CAUSAL_SEQS = [*SEQS, *envs({b: 1, s: 40, kv: 9}, {b: 1, s: 17, kv: 1})]  # more queries than keys


def T(*shape: Any, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(tuple(shape), dtype)


def _case(name: str, infos: list[TensorInfo], env_list: Any = SEQS, tol: float | None = 1e-4, mask: bool = False, **attrs: Any) -> Case:
    def make(*args: Any) -> Any:
        return op.attention(args[0], args[1], args[2], mask=args[3] if mask else None, **attrs)

    def ref(*arrays: np.ndarray) -> np.ndarray:
        return attention_ref(arrays[0], arrays[1], arrays[2], mask=arrays[3] if mask else None, **attrs)

    return Case(f"attn_{name}", make, infos, ref, env_list, tol=tol)


def _masked_rows(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
    """q, k, v and a float mask with -inf over every key of the second query."""
    q = random_array(shape_at((b, s, 4, 16), env), "float32", rng)
    k = random_array(shape_at((b, kv, 2, 16), env), "float32", rng)
    v = random_array(shape_at((b, kv, 2, 16), env), "float32", rng)
    m = (rng.standard_normal(shape_at((b, 1, s, kv), env)) * 3).astype(np.float32)
    if m.shape[2] > 1:
        m[:, :, 1, :] = -np.inf
    return [q, k, v, m]


CASES = [
    _case("mha", [T(b, s, 4, 16), T(b, kv, 4, 16), T(b, kv, 4, 16)]),
    _case("mha_causal", [T(b, s, 4, 16), T(b, kv, 4, 16), T(b, kv, 4, 16)], CAUSAL_SEQS, causal=True),
    _case("gqa_causal", [T(b, s, 8, 32), T(b, kv, 2, 32), T(b, kv, 2, 32)], CAUSAL_SEQS, causal=True),
    _case("mqa_group6", [T(b, s, 6, 12), T(b, kv, 1, 12), T(b, kv, 1, 12)], CAUSAL_SEQS, causal=True),
    _case("head_dim_3_values_5", [T(b, s, 2, 3), T(b, kv, 2, 3), T(b, kv, 2, 5)], scale=0.7),
    _case("head_dim_72", [T(b, s, 2, 72), T(b, kv, 1, 72), T(b, kv, 1, 72)], causal=True),
    _case("sym_head_dim", [T(b, s, 2, d), T(b, kv, 2, d), T(b, kv, 2, d)], envs({b: 1, s: 1, kv: 1, d: 1}, {b: 2, s: 19, kv: 40, d: 9}, {b: 1, s: 33, kv: 65, d: 64})),
    _case("bool_mask", [T(b, s, 4, 16), T(b, kv, 2, 16), T(b, kv, 2, 16), T(b, 1, s, kv, dtype="bool")], mask=True),
    # a padding mask: the same for every row of a task, one bias a key (``key_biases``)
    _case("bool_padding_mask", [T(b, s, 4, 16), T(b, kv, 2, 16), T(b, kv, 2, 16), T(b, 1, 1, kv, dtype="bool")], mask=True),
    _case("bool_mask_causal", [T(b, s, 4, 16), T(b, kv, 4, 16), T(b, kv, 4, 16), T(s, kv, dtype="bool")], CAUSAL_SEQS, mask=True, causal=True),
    _case("float_mask_keys", [T(b, s, 4, 16), T(b, kv, 4, 16), T(b, kv, 4, 16), T(b, 1, 1, kv)], mask=True),
    _case("float_mask_heads", [T(b, s, 4, 16), T(b, kv, 2, 16), T(b, kv, 2, 16), T(4, s, kv)], CAUSAL_SEQS, mask=True, causal=True),
    _case("float64", [T(b, s, 3, 8, dtype="float64"), T(b, kv, 3, 8, dtype="float64"), T(b, kv, 3, 8, dtype="float64")], CAUSAL_SEQS, tol=1e-10, causal=True),
    _case("float16", [T(b, s, 4, 16, dtype="float16"), T(b, kv, 2, 16, dtype="float16"), T(b, kv, 2, 16, dtype="float16")], CAUSAL_SEQS, tol=None, causal=True),
    _case("bfloat16", [T(b, s, 2, 16, dtype="bfloat16"), T(b, kv, 2, 16, dtype="bfloat16"), T(b, kv, 2, 16, dtype="bfloat16")], tol=None),
]
MASKED_ROWS = Case(
    "attn_float_mask_rows",
    lambda q, k, v, m: op.attention(q, k, v, mask=m),
    [T(b, s, 4, 16), T(b, kv, 2, 16), T(b, kv, 2, 16), T(b, 1, s, kv)],
    lambda q, k, v, m: attention_ref(q, k, v, mask=m),
    SEQS,
    inputs=_masked_rows,
    tol=1e-4,
)


# name: why the case runs only in the long tier
LONG_CASES = {
    "attn_mha_causal": "causal masks run grouped and with a float mask",
    "attn_bool_mask_causal": "bool masks and causal ones run apart and causal with a float mask",
    "attn_float16": "the low-precision path runs in bfloat16",
    "attn_float_mask_keys": "float masks broadcast over batch (float_mask_heads) and run per row (float_mask_rows)",
}
BUILT_CASES, CASE_PARAMS = tiered([*CASES, MASKED_ROWS], LONG_CASES)


@pytest.fixture(scope="module")
def built() -> Built:
    return build(BUILT_CASES)


@pytest.mark.parametrize("name", CASE_PARAMS)
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_a_row_masked_out_entirely_gives_zeros(built: Built) -> None:
    env = {b: 1, s: 5, kv: 37}
    _, (out,) = run(built, "attn_float_mask_rows", env)
    assert np.all(out[:, 1] == 0) and np.all(np.isfinite(out))


def test_causal_rows_without_keys_give_zeros(built: Built) -> None:
    env = {b: 1, s: 40, kv: 9}  # queries 0..30 see no key (end-aligned causal mask)
    _, (out,) = run(built, "attn_gqa_causal", env)
    assert np.all(out[:, :31] == 0) and np.all(out[:, 31:] != 0)


def test_matches_torch_sdpa() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra")
    F = torch.nn.functional
    kernel = _compiled("gqa", T(b, s, 8, 32), T(b, kv, 2, 32), causal=True)
    rng = np.random.default_rng(3)
    for sq, skv in ((1, 700), (70, 70), (5, 40)):
        q = rng.standard_normal((2, sq, 8, 32)).astype(np.float32)
        k = rng.standard_normal((2, skv, 2, 32)).astype(np.float32)
        v = rng.standard_normal((2, skv, 2, 32)).astype(np.float32)
        out = np.empty_like(q)
        kernel.run([q, k, v, out])
        visible = torch.from_numpy(np.arange(skv)[None, :] <= np.arange(sq)[:, None] + skv - sq)
        tq, tk, tv = (torch.from_numpy(a).transpose(1, 2) for a in (q, k, v))
        want = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=visible, enable_gqa=True).transpose(1, 2).numpy()
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def _compiled(name: str, q: TensorInfo, k: TensorInfo, causal: bool) -> Any:
    return build_library({name: default_schedule(_kernel(q, k, causal), strict=True)})[name]


def _kernel(q: TensorInfo, k: TensorInfo, causal: bool, mask: TensorInfo | None = None, vector_bytes: int = 64, v: TensorInfo | None = None) -> TensorFunc:
    from tilework.ir.loop import Buffer

    assert q.shape is not None and k.shape is not None
    bufs = [Buffer(n, i.shape, i.dtype) for n, i in (("q", q), ("k", k), ("v", v or k))]  # type: ignore[arg-type]
    m = None if mask is None else Buffer("mask", mask.shape, mask.dtype)  # type: ignore[arg-type]
    out = Buffer("out", (*q.shape[:3], bufs[2].shape[3]), q.dtype)  # type: ignore[arg-type]
    return attention_kernel(bufs[0], bufs[1], bufs[2], m, out, causal, None, vector_bytes)


@pytest.mark.parametrize("vector_bytes", [32, 64])
def test_register_tiles_fit_the_vector_width(vector_bytes: int) -> None:
    """The register tiles have as many rows as fill 8 registers: with 32-byte registers (AVX2)
    the wide copy's 16 float lanes take two a row, so its tiles have 4 rows, the narrow copy's 8;
    with 64-byte ones 8 and 8; the narrow copy's value tile is vectors of value columns. Both
    agree with the reference, at head dims that leave partial value tiles and key counts that
    stop inside a tile (64-byte registers' values in the long tier only: the other kernels this
    file builds by hand have them)."""
    f = _kernel(T(b, s, 6, 12), T(b, kv, 2, 12), True, vector_bytes=vector_bytes, v=T(b, kv, 2, 5))
    tiles = {st.buffer.shape for st in walk_stmts(f.body) if isinstance(st, Allocate) and st.buffer.name.startswith(("attention_st", "attention_at"))}
    assert tiles == ({(4, 16), (8, 8)} if vector_bytes == 32 else {(8, 16), (8, 8)})
    # the narrow copy adds its values by columns: one vector holds the 5 columns
    columns = {st.buffer.shape for st in walk_stmts(f.body) if isinstance(st, Allocate) and st.buffer.name.startswith("attention_av")}
    assert columns == {(1, vector_bytes // 4)}
    if vector_bytes == 64 and not LONG:
        return  # the 64-byte tiles' values: test_few_tasks_split_their_keys and test_matches_torch_sdpa
    kernel = build_library({"k": default_schedule(f, strict=True)})["k"]
    rng = np.random.default_rng(7)
    for nb, sq, skv in ((1, 1, 1), (1, 1, 45), (2, 5, 13), (1, 9, 70)):  # 3 rows (narrow), 15 and 27 (wide)
        q = rng.standard_normal((nb, sq, 6, 12)).astype(np.float32)
        k = rng.standard_normal((nb, skv, 2, 12)).astype(np.float32)
        v = rng.standard_normal((nb, skv, 2, 5)).astype(np.float32)
        out = np.full((nb, sq, 6, 5), np.nan, np.float32)
        kernel.run([q, k, v, out])
        np.testing.assert_allclose(out, attention_ref(q, k, v, causal=True), rtol=1e-4, atol=1e-5, err_msg=f"{(nb, sq, skv)}")


def test_scratch_does_not_grow_with_the_sequences() -> None:
    """No scratch depends on the batch or the sequences; a task's own fits L1 (the stack); the
    call's partial results of split tasks are ``TASKS`` rows whatever the shapes."""
    f = _kernel(T(b, s, 8, d), T(b, kv, 2, d), causal=True, mask=T(b, 1, s, kv))
    for st in walk_stmts(f.body):
        if isinstance(st, Allocate):
            grows = {v for dim in st.buffer.shape for v in sym_walk.free_vars(dim)} & {b, s, kv}
            assert not grows, f"scratch {st.buffer.name} has shape {st.buffer.shape}"
    allocs = [st.buffer for st in walk_stmts(_kernel(T(b, s, 8, 64), T(b, kv, 2, 64), True).body) if isinstance(st, Allocate)]
    sizes = [sym.product(buf.shape) for buf in allocs if not buf.name.startswith(("attention_pm", "attention_pl", "attention_pacc"))]
    assert all(isinstance(x, int) for x in sizes)
    assert 4 * sum(x for x in sizes if isinstance(x, int)) <= 32 * 1024  # a task's float32 scratch: L1, on the stack
    parts = {buf.shape for buf in allocs if buf.name.startswith("attention_pacc")}
    assert parts == {(TASKS, 64, 16), (TASKS, 64, 8)}


def test_the_attention_rule_keeps_the_kernel_schedule() -> None:
    f = _kernel(T(b, s, 8, 64), T(b, kv, 2, 64), causal=True)
    g = default_schedule(f, strict=True)
    assert g.attrs["schedule_rule"] == "attention"
    kinds = [st.kind for st in walk_stmts(g.body) if isinstance(st, For)]
    assert kinds == [st.kind for st in walk_stmts(f.body) if isinstance(st, For)]
    assert kinds[0] == "parallel" and kinds.count("parallel") == 4  # the copies for few rows and many, each with its merge of split tasks
    assert "vectorized" in kinds and "unrolled" in kinds


def test_few_rows_run_in_a_narrow_copy() -> None:
    """Tasks of at most ``NARROW_LANES`` rows (a decoding step's query heads of a kv head) run
    in a copy of the kernel that many lanes wide, picked at run time; rows known to be few or
    many build one copy."""
    from tilework.ir.loop import IfThenElse
    from tilework.op.attention_kernel import NARROW_LANES

    def lanes(f: TensorFunc) -> set[int]:
        return {st.buffer.shape[-1] for st in walk_stmts(f.body) if isinstance(st, Allocate) and st.buffer.name.startswith("attention_m")}  # type: ignore[misc]

    both = _kernel(T(b, s, 8, 64), T(b, kv, 2, 64), causal=True)
    assert isinstance(both.body, IfThenElse) and lanes(both) == {NARROW_LANES, 16}
    assert lanes(_kernel(T(b, 1, 8, 64), T(b, kv, 2, 64), causal=True)) == {NARROW_LANES}  # 4 rows
    assert lanes(_kernel(T(b, 3, 8, 64), T(b, kv, 2, 64), causal=True)) == {16}  # 12 rows


def test_interpreter_agrees() -> None:
    f = _kernel(T(b, s, 4, 8), T(b, kv, 2, 8), causal=True)
    rng = np.random.default_rng(5)
    for sq, skv in ((3, 35), (1, 300)):  # 300 keys of 2 tasks: split in 2
        q = rng.standard_normal((1, sq, 4, 8)).astype(np.float32)
        k = rng.standard_normal((1, skv, 2, 8)).astype(np.float32)
        v = rng.standard_normal((1, skv, 2, 8)).astype(np.float32)
        out = np.zeros_like(q)
        interp.run(f, [q, k, v, out])
        np.testing.assert_allclose(out, attention_ref(q, k, v, causal=True), rtol=1e-5, atol=1e-5)
        assert math.isfinite(float(out.sum()))


def test_few_tasks_split_their_keys() -> None:
    """A call of at most ``TASKS // 2`` tasks splits each task's key blocks into ranges
    (``splits``: by the tasks, by at least ``MIN_SPLIT_BLOCKS`` blocks a range, at most
    ``MAX_SPLITS``) and merges them: against the reference at 1 .. 7 ranges, with ranges every
    key of which a float mask hides from a row (its weight is 0) and a row that sees no key."""
    f = _kernel(T(b, s, 8, 32), T(b, kv, 2, 32), causal=False, mask=T(b, 1, s, kv))
    wide = f.body.else_body  # type: ignore[attr-defined]  # the copy for many rows
    narrow = f.body.then_body  # type: ignore[attr-defined]
    assert isinstance(wide, Allocate) and isinstance(narrow, Allocate)
    kernel = build_library({"k": default_schedule(f, strict=True)})["k"]
    rng = np.random.default_rng(9)
    # (b, s, kv): tasks = b * 2 kv heads (4 rows each: the narrow copy), blocks = ceil(kv / 32)
    for nb, sq, skv, splits in ((1, 1, 700, 5), (1, 1, 1000, 7), (3, 1, 300, 2), (1, 1, 127, 1), (4, 1, 900, 1), (1, 3, 2000, 7), (1, 5, 600, 3)):
        rows = 4 * sq  # a kv head's 4 query heads
        tasks = nb * 2 * -(-rows // (8 if rows <= 8 else 16))
        assert max(1, min(MAX_SPLITS, TASKS // tasks, -(-skv // 32) // MIN_SPLIT_BLOCKS)) == splits
        q = rng.standard_normal((nb, sq, 8, 32)).astype(np.float32)
        k = rng.standard_normal((nb, skv, 2, 32)).astype(np.float32)
        v = rng.standard_normal((nb, skv, 2, 32)).astype(np.float32)
        m = (rng.standard_normal((nb, 1, sq, skv)) * 2).astype(np.float32)
        m[:, :, 0, : skv // 2] = -np.inf  # the first ranges hide every key from query 0
        if nb > 1:
            m[1, :, 0, :] = -np.inf  # batch 1's query 0 sees nothing: zeros
        out = np.full((nb, sq, 8, 32), np.nan, np.float32)
        kernel.run([q, k, v, m, out])
        np.testing.assert_allclose(out, attention_ref(q, k, v, mask=m), rtol=1e-5, atol=1e-5, err_msg=f"{(nb, sq, skv)}")
        if nb > 1:
            assert np.all(out[1, 0] == 0)


def _bf16(x: np.ndarray) -> np.ndarray:
    from tilework.ir.dtype import np_dtype

    return x.astype(np_dtype("bfloat16")).astype(np.float32)


@pytest.mark.parametrize("causal,masked", [(False, None), (True, None), (False, "float"), (False, "padding")], ids=["plain", "causal", "float_mask", "padding_mask"])
def test_bf16_products(causal: bool, masked: str | None) -> None:
    """``bf16``: the wide copy multiplies in bfloat16 (``dot_bf16x2``: queries, keys, values and
    probabilities rounded; float32 sums), on the C target (``vdpbf16ps`` with AVX-512 BF16) and
    the interpreter: within bfloat16's rounding of the float64 reference on the rounded
    inputs, and of the float32 reference; tasks of up to 8 rows (the narrow copy) stay float32,
    as does an odd head dim. Lengths: one query and key, odd key counts, partial key blocks,
    several blocks, rows masked out entirely."""
    from tilework.codegen.c import emit_function
    from tilework.ir.loop import Buffer

    def kernel(hd: int) -> TensorFunc:
        q, k, v = Buffer("q", (b, s, 4, hd), "float32"), Buffer("k", (b, kv, 2, hd), "float32"), Buffer("v", (b, kv, 2, hd), "float32")
        m = None if masked is None else Buffer("mask", (b, 1, s, kv), "float32") if masked == "float" else Buffer("mask", (b, 1, 1, kv), "bool")
        return default_schedule(attention_kernel(q, k, v, m, Buffer("out", (b, s, 4, hd), "float32"), causal, None, 64, True), strict=True)

    funcs = {"dot": kernel(16), "odd": kernel(15)}
    assert "_mm512_dpbf16_ps(" in emit_function(funcs["dot"], "tw_x")
    assert "_mm512_dpbf16_ps(" not in emit_function(funcs["odd"], "tw_x")
    lib = build_library(funcs)
    rng = np.random.default_rng(11)
    for nb, sq, skv in ((1, 1, 1), (2, 5, 33), (1, 9, 9), (1, 33, 65), (2, 20, 7)):
        arrays = [rng.standard_normal(shape).astype(np.float32) for shape in ((nb, sq, 4, 16), (nb, skv, 2, 16), (nb, skv, 2, 16))]
        if masked == "float":
            m = (rng.standard_normal((nb, 1, sq, skv)) * 2).astype(np.float32)
            m[:, :, sq // 2, :] = -np.inf  # a row that sees no key: zeros
            arrays.append(m)
        elif masked == "padding":
            arrays.append(rng.random((nb, 1, 1, skv)) < 0.6)
        mask = arrays[3] if masked else None
        q, k, v = arrays[:3]
        scale = np.float32(1 / math.sqrt(16))
        want = attention_ref(_bf16(q * scale), _bf16(k), _bf16(v), mask=mask, causal=causal, scale=1.0)
        fp32 = attention_ref(q, k, v, mask=mask, causal=causal)
        rows = 2 * sq  # a task's rows: the query positions times the group's 2 heads
        for name, run_ in (("C", lib["dot"].run), ("interp", lambda a: interp.run(funcs["dot"], a))):
            out = np.full((nb, sq, 4, 16), np.nan, np.float32)
            run_([*arrays, out])
            tol = 2.0**-7 * np.abs(v).max() if rows > 8 else 1e-5  # the probabilities' rounding
            np.testing.assert_allclose(out, want if rows > 8 else fp32, rtol=0, atol=tol, err_msg=f"{name} {(nb, sq, skv)}")
            np.testing.assert_allclose(out, fp32, rtol=0, atol=0.05 * np.abs(v).max(), err_msg=f"{name} {(nb, sq, skv)} vs float32")
            if rows > 8:  # the rounding shows: the products were bfloat16
                assert np.abs(out - fp32).max() > 1e-5
        odd = [rng.standard_normal(shape).astype(np.float32) for shape in ((nb, sq, 4, 15), (nb, skv, 2, 15), (nb, skv, 2, 15))]
        out = np.full((nb, sq, 4, 15), np.nan, np.float32)
        lib["odd"].run([*odd, *arrays[3:], out])
        np.testing.assert_allclose(out, attention_ref(*odd, mask=mask, causal=causal), rtol=1e-4, atol=1e-5)
