"""VM overhead and the transformer block's latency vs NumPy and torch eager (issue: VM).

1. Dispatch overhead per instruction: a VM function of N trivial builtin calls.
2. Per-op cost with tiny kernels: a chain of elementwise ops on a 1-element tensor.
3. The 2-layer transformer block (hidden 64, 4 heads, ffn 256), compiled once, at
   (batch, seq) in {(1,1), (1,7), (2,128), (4,513)} vs a NumPy float32 implementation and
   torch eager, same weights. Prints milliseconds and ratios (>1: tilework is faster). The
   NumPy peer's GELU uses ``scipy.special.erf`` (vectorized) when SciPy is there, else a
   vectorized rational approximation (Abramowitz & Stegun 7.1.26, error < 1.5e-7); torch
   runs with ``OMP_NUM_THREADS`` threads, as NumPy's BLAS and tilework do.

    python bench/bench_vm.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from typing import Any, Callable

import numpy as np

import tilework as tw
from tilework import op
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.models.reference import TransformerConfig, random_weights, transformer_block
from tilework.runtime.bytecode import VMFunction
from tilework.runtime.executable import Executable

from report import emit, table

SHAPES = [(1, 1), (1, 7), (2, 128), (4, 513)]


def timeit(fn: Callable[[], Any], repeat: int, number: int = 1) -> float:
    fn()
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t) / number)
    return statistics.median(samples)


def dispatch_overhead(n: int = 1000, untrusted: bool = False) -> float:
    """Seconds per VM instruction of a function of ``n`` copies (``untrusted``: as read from a
    file, its calls checked)."""
    code = [("call", 1, ("builtin", "vm.copy"), (("r", 0),)) for _ in range(n)] + [("ret", 1)]
    exe = Executable({"main": VMFunction("main", ("x",), 2, tuple(code))}, [], {})
    exe.untrusted = untrusted
    f = tw.VM(exe)["main"]
    x = np.zeros(1, np.float32)
    return timeit(lambda: f(x), 20) / n


def tiny_op_cost(n: int = 64) -> tuple[float, int]:
    x = Var("x", TensorInfo((tw.dim("n"),), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        cur = x
        for _ in range(n):
            cur = bb.emit(op.neg(cur))
        bb.emit_func_output(cur)
    exe = tw.build(bb.get())
    f = tw.VM(exe)["main"]
    a = np.zeros(1, np.float32)
    return timeit(lambda: f(a), 20) / n, exe.stats()["instructions"]


def vector_erf() -> Callable[[np.ndarray], np.ndarray]:
    try:
        from scipy.special import erf

        return erf  # type: ignore[no-any-return]
    except ImportError:

        def erf_as(x: np.ndarray) -> np.ndarray:  # Abramowitz & Stegun 7.1.26
            a = np.abs(x)
            t = 1 / (1 + 0.3275911 * a)
            poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
            return np.sign(x) * (1 - poly * np.exp(-a * a))

        return erf_as


def numpy_block(x: np.ndarray, w: list[np.ndarray], cfg: TransformerConfig) -> np.ndarray:
    def ln(t: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        mu = t.mean(-1, keepdims=True)
        var = ((t - mu) ** 2).mean(-1, keepdims=True)
        return (t - mu) / np.sqrt(var + 1e-5) * g + b

    verf = vector_erf()
    b, s, h = x.shape
    nh, hd = cfg.heads, cfg.hidden // cfg.heads
    cur = x
    for i in range(cfg.layers):
        g1, b1, wq, bq, wk, bk, wv, bv, wo, bo, g2, b2, w1, c1, w2, c2 = w[16 * i : 16 * i + 16]
        hn = ln(cur, g1, b1)
        q = (hn @ wq.T + bq).reshape(b, s, nh, hd).transpose(0, 2, 1, 3)
        k = (hn @ wk.T + bk).reshape(b, s, nh, hd).transpose(0, 2, 3, 1)
        v = (hn @ wv.T + bv).reshape(b, s, nh, hd).transpose(0, 2, 1, 3)
        sc = (q @ k) / np.float32(math.sqrt(hd))
        sc = np.where(np.tril(np.ones((s, s), bool)), sc, np.float32(-np.inf))
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        att = ((sc / sc.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
        cur = cur + att @ wo.T + bo
        u = ln(cur, g2, b2) @ w1.T + c1
        cur = cur + (0.5 * u * (1 + verf(u / np.float32(math.sqrt(2)))).astype(np.float32)) @ w2.T + c2
    return cur


def torch_block(x: Any, w: list[Any], cfg: TransformerConfig) -> Any:
    import torch.nn.functional as F

    b, s, h = x.shape
    nh, hd = cfg.heads, cfg.hidden // cfg.heads
    cur = x
    for i in range(cfg.layers):
        g1, b1, wq, bq, wk, bk, wv, bv, wo, bo, g2, b2, w1, c1, w2, c2 = w[16 * i : 16 * i + 16]
        hn = F.layer_norm(cur, (h,), g1, b1)
        q = F.linear(hn, wq, bq).view(b, s, nh, hd).transpose(1, 2)
        k = F.linear(hn, wk, bk).view(b, s, nh, hd).transpose(1, 2)
        v = F.linear(hn, wv, bv).view(b, s, nh, hd).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        cur = cur + F.linear(att, wo, bo)
        cur = cur + F.linear(F.gelu(F.linear(F.layer_norm(cur, (h,), g2, b2), w1, c1)), w2, c2)
    return cur


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    dispatch = dispatch_overhead()
    print(f"VM dispatch overhead: {dispatch * 1e6:.3f} us per instruction (trivial builtin)")
    per_op, n_instr = tiny_op_cost()
    print(f"tiny elementwise op through the VM (alloc + kernel call + kill): {per_op * 1e6:.2f} us per op ({n_instr} instructions for 64 ops)")

    cfg = TransformerConfig(layers=2, hidden=64, heads=4, ffn=256)
    mod = transformer_block(cfg)
    t = time.perf_counter()
    exe = tw.build(mod)
    print(f"transformer block compiled once in {time.perf_counter() - t:.2f} s: {exe.stats()}")
    f = tw.VM(exe)["main"]
    weights = random_weights(list(mod["main"].params[1:]))  # type: ignore[union-attr]
    try:
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
        tw_weights = [torch.from_numpy(a) for a in weights]
    except ImportError:
        torch = None  # type: ignore[assignment]
    print(f"{'(batch, seq)':>14} {'tilework ms':>12} {'numpy ms':>10} {'torch ms':>10} {'vs numpy':>9} {'vs torch':>9}")
    rows = []
    rng = np.random.default_rng(0)
    for batch, seq in SHAPES:
        x = rng.standard_normal((batch, seq, cfg.hidden)).astype(np.float32)
        rep = max(3, args.repeat if seq < 256 else args.repeat // 4)
        t_tw = timeit(lambda: f(x, *weights), rep)
        t_np = timeit(lambda: numpy_block(x, weights, cfg), rep)
        line = f"{str((batch, seq)):>14} {t_tw * 1e3:12.3f} {t_np * 1e3:10.3f}"
        if torch is not None:
            xt = torch.from_numpy(x)
            with torch.no_grad():
                t_th = timeit(lambda: torch_block(xt, tw_weights, cfg), rep)
            line += f" {t_th * 1e3:10.3f} {t_np / t_tw:9.2f} {t_th / t_tw:9.2f}"
            rows.append(((batch, seq), f"{t_tw * 1e3:.3f}", f"{t_np * 1e3:.3f}", f"{t_th * 1e3:.3f}", f"{t_np / t_tw:.2f}", f"{t_th / t_tw:.2f}"))
        else:
            line += f" {'-':>10} {t_np / t_tw:9.2f} {'-':>9}"
            rows.append(((batch, seq), f"{t_tw * 1e3:.3f}", f"{t_np * 1e3:.3f}", "-", f"{t_np / t_tw:.2f}", "-"))
        print(line)
    stats = exe.stats()
    emit(
        "vm",
        f"- Dispatch overhead: **{dispatch * 1e6:.3f} µs per instruction** (a trivial builtin).\n"
        f"- A tiny elementwise op through the VM (allocation, kernel call, kill): {per_op * 1e6:.2f} µs.\n"
        f"- The 2-layer transformer block (hidden 64, 4 heads, ffn 256), compiled once ({stats['kernels']} kernels, "
        f"{stats['instructions']} instructions), vs NumPy float32 and torch eager, same weights, median of {args.repeat} (fewer from seq 256):\n\n"
        + table(["(batch, seq)", "tilework ms", "NumPy ms", "torch ms", "vs NumPy", "vs torch"], rows),
    )


if __name__ == "__main__":
    main()
