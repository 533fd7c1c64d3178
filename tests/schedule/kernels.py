"""Kernels the schedule tests run: built with ``te`` or by hand, each with a NumPy reference.

``KERNELS[name]()`` gives ``(func, make_args, reference)``: ``make_args(rng, sizes)`` returns
the input arrays for a dict of sizes, and ``reference(*inputs)`` the expected outputs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tilework import te
from tilework.ir.loop import Binary, Block, Buffer, Const, For, IterVar, Load, Select, Store, TensorFunc
from tilework.ir.sym import Dim, SymVar

F32 = "float32"


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def add() -> TensorFunc:
    n, m = SymVar("n", 1), SymVar("m", 1)
    a, b = te.placeholder((n, m), F32, "a"), te.placeholder((n, m), F32, "b")
    c = te.compute((n, m), lambda i, j: a[i, j] + b[i, j], "c")
    return te.create_func([a, b, c])


def broadcast_add() -> TensorFunc:
    n, m = SymVar("n", 1), SymVar("m", 1)
    a, b = te.placeholder((n, m), F32, "a"), te.placeholder((m,), F32, "b")
    c = te.compute((n, m), lambda i, j: a[i, j] + b[j], "c")
    return te.create_func([a, b, c])


def transpose() -> TensorFunc:
    n, m = SymVar("n", 1), SymVar("m", 1)
    a = te.placeholder((n, m), F32, "a")
    c = te.compute((m, n), lambda i, j: a[j, i], "c")
    return te.create_func([a, c])


def add_relu() -> TensorFunc:
    """Two elementwise stages through a scratch buffer."""
    n = SymVar("n", 1)
    a, b = te.placeholder((n,), F32, "a"), te.placeholder((n,), F32, "b")
    t = te.compute((n,), lambda i: a[i] + b[i], "t")
    c = te.compute((n,), lambda i: te.maximum(t[i], 0.0), "c")
    return te.create_func([a, b, c])


def row_sum() -> TensorFunc:
    n, m = SymVar("n", 1), SymVar("m", 1)
    a = te.placeholder((n, m), F32, "a")
    k = te.reduce_axis(m, "k")
    c = te.compute((n,), lambda i: te.sum(a[i, k], axis=k), "c")
    return te.create_func([a, c])


def softmax() -> TensorFunc:
    n, m = SymVar("n", 1), SymVar("m", 1)
    x = te.placeholder((n, m), F32, "x")
    k1, k2 = te.reduce_axis(m, "k1"), te.reduce_axis(m, "k2")
    mx = te.compute((n,), lambda i: te.max(x[i, k1], axis=k1), "mx")
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j] - mx[i]), "e")
    s = te.compute((n,), lambda i: te.sum(e[i, k2], axis=k2), "s")
    y = te.compute((n, m), lambda i, j: e[i, j] / s[i], "y")
    return te.create_func([x, y])


def layer_norm() -> TensorFunc:
    n, m = SymVar("n", 1), SymVar("m", 1)
    x = te.placeholder((n, m), F32, "x")
    g, b = te.placeholder((m,), F32, "g"), te.placeholder((m,), F32, "b")
    k1, k2 = te.reduce_axis(m, "k1"), te.reduce_axis(m, "k2")
    mean = te.compute((n,), lambda i: te.sum(x[i, k1], axis=k1) / te.cast(m, F32), "mean")
    var = te.compute((n,), lambda i: te.sum((x[i, k2] - mean[i]) * (x[i, k2] - mean[i]), axis=k2) / te.cast(m, F32), "var")
    y = te.compute((n, m), lambda i, j: (x[i, j] - mean[i]) * te.rsqrt(var[i] + 1e-5) * g[j] + b[j], "y")
    return te.create_func([x, g, b, y])


def matmul(m: Dim | None = None, n: Dim | None = None, k: Dim | None = None, batch: Dim | None = None) -> TensorFunc:
    M: Dim = SymVar("M", 1) if m is None else m
    N: Dim = SymVar("N", 1) if n is None else n
    K: Dim = SymVar("K", 1) if k is None else k
    r = te.reduce_axis(K, "r")
    if batch is None:
        a, b = te.placeholder((M, K), F32, "a"), te.placeholder((K, N), F32, "b")
        c = te.compute((M, N), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), "c")
    else:
        a, b = te.placeholder((batch, M, K), F32, "a"), te.placeholder((batch, K, N), F32, "b")
        c = te.compute((batch, M, N), lambda q, i, j: te.sum(a[q, i, r] * b[q, r, j], axis=r), "c")
    return te.create_func([a, b, c])


def matmul_bias_relu() -> TensorFunc:
    M, N, K = SymVar("M", 1), 48, 24
    a, b, bias = te.placeholder((M, K), F32, "a"), te.placeholder((K, N), F32, "b"), te.placeholder((N,), F32, "bias")
    r = te.reduce_axis(K, "r")
    c = te.compute((M, N), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), "c")
    d = te.compute((M, N), lambda i, j: te.maximum(c[i, j] + bias[j], 0.0), "d")
    return te.create_func([a, b, bias, d])


def linear(rows: Dim | None = None) -> TensorFunc:
    """y[i, j] = sum_k x[i, k] w[j, k] + bias[j]: a linear layer (weight rows are outputs)."""
    n: Dim = SymVar("n", 1) if rows is None else rows
    m, k = SymVar("m", 1), SymVar("k", 1)
    x, w, bias = te.placeholder((n, k), F32, "x"), te.placeholder((m, k), F32, "w"), te.placeholder((m,), F32, "bias")
    r = te.reduce_axis(k, "r")
    y = te.compute((n, m), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r) + bias[j], "y")
    return te.create_func([x, w, bias, y])


def matmul_rows() -> TensorFunc:
    """y[b, s, j] = sum_k x[b, s, k] w[k, j]: two row dims, one weight."""
    b, s, n, k = SymVar("b", 1), SymVar("s", 1), SymVar("n", 1), SymVar("k", 1)
    x, w = te.placeholder((b, s, k), F32, "x"), te.placeholder((k, n), F32, "w")
    r = te.reduce_axis(k, "r")
    y = te.compute((b, s, n), lambda p, q, j: te.sum(x[p, q, r] * w[r, j], axis=r), "y")
    return te.create_func([x, w, y])


def gemv_dot() -> TensorFunc:
    """y[j] = sum_k w[j, k] x[k] (a linear layer's weight layout)."""
    n, k = SymVar("n", 1), SymVar("k", 1)
    w, x = te.placeholder((n, k), F32, "w"), te.placeholder((k,), F32, "x")
    r = te.reduce_axis(k, "r")
    y = te.compute((n,), lambda j: te.sum(w[j, r] * x[r], axis=r), "y")
    return te.create_func([w, x, y])


def gemv_axpy() -> TensorFunc:
    """y[0, j] = sum_k x[0, k] w[k, j] (a matmul with one row)."""
    n, k = SymVar("n", 1), SymVar("k", 1)
    x, w = te.placeholder((1, k), F32, "x"), te.placeholder((k, n), F32, "w")
    r = te.reduce_axis(k, "r")
    y = te.compute((1, n), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), "y")
    return te.create_func([x, w, y])


