"""Reductions over an axis that is empty at run time, on both targets (C and the NumPy
interpreter), through ``tw.build`` with the default schedule rules: ``sum`` gives 0, ``prod``
1, ``mean`` NaN, matmul/linear/GEMV with K = 0 zeros, softmax and norms an empty output,
attention with no keys zeros, as in torch; ``max``/``argmax`` over an empty axis raise a
``RuntimeCheckError`` (docs/semantics.md, "Empty reductions"). The same kernels run at a
reduce extent of 1 and odd ones too.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tilework.errors import RuntimeCheckError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework import te
from tilework.codegen import build_library, interp
from tilework.ir import sym
from tilework.ir.loop import Block, TensorFunc, walk_stmts
from tilework.ir.sym import SymVar
from tilework.schedule.loop_primitives import fuse, reorder, split
from tilework.schedule.reduction_primitives import cache_write, init_empty_reductions, rfactor

torch = pytest.importorskip("torch")
F = torch.nn.functional

n, k = tw.dim("n", min=0), tw.dim("k", min=0)
KS = (0, 1, 3, 17)


def T(*shape: Any) -> TensorInfo:
    return TensorInfo(tuple(shape), "float32")


def _attention_ref(q: Any, kk: Any, v: Any) -> Any:  # [b, s, h, d] layout, no keys -> zeros
    q, kk, v = (x.transpose(1, 2) for x in (q, kk, v))
    if kk.shape[2] == 0:
        return torch.zeros_like(q).transpose(1, 2)
    return F.scaled_dot_product_attention(q, kk, v).transpose(1, 2)


CASES: dict[str, tuple[Callable[..., Any], Callable[..., Any] | None, tuple[TensorInfo, ...]]] = {
    "sum": (lambda x: op.sum(x, axis=1), lambda x: x.sum(1), (T(n, k),)),
    "sum_all": (lambda x: op.sum(x), lambda x: x.sum(), (T(k, 3),)),
    "prod": (lambda x: op.prod(x, axis=0), lambda x: x.prod(0), (T(k, n),)),
    "mean": (lambda x: op.mean(x, axis=1, keepdims=True), lambda x: x.mean(1, keepdim=True), (T(n, k),)),
    "max": (lambda x: op.max(x, axis=1), lambda x: x.amax(1), (T(n, k),)),
    "argmax": (lambda x: op.argmax(x, axis=1), lambda x: x.argmax(1), (T(n, k),)),
    "softmax": (lambda x: op.softmax(x, axis=1), lambda x: torch.softmax(x, 1), (T(n, k),)),
    "log_softmax": (lambda x: op.log_softmax(x, axis=1), lambda x: torch.log_softmax(x, 1), (T(n, k),)),
    "rms_norm": (lambda x, w: op.rms_norm(x, w, eps=1e-6), lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6), (T(n, k), T(k))),
    "layer_norm": (lambda x, g, b: op.layer_norm(x, g, b), lambda x, g, b: F.layer_norm(x, (x.shape[-1],), g, b), (T(n, k), T(k), T(k))),
    "matmul": (op.matmul, torch.matmul, (T(n, k), T(k, 24))),
    "gemv": (op.matmul, torch.matmul, (T(1, k), T(k, 40))),
    "linear": (op.linear, F.linear, (T(n, k), T(33, k), T(33))),
    "attention": (op.attention, _attention_ref, (T(1, n, 2, 8), T(1, k, 2, 8), T(1, k, 2, 8))),
}
RAISES = {"max", "argmax"}  # torch raises too; no identity to give


def _module() -> Any:
    bb = BlockBuilder()
    for name, (make, _, infos) in CASES.items():
        params = [Var(f"p{i}", info) for i, info in enumerate(infos)]
        with bb.function(name, params):
            with bb.dataflow():
                out = bb.emit_output(make(*params))
            bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module", params=["cpu", "interp"])
def exe(request: Any) -> Any:
    return tw.build(_module(), target=request.param)


def _inputs(infos: tuple[TensorInfo, ...], dims: dict[str, int], rng: np.random.Generator) -> list[np.ndarray]:
    shapes = [tuple(d if isinstance(d, int) else dims[str(d)] for d in info.shape or ()) for info in infos]
    return [rng.uniform(0.5, 1.5, s).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_at_empty_and_small_reduce_extents(exe: Any, name: str) -> None:
    vm = tw.VM(exe)
    _, ref, infos = CASES[name]
    assert ref is not None
    rng = np.random.default_rng(len(name))
    for kk in KS:
        for nn in (0, 3):
            dims = {"n": nn, "k": kk}
            xs = _inputs(infos, dims, rng)
            where = f"{name} on {exe.meta['target']} at {dims}"
            if name in RAISES and kk == 0:
                with pytest.raises(RuntimeCheckError, match="must not be empty"):
                    vm[name](*xs)
                continue
            got = np.asarray(vm[name](*xs))
            want = ref(*[torch.from_numpy(x) for x in xs]).numpy()
            assert got.shape == want.shape, where
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=where)


def _maybe_empty_inits(f: TensorFunc) -> list[str]:
    return [
        s.name
        for s in walk_stmts(f.body)
        if isinstance(s, Block) and s.init is not None
        and not all(sym.prove_ge(iv.extent, 1) for iv in s.iter_vars if iv.kind == "reduce")
    ]


def test_every_scheduled_kernel_inits_outside_a_maybe_empty_reduction(exe: Any) -> None:
    """What codegen emits for each scheduled kernel: no init is left inside a reduction whose
    domain may be empty (the default rules' loop nests all decompose)."""
    funcs = exe.kernel_funcs
    rules = {str(f.attrs.get("schedule_rule")) for f in funcs.values()}
    if exe.meta["target"] == "cpu":  # the interpreter's only rule is the fallback
        assert {"matmul", "gemv", "reduction", "attention"} <= rules, rules
    before = [b for f in funcs.values() for b in _maybe_empty_inits(f)]
    assert before, "no kernel reduces over a maybe-empty axis"
    for name, f in funcs.items():
        assert _maybe_empty_inits(init_empty_reductions(f)) == [], name


# -- hand-scheduled kernels: every primitive that moves reduce loops ---------------------------


def _matmul(K: SymVar) -> TensorFunc:
    M, N = SymVar("M", 1), SymVar("N", 1)
    r = te.reduce_axis(K, "r")
    a, b = te.placeholder((M, K), "float32", "a"), te.placeholder((K, N), "float32", "b")
    c = te.compute((M, N), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), "c")
    return te.create_func([a, b, c])


