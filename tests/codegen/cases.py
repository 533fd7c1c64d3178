"""te-built kernels with NumPy references, run by the interpreter and by compiled C.

Each case builds a TensorFunc with symbolic dims, makes inputs for a size ``s`` (the value of
its main symbolic dim) and computes the expected outputs with NumPy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np

import tilework as tw
from tilework import te
from tilework.ir.dtype import np_dtype
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.loop import TensorFunc

Arrays = list[np.ndarray]
BF16 = ml_dtypes.bfloat16


@dataclass
class Case:
    name: str
    func: TensorFunc
    inputs: Callable[[int, np.random.Generator], Arrays]
    reference: Callable[..., Arrays]
    tol: float = 1e-5  # relative and absolute tolerance for float outputs
    sym_params: Callable[[int], dict[str, int]] = field(default=lambda s: {})


def outputs_for(func: TensorFunc, inputs: Arrays, sym_params: dict[str, int]) -> Arrays:
    """Output arrays for ``func`` given its inputs, filled with a marker value."""
    env: dict[sym.SymVar, int] = {}
    for b, a in zip(func.inputs, inputs):
        for d, n in zip(b.shape, a.shape):
            if isinstance(d, sym.SymVar):
                env[d] = n
    by_name = {v.name: v for v in func.sym_params}
    env.update({by_name[k]: v for k, v in sym_params.items()})
    outs = []
    for b in func.outputs:
        shape = tuple(sym_walk.evaluate(d, env) for d in b.shape)
        dt = np_dtype(b.dtype)
        outs.append(np.full(shape, 99, dtype=dt) if dt != np.bool_ else np.ones(shape, dtype=dt))
    return outs


def _f32(rng: np.random.Generator, *shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def _case_broadcast_add() -> Case:
    n, m = tw.dim("n"), tw.dim("m")
    A = te.placeholder((n, m), "float32", "A")
    B = te.placeholder((m,), "float32", "B")
    C = te.compute((n, m), lambda i, j: A[i, j] + B[j] * 2.0 - 1, "C")
    return Case("broadcast_add", te.create_func([A, B, C]),
                lambda s, r: [_f32(r, s, 5), _f32(r, 5)], lambda a, b: [a + b * np.float32(2) - np.float32(1)])


def _case_unary() -> Case:
    n = tw.dim("n")
    A = te.placeholder((n,), "float32", "A")
    fns: dict[str, tuple[Callable[..., object], Callable[..., np.ndarray]]] = {
        "exp": (te.exp, np.exp), "log": (lambda x: te.log(abs(x) + 1), lambda x: np.log(np.abs(x) + 1)),
        "sqrt": (lambda x: te.sqrt(abs(x)), lambda x: np.sqrt(np.abs(x))),
        "rsqrt": (lambda x: te.rsqrt(abs(x) + 0.5), lambda x: 1 / np.sqrt(np.abs(x) + np.float32(0.5))),
        "tanh": (te.tanh, np.tanh), "erf": (te.erf, lambda x: np.vectorize(math.erf)(x).astype(np.float32)),
        "sigmoid": (te.sigmoid, lambda x: 1 / (1 + np.exp(-x))), "floor": (te.floor, np.floor),
        "ceil": (te.ceil, np.ceil), "round": (lambda x: te.round(x * 2), lambda x: np.round(x * 2)),
        "sin": (te.sin, np.sin), "cos": (te.cos, np.cos), "neg": (lambda x: -x, np.negative),
        "pow": (lambda x: te.power(abs(x), 1.5), lambda x: np.abs(x) ** np.float32(1.5)),
        "log1p": (lambda x: te.log1p(abs(x)), lambda x: np.log1p(np.abs(x))),
        "expm1": (te.expm1, np.expm1), "atan": (te.atan, np.arctan),
        "asin": (lambda x: te.asin(x * 0.5), lambda x: np.arcsin(x * np.float32(0.5))),
        "acos": (lambda x: te.acos(x * 0.5), lambda x: np.arccos(x * np.float32(0.5))),
    }
    def apply(f: Callable[..., object]) -> Callable[..., object]:
        return lambda i: f(A[i])

    outs = [te.compute((n,), apply(f), name) for name, (f, _) in fns.items()]
    refs = [g for _, g in fns.values()]
    return Case("unary", te.create_func([A], outs), lambda s, r: [_f32(r, s)],
                lambda a: [g(a).astype(np.float32) for g in refs], tol=2e-5)


def _case_reductions() -> Case:
    n, m = tw.dim("n"), tw.dim("m")
    A = te.placeholder((n, m), "float32", "A")
    k = te.reduce_axis(m, "k")
    outs = [
        te.compute((n,), lambda i: te.sum(A[i, k], axis=k), "S"),
        te.compute((n,), lambda i: te.max(A[i, k], axis=k), "Mx"),
        te.compute((n,), lambda i: te.min(A[i, k], axis=k), "Mn"),
        te.compute((n,), lambda i: te.prod(A[i, k] * 0.5 + 1, axis=k), "P"),
        te.compute((n,), lambda i: te.sum(A[i, k], axis=k, where=A[i, k] > 0), "Pos"),
        te.compute((n,), lambda i: te.sum(A[i, k], axis=k) / m, "Mean"),
    ]

    def ref(a: np.ndarray) -> Arrays:
        return [a.sum(1), a.max(1), a.min(1), (a * np.float32(0.5) + 1).prod(1),
                np.where(a > 0, a, 0).sum(1), a.mean(1)]

    return Case("reductions", te.create_func([A], outs), lambda s, r: [_f32(r, s, 9)], ref, tol=1e-4)


def _case_matmul() -> Case:
    n, m, K = tw.dim("n"), tw.dim("m"), tw.dim("K")
    A = te.placeholder((n, K), "float32", "A")
    B = te.placeholder((K, m), "float32", "B")
    k = te.reduce_axis(K, "k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return Case("matmul", te.create_func([A, B, C]), lambda s, r: [_f32(r, s, 9), _f32(r, 9, (s % 5) + 3)],
                lambda a, b: [a @ b], tol=1e-4)


def _case_softmax() -> Case:
    n, m = tw.dim("n"), tw.dim("m")
    X = te.placeholder((n, m), "float32", "X")
    k = te.reduce_axis(m, "k")
    k2 = te.reduce_axis(m, "k2")
    mx = te.compute((n,), lambda i: te.max(X[i, k], axis=k), "mx")
    e = te.compute((n, m), lambda i, j: te.exp(X[i, j] - mx[i]), "e")
    total = te.compute((n,), lambda i: te.sum(e[i, k2], axis=k2), "total")
    Y = te.compute((n, m), lambda i, j: e[i, j] / total[i], "Y")

    def ref(x: np.ndarray) -> Arrays:
        z = np.exp(x - x.max(1, keepdims=True))
        return [z / z.sum(1, keepdims=True)]

    return Case("softmax", te.create_func([X, Y]), lambda s, r: [_f32(r, s, 11, lo=-5, hi=5)], ref, tol=1e-5)


def _case_gather() -> Case:
    n, v, d = tw.dim("n"), tw.dim("v"), tw.dim("d")
    W = te.placeholder((v, d), "float32", "W")
    idx = te.placeholder((n,), "int32", "idx")
    idx64 = te.placeholder((n, 2), "int64", "idx64")
    out = te.compute((n, d), lambda i, j: W[idx[i], j], "emb")
    out2 = te.compute((n, 2), lambda i, j: W[idx64[i, j], j + d - 2] * 2, "pick")

    def inputs(s: int, r: np.random.Generator) -> Arrays:
        return [_f32(r, 13, 4), r.integers(0, 13, size=s).astype(np.int32), r.integers(0, 13, size=(s, 2))]

    def ref(w: np.ndarray, i: np.ndarray, i64: np.ndarray) -> Arrays:
        return [w[i], w[i64, np.array([2, 3])] * 2]

    return Case("gather", te.create_func([W, idx, idx64], [out, out2]), inputs, ref)


def _case_arange() -> Case:
    n = tw.dim("n")
    A = te.placeholder((n,), "float32", "A")
    f = te.compute((n,), lambda i: te.cast(i, "float32") * 0.5 + 1.0, "fr")
    g = te.compute((n,), lambda i: i * 3 - 7, "ir")
    h = te.compute((n,), lambda i: A[i] + i, "plus_index")
    q = te.compute((n,), lambda i: (i - 3) // 2 * 10 + (i - 5) % 3, "floor_index")
    return Case("arange", te.create_func([A], [f, g, h, q]), lambda s, r: [_f32(r, s)],
                lambda a: [np.arange(len(a), dtype=np.float32) * np.float32(0.5) + 1,
                           np.arange(len(a)) * 3 - 7, a + np.arange(len(a), dtype=np.float32),
                           (np.arange(len(a)) - 3) // 2 * 10 + (np.arange(len(a)) - 5) % 3])


def _case_casts() -> Case:
    n = tw.dim("n")
    A = te.placeholder((n,), "float32", "A")
    H = te.placeholder((n,), "float16", "H")
    Bf = te.placeholder((n,), "bfloat16", "Bf")
    I8 = te.placeholder((n,), "int8", "I8")
    outs = [
        te.compute((n,), lambda i: A[i].astype("float16"), "to_f16"),
        te.compute((n,), lambda i: A[i].astype("bfloat16"), "to_bf16"),
        te.compute((n,), lambda i: (A[i] * 50).astype("int8"), "to_i8"),
        te.compute((n,), lambda i: (A[i] * 50).astype("int32").astype("uint8"), "to_u8"),
        te.compute((n,), lambda i: A[i] > 0, "to_bool"),
        te.compute((n,), lambda i: H[i] * H[i] + 1, "f16_math"),
        te.compute((n,), lambda i: Bf[i] * 3 - Bf[i], "bf16_math"),
        te.compute((n,), lambda i: I8[i] + I8[i] * 3, "i8_wrap"),
        te.compute((n,), lambda i: H[i].astype("float32") + Bf[i].astype("float32"), "widen"),
        te.compute((n,), lambda i: (A[i] > 0) & (H[i] < 0.5) | ~(I8[i] > 0), "logic"),
        te.compute((n,), lambda i: te.cast(A[i] > 0.5, "int32") + te.cast(I8[i], "float32").astype("int32"), "b2i"),
        te.compute((n,), lambda i: A[i].astype("float64") * 1e300, "f64"),
    ]

    def inputs(s: int, r: np.random.Generator) -> Arrays:
        a = _f32(r, s)
        return [a, _f32(r, s).astype(np.float16), _f32(r, s).astype(BF16), r.integers(-128, 128, size=s).astype(np.int8)]

    def ref(a: np.ndarray, h: np.ndarray, bf: np.ndarray, i8: np.ndarray) -> Arrays:
        hf, bff = h.astype(np.float32), bf.astype(np.float32)
        return [a.astype(np.float16), a.astype(BF16), (a * 50).astype(np.int8),
                (a * 50).astype(np.int32).astype(np.uint8), a > 0, (hf * hf + 1).astype(np.float16),
                (bff * 3 - bff).astype(BF16), (i8 + i8 * np.int8(3)).astype(np.int8), hf + bff,
                (a > 0) & (h < 0.5) | ~(i8 > 0), (a > 0.5).astype(np.int32) + i8.astype(np.int32),
                a.astype(np.float64) * 1e300]

    return Case("casts", te.create_func([A, H, Bf, I8], outs), inputs, ref, tol=1e-6)


def _case_int_arith() -> Case:
    n = tw.dim("n")
    A = te.placeholder((n,), "int32", "A")
    B = te.placeholder((n,), "int32", "B")
    X = te.placeholder((n,), "float32", "X")
    Y = te.placeholder((n,), "float32", "Y")
    outs = [
        te.compute((n,), lambda i: A[i] // B[i], "fdiv"),
        te.compute((n,), lambda i: A[i] % B[i], "fmod"),
        te.compute((n,), lambda i: te.truncdiv(A[i], B[i]), "tdiv"),
        te.compute((n,), lambda i: X[i] // Y[i], "ffdiv"),
        te.compute((n,), lambda i: X[i] % Y[i], "ffmod"),
        te.compute((n,), lambda i: te.maximum(A[i], B[i]) - te.minimum(A[i], 3) + abs(B[i]), "minmax"),
        te.compute((n,), lambda i: te.sum(A[i] * 0 + te.cast(B[i] > 0, "int32"), axis=te.reduce_axis(1, "z")), "count"),
    ]

    def inputs(s: int, r: np.random.Generator) -> Arrays:
        b = r.integers(-9, 10, size=s).astype(np.int32)
        b[b == 0] = 3
        y = _f32(r, s, lo=-3, hi=3)
        y[np.abs(y) < 0.1] = 0.7
        return [r.integers(-100, 100, size=s).astype(np.int32), b, _f32(r, s, lo=-10, hi=10), y]

    def ref(a: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> Arrays:
        return [a // b, a % b, (np.trunc(a / b)).astype(np.int32), x // y, x % y,
                np.maximum(a, b) - np.minimum(a, 3) + np.abs(b), (b > 0).astype(np.int32)]

    return Case("int_arith", te.create_func([A, B, X, Y], outs), inputs, ref, tol=1e-6)


def _case_select_shift() -> Case:
    n = tw.dim("n")
    A = te.placeholder((n,), "float32", "A")
    leaky = te.compute((n,), lambda i: te.if_then_else(A[i] > 0, A[i], A[i] * 0.1), "leaky")
    shift = te.compute((n,), lambda i: te.if_then_else(te.gt(i, 0), A[i - 1], 0.0), "shift")
    pad = te.compute((n + 2,), lambda i: te.if_then_else(te.all(te.ge(i, 1), te.lt(i, n + 1)), A[i - 1], -1.0), "pad")
    rep = te.compute((n * 2,), lambda i: A[i // 2], "rep")

    def ref(a: np.ndarray) -> Arrays:
        return [np.where(a > 0, a, a * np.float32(0.1)), np.concatenate([[0], a[:-1]]).astype(np.float32),
                np.pad(a, 1, constant_values=-1), np.repeat(a, 2)]

    return Case("select_shift", te.create_func([A], [leaky, shift, pad, rep]), lambda s, r: [_f32(r, s)], ref)


def _case_sym_param() -> Case:
    n, m = tw.dim("n"), tw.dim("m")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * m + te.cast(i % m, "float32"), "B")
    func = te.create_func([A, B])
    assert [v.name for v in func.sym_params] == ["m"]
    return Case("sym_param", func, lambda s, r: [_f32(r, s)],
                lambda a: [a * np.float32(4) + (np.arange(len(a)) % 4).astype(np.float32)], sym_params=lambda s: {"m": 4})


def _case_argmax() -> Case:
    n, m = tw.dim("n"), tw.dim("m")
    A = te.placeholder((n, m), "float32", "A")
    Q = te.placeholder((n, 3, m), "int8", "Q")
    k = te.reduce_axis(m, "k")
    a, b = te.reduce_axis(3, "a"), te.reduce_axis(m, "b")
    amax = te.compute((n,), lambda i: te.argmax(A[i, k], axis=k), "amax")
    amin = te.compute((n,), lambda i: te.argmin(A[i, k], axis=k), "amin")
    flat = te.compute((n,), lambda i: te.argmax(Q[i, a, b], axis=(a, b)), "flat")

    def inputs(s: int, r: np.random.Generator) -> Arrays:
        x = np.round(_f32(r, s, 6) * 2) / 2  # ties
        if s > 3:
            x[2, 4] = np.nan
        return [x, r.integers(-5, 5, size=(s, 3, 6)).astype(np.int8)]

    def ref(x: np.ndarray, q: np.ndarray) -> Arrays:
        return [x.argmax(1), x.argmin(1), q.reshape(len(q), -1).argmax(1)]

    return Case("argmax", te.create_func([A, Q], [amax, amin, flat]), inputs, ref)


def _case_nested_reduce() -> Case:
    n, m = tw.dim("n"), tw.dim("m")
    A = te.placeholder((n, m), "float32", "A")
    r, k, r2 = te.reduce_axis(n, "r"), te.reduce_axis(m, "k"), te.reduce_axis(m, "r2")
    total = te.compute((), lambda: te.sum(te.max(A[r, k], axis=k) * 2, axis=r), "total")
    var = te.compute((n,), lambda i: te.sum((A[i, k] - te.sum(A[i, r2], axis=r2) / m) ** 2, axis=k) / m, "var")
    return Case("nested_reduce", te.create_func([A], [total, var]), lambda s, rr: [_f32(rr, s, 5)],
                lambda a: [np.float32(a.max(1).sum() * 2).reshape(()), a.var(1)], tol=1e-4)


CASES = (
    _case_broadcast_add, _case_unary, _case_reductions, _case_matmul, _case_softmax, _case_gather,
    _case_arange, _case_casts, _case_int_arith, _case_select_shift, _case_sym_param, _case_argmax,
    _case_nested_reduce,
)  # fmt: skip


def build_cases() -> list[Case]:
    return [make() for make in CASES]