def gather() -> TensorFunc:
    """out[i, j] = table[idx[i], j]: a data-dependent row gather."""
    n, v, d = SymVar("n", 1), SymVar("v", 1), SymVar("d", 1)
    table, idx = te.placeholder((v, d), F32, "table"), te.placeholder((n,), "int64", "idx")
    out = te.compute((n, d), lambda i, j: table[idx[i], j], "out")
    return te.create_func([table, idx, out])


def cumsum() -> TensorFunc:
    """out[i, j] = x[i, 0] + ... + x[i, j], written by hand: each element reads the previous."""
    n, m = SymVar("n", 1), SymVar("m", 1)
    x, out = Buffer("x", (n, m), F32), Buffer("out", (n, m), F32)
    i, j, vi, vj = SymVar("i"), SymVar("j"), SymVar("vi"), SymVar("vj")
    prev = Select(Binary(">", vj, 0, "bool"), Load(out, (vi, vj - 1)), Const(0.0, F32), F32)
    body = Store(out, (vi, vj), Binary("+", prev, Load(x, (vi, vj)), F32))
    blk = Block("scan", (IterVar(vi, n, "spatial", i), IterVar(vj, m, "spatial", j)), (x, out), (out,), body)
    return TensorFunc((x, out), For(i, n, For(j, m, blk)))


# name -> (builder, inputs(rng, sizes), reference(*inputs) -> output)
Maker = Callable[..., list[np.ndarray]]
KERNELS: dict[str, tuple[Callable[[], TensorFunc], Maker, Callable[..., np.ndarray]]] = {
    "add": (add, lambda r, s: [_f32(r, s["n"], s["m"]), _f32(r, s["n"], s["m"])], lambda a, b: a + b),
    "broadcast_add": (broadcast_add, lambda r, s: [_f32(r, s["n"], s["m"]), _f32(r, s["m"])], lambda a, b: a + b),
    "transpose": (transpose, lambda r, s: [_f32(r, s["n"], s["m"])], lambda a: a.T),
    "add_relu": (add_relu, lambda r, s: [_f32(r, s["n"]), _f32(r, s["n"])], lambda a, b: np.maximum(a + b, 0)),
    "row_sum": (row_sum, lambda r, s: [_f32(r, s["n"], s["m"])], lambda a: a.sum(axis=1)),
    "softmax": (softmax, lambda r, s: [_f32(r, s["n"], s["m"])], lambda x: _softmax(x)),
    "layer_norm": (
        layer_norm,
        lambda r, s: [_f32(r, s["n"], s["m"]), _f32(r, s["m"]), _f32(r, s["m"])],
        lambda x, g, b: (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * g + b,
    ),
    "matmul": (matmul, lambda r, s: [_f32(r, s["n"], s["k"]), _f32(r, s["k"], s["m"])], lambda a, b: a @ b),
    "linear": (
        linear,
        lambda r, s: [_f32(r, s["n"], s["k"]), _f32(r, s["m"], s["k"]), _f32(r, s["m"])],
        lambda x, w, b: x @ w.T + b,
    ),
    "matmul_rows": (
        matmul_rows,
        lambda r, s: [_f32(r, 2, s["n"], s["k"]), _f32(r, s["k"], s["m"])],
        lambda x, w: x @ w,
    ),
    "gemv_dot": (gemv_dot, lambda r, s: [_f32(r, s["n"], s["k"]), _f32(r, s["k"])], lambda w, x: w @ x),
    "gemv_axpy": (gemv_axpy, lambda r, s: [_f32(r, 1, s["k"]), _f32(r, s["k"], s["n"])], lambda x, w: x @ w),
    "gather": (
        gather,
        lambda r, s: [_f32(r, s["m"], s["k"]), r.integers(0, s["m"], s["n"]).astype(np.int64)],
        lambda t, i: t[i],
    ),
    "cumsum": (cumsum, lambda r, s: [_f32(r, s["n"], s["m"])], lambda x: np.cumsum(x, axis=1, dtype=np.float32)),
}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