def _tiled(K: SymVar) -> TensorFunc:
    f = split(_matmul(K), "i", [None, 4])
    f = split(f, "j", [None, 8])
    return reorder(f, "j_0", "i_0", "r", "i_1", "j_1")  # spatial loops inside the reduction


def _row_sum_rfactor(K: SymVar) -> TensorFunc:
    n = SymVar("n", 1)
    a = te.placeholder((n, K), "float32", "a")
    r = te.reduce_axis(K, "r")
    c = te.compute((n,), lambda i: te.sum(a[i, r], axis=r), "c")
    f = split(te.create_func([a, c]), "r", [None, 4])
    return rfactor(f, "c", "r_1")


SCHEDULED: dict[str, Callable[[SymVar], TensorFunc]] = {
    "plain": _matmul,
    "reduce_outermost": lambda K: reorder(_matmul(K), "r", "i", "j"),
    "split_reduce_reordered": lambda K: reorder(split(_matmul(K), "r", [None, 3]), "i", "r_0", "j", "r_1"),
    "tiled": _tiled,
    "cache_write": lambda K: cache_write(_tiled(K), "c", "i_0"),
    "rfactor_sum": _row_sum_rfactor,
}


@pytest.fixture(scope="module")
def scheduled() -> tuple[dict[str, TensorFunc], Any]:
    """The hand-scheduled kernels and one C library of them all (one compiler run)."""
    K = SymVar("K", 0)
    funcs = {name: make(K) for name, make in SCHEDULED.items()}
    funcs["fused_jr"] = fuse(_matmul(K), "j", "r")
    return funcs, build_library(funcs)


@pytest.mark.parametrize("name", list(SCHEDULED))
def test_hand_scheduled_reductions_at_empty_extent(scheduled: tuple[dict[str, TensorFunc], Any], name: str) -> None:
    funcs, lib = scheduled
    f = funcs[name]
    rng = np.random.default_rng(3)
    for kk in (0, 1, 5):
        if name == "rfactor_sum":
            a = rng.standard_normal((6, kk)).astype(np.float32)
            ins, want = [a], a.sum(1)
        else:
            a, b = rng.standard_normal((6, kk)).astype(np.float32), rng.standard_normal((kk, 10)).astype(np.float32)
            ins, want = [a, b], a @ b
        for run_on in ("interp", "cpu"):
            out = np.full(want.shape, 7.0, np.float32)
            if run_on == "interp":
                interp.run(f, [*ins, out])
            else:
                lib[name].run([*ins, out])
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} on {run_on} at K={kk}")


def test_a_schedule_that_keeps_the_init_inside_refuses_an_empty_domain(scheduled: tuple[dict[str, TensorFunc], Any]) -> None:
    """A reduce loop fused with a spatial one cannot be decomposed: at K = 0 both targets
    raise a RuntimeCheckError instead of leaving the output unwritten; K >= 1 still runs."""
    funcs, lib = scheduled
    f = funcs["fused_jr"]
    for kk in (0, 2):
        a, b = np.ones((2, kk), np.float32), np.ones((kk, 3), np.float32)
        for run in (lambda o: interp.run(f, [a, b, o]), lambda o: lib["fused_jr"].run([a, b, o])):
            out = np.full((2, 3), 7.0, np.float32)
            if kk == 0:
                with pytest.raises(RuntimeCheckError, match="reduction over an empty domain"):
                    run(out)
            else:
                run(out)
                np.testing.assert_array_equal(out, np.full((2, 3), 2.0, np.float32))
