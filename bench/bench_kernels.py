"""Row kernels and attention against a memory copy and torch, in one run.

    python bench/bench_kernels.py [--repeat 20] [--threads 1]

Every kernel is legalized from its op with symbolic dims, scheduled by the default rules and
compiled once; the shapes below are values of those dims.

1. GB/s (bytes read + written, divided by the time) of a memory copy (``np.copyto``),
   tilework's elementwise ``add``, ``softmax``, ``log_softmax``, ``layer_norm`` and ``rms_norm``
   at (rows, cols) = (4096, 768) and (128, 32000), with the fraction of the copy's bandwidth and
   torch's GB/s for the same op.
2. Milliseconds of ``attention`` against ``torch.nn.functional.scaled_dot_product_attention``:
   encoder-shaped (1, 128, 12 heads, 32), causal prefill (1, 512, 9, 64) and decoding steps
   (one query, 512 or 2048 keys, grouped KV heads).

Timings are the best of ``--repeat`` runs, ours and torch's interleaved three times so both
see the same machine load. Threads default to one (``--threads`` sets OpenMP's and torch's).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Any, Callable, Sequence


from report import threads_from_argv  # noqa: E402  (report imports no NumPy: OMP_NUM_THREADS is still set before it starts)

os.environ["OMP_NUM_THREADS"] = str(threads_from_argv(1))  # before OpenMP starts

import numpy as np  # noqa: E402
from report import emit, table  # noqa: E402

import tilework as tw  # noqa: E402
from tilework import op  # noqa: E402
from tilework.codegen import build_library  # noqa: E402
from tilework.ir.kernel_abi import bind_syms  # noqa: E402
from tilework.codegen.c.module import Kernel  # noqa: E402
from tilework.ir.builder import BlockBuilder  # noqa: E402
from tilework.ir.graph import Expr, Var  # noqa: E402
from tilework.ir.info import TensorInfo  # noqa: E402
from tilework.ir.loop import TensorFunc  # noqa: E402
from tilework.schedule import default_schedule  # noqa: E402
from tilework.transform.legalize import Legalize  # noqa: E402

ROW_SHAPES = [(4096, 768), (128, 32000)]
# (name, batch, seq_q, heads, kv_heads, head_dim, seq_kv, causal)
ATTENTION = [
    ("encoder", 1, 128, 12, 12, 32, 128, False),
    ("prefill causal", 1, 512, 9, 9, 64, 512, True),
    ("decode gqa", 1, 1, 32, 8, 128, 512, True),
    ("decode gqa", 1, 1, 32, 8, 128, 2048, True),
    ("decode gqa", 1, 1, 9, 3, 64, 2048, True),
]


def kernel_of(make: Callable[..., Expr], infos: Sequence[TensorInfo]) -> TensorFunc:
    """The scheduled kernel that ``make`` on params of ``infos`` legalizes to."""
    bb = BlockBuilder()
    params = [Var(f"p{i}", info) for i, info in enumerate(infos)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make(*params))
        bb.emit_func_output(out)
    funcs = [f for _, f in Legalize()(bb.get()).tensor_funcs()]
    assert len(funcs) == 1, "expected one kernel"
    return default_schedule(funcs[0])


def best_time(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def interleaved(fns: Sequence[Callable[[], Any]], repeat: int) -> list[float]:
    """Best times of ``fns``, measured in three interleaved rounds."""
    out = [math.inf] * len(fns)
    for _ in range(3):
        for k, fn in enumerate(fns):
            out[k] = min(out[k], best_time(fn, repeat))
    return out


def runner(kern: Kernel, arrays: Sequence[np.ndarray]) -> Callable[[], None]:
    """Calls ``kern`` on ``arrays`` (checked once, then through the fast path)."""
    assert kern.func is not None
    kern.run(arrays)
    syms = bind_syms(kern.func, arrays)
    return lambda: kern(arrays, syms)


def row_kernels() -> dict[str, TensorFunc]:
    n, m = tw.dim("n"), tw.dim("m")
    x, w = TensorInfo((n, m), "float32"), TensorInfo((m,), "float32")
    return {
        "add": kernel_of(op.add, [x, x]),
        "softmax": kernel_of(op.softmax, [x]),
        "log_softmax": kernel_of(op.log_softmax, [x]),
        "layer_norm": kernel_of(op.layer_norm, [x, w, w]),
        "rms_norm": kernel_of(op.rms_norm, [x, w]),
    }


def attention_kernels() -> dict[str, TensorFunc]:
    b, s, kv = tw.dim("b"), tw.dim("s"), tw.dim("kv")
    out = {}
    for _, _, _, h, hkv, d, _, causal in ATTENTION:
        key = f"attention_{h}_{hkv}_{d}_{causal}"
        infos = [TensorInfo((b, s, h, d), "float32"), TensorInfo((b, kv, hkv, d), "float32"), TensorInfo((b, kv, hkv, d), "float32")]
        out[key] = kernel_of(lambda q, k, v, c=causal: op.attention(q, k, v, causal=c), infos)
    return out


def bench_rows(lib: Any, torch: Any, repeat: int) -> list[tuple[str, ...]]:
    rng = np.random.default_rng(0)
    out: list[tuple[str, ...]] = []
    print(f"{'op':>12} {'rows x cols':>14} {'GB/s':>7} {'of copy':>8} {'torch GB/s':>11}")
    for rows, cols in ROW_SHAPES:
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        y = rng.standard_normal((rows, cols)).astype(np.float32)
        g = rng.standard_normal(cols).astype(np.float32)
        o = np.empty_like(x)
        F: Any = torch.nn.functional if torch else None
        xt, yt, gt = (torch.from_numpy(a) for a in (x, y, g)) if torch else (None, None, None)
        # name -> (arrays of our kernel, arrays moved per element, torch's version)
        cases: dict[str, tuple[list[np.ndarray], int, Any]] = {
            "add": ([x, y, o], 3, lambda: torch.add(xt, yt)),
            "softmax": ([x, o], 2, lambda: torch.softmax(xt, -1)),
            "log_softmax": ([x, o], 2, lambda: torch.log_softmax(xt, -1)),
            "layer_norm": ([x, g, g, o], 2, lambda: F.layer_norm(xt, (cols,), gt, gt)),
            "rms_norm": ([x, g, o], 2, lambda: F.rms_norm(xt, (cols,), gt, 1e-6)),
        }
        fns: list[Callable[[], Any]] = [lambda: np.copyto(o, x)]
        for name, (arrays, _, ref) in cases.items():
            fns.append(runner(lib[name], arrays))
            if torch:
                fns.append(ref)
        times = iter(interleaved(fns, repeat))  # the copy measured among the others
        copy_gbs = 2 * x.nbytes / next(times) / 1e9
        print(f"{'copy':>12} {f'{rows}x{cols}':>14} {copy_gbs:7.1f} {1.0:8.2f}")
        out.append(("copy", f"{rows}×{cols}", f"{copy_gbs:.1f}", "1.00", ""))
        for name, (_, nbuf, _) in cases.items():
            nbytes = nbuf * x.nbytes
            ours = nbytes / next(times) / 1e9
            theirs = f"{nbytes / next(times) / 1e9:11.1f}" if torch else f"{'-':>11}"
            print(f"{name:>12} {f'{rows}x{cols}':>14} {ours:7.1f} {ours / copy_gbs:8.2f} {theirs}")
            out.append((name, f"{rows}×{cols}", f"{ours:.1f}", f"{ours / copy_gbs:.2f}", theirs.strip()))
    return out


def bench_attention(lib: Any, torch: Any, repeat: int) -> list[tuple[str, ...]]:
    rng = np.random.default_rng(1)
    out: list[tuple[str, ...]] = []
    print(f"\n{'attention':>16} {'(b, sq, h, hkv, d, skv)':>28} {'ms':>8} {'torch ms':>9} {'torch/ours':>10}")
    for name, nb, sq, h, hkv, d, skv, causal in ATTENTION:
        q = rng.standard_normal((nb, sq, h, d)).astype(np.float32)
        k = rng.standard_normal((nb, skv, hkv, d)).astype(np.float32)
        v = rng.standard_normal((nb, skv, hkv, d)).astype(np.float32)
        o = np.empty_like(q)
        fns = [runner(lib[f"attention_{h}_{hkv}_{d}_{causal}"], [q, k, v, o])]
        if torch:
            qt, kt, vt = (torch.from_numpy(a).transpose(1, 2) for a in (q, k, v))
            mask = None
            if causal and sq > 1:  # torch's is_causal aligns at the start; ours at the end
                mask = torch.from_numpy(np.arange(skv)[None, :] <= np.arange(sq)[:, None] + skv - sq)
            F = torch.nn.functional
            fns.append(lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=hkv != h))
            if causal and sq == skv:
                fns.append(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True))
        times = interleaved(fns, repeat)
        ref = min(times[1:]) if torch else math.nan
        shape = str((nb, sq, h, hkv, d, skv))
        print(f"{name:>16} {shape:>28} {times[0] * 1e3:8.3f} {ref * 1e3:9.3f} {ref / times[0]:10.2f}")  # torch / ours, as in the table
        out.append((name, shape, f"{times[0] * 1e3:.3f}", f"{ref * 1e3:.3f}", f"{ref / times[0]:.2f}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="OpenMP and torch threads")
    args = ap.parse_args()
    try:
        import torch

        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None  # type: ignore[assignment]
    funcs = {**row_kernels(), **attention_kernels()}
    lib = build_library(funcs)
    print(f"threads: {args.threads}; kernels compiled once for every shape ({'cached' if lib.cache_hit else 'built'})\n")
    rows = bench_rows(lib, torch, args.repeat)
    att = bench_attention(lib, torch, args.repeat)
    t = args.threads
    emit(f"kernels-rows-{t}t", f"Row kernels, {t} thread(s): GB/s (bytes read + written / time) vs `np.copyto` in the same run:\n\n" + table(["op", "shape", "GB/s", "of copy", "torch GB/s"], rows))
    emit(f"kernels-attention-{t}t", f"Attention, {t} thread(s) (one kernel, symbolic seq, blocked online softmax), ms; ratio = torch SDPA time / ours (> 1: ours faster):\n\n" + table(["case", "(b, seq_q, heads, kv_heads, head_dim, seq_kv)", "tilework ms", "torch SDPA ms", "ratio"], att))


if __name__ == "__main__":
    main()
