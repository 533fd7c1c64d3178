"""The quant backend's ``expert_linear`` (``quant.experts.<fmt>``) against one ``quant.linear``
call per routed expert, at Qwen3-30B-A3B's expert shapes (128 experts, 8 a token; gate/up
K = 2048, N = 2 x 768 with one x for every slot; down K = 768, N = 2048 with one x a slot).

    python bench/bench_quant_experts.py [--formats q4_k,q4_0] [--threads 1] [--tokens 1,16] [--repeat 7]

Both through the externs the VM calls (the Python overhead of a call included). Each pass runs
20 calls, each with a token's 8 experts drawn at random of 128 (the 226 MiB of q4_k experts
do not stay in cache: weights come from memory, as when decoding); the table gives the best and
the median pass per call. At more than one token the per-expert calls are ``qlinear`` on each
expert's rows, gathered and scattered in NumPy (the same bits as the one call: checked).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tilework.backend import quant as Q
from tilework.backend.quant_experts import qexperts
from tilework.op.quant import quant_format
from tilework.runtime.extern import lookup_extern

E, SLOTS = 128, 8
SHAPES = (("gate_up", 2048, 1536, 1), ("down", 768, 2048, SLOTS))  # name, K, N, x's dim 1


def blocks(rng: np.random.Generator, fmt: str, rows: int, k: int) -> np.ndarray:
    """Random ``fmt`` rows (a plain format: q4_0, q4_1, q8_0, q4_k, or their x16 layouts) with
    small finite fp16 scales (the speed does not depend on values)."""
    base = fmt.removesuffix("x16")
    w = rng.integers(0, 256, (rows, Q.row_bytes(base, k)), dtype=np.uint8)
    b = w.reshape(rows, -1, quant_format(base).nbytes)
    b[:, :, 0:4 if base in ("q4_1", "q4_k") else 2] = np.array([0.01, 0.01], np.float16).view(np.uint8)[: 4 if base in ("q4_1", "q4_k") else 2]
    return Q.library().interleave(w, base) if base != fmt else w


def per_expert(x: np.ndarray, w: np.ndarray, ids: np.ndarray, fmt: str, n: int, out: np.ndarray) -> None:
    if x.shape[0] == 1:  # decoding: one extern call an expert, as a graph of linears would make
        linear = lookup_extern(Q.extern_symbol(fmt))
        for s, e in enumerate(ids[0]):
            linear(x[0, 0 if x.shape[1] == 1 else s][None], w[e * n : (e + 1) * n], (1, n, x.shape[2]), out[0, s][None])
        return
    for e in np.unique(ids):
        t, s = np.nonzero(ids == e)
        out[t, s] = Q.qlinear(x[t, 0] if x.shape[1] == 1 else x[t, s], w[e * n : (e + 1) * n], fmt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default="q4_k,q4_0", help="q4_0, q4_1, q8_0, q4_k and their x16 layouts")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", default="1")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for fmt in args.formats.split(","):
        Q.library_for(fmt).set_threads(args.threads)
        experts = lookup_extern(Q.experts_symbol(fmt))
        for name, k, n, s in SHAPES:
            w = blocks(rng, fmt, E * n, k)
            for t in (int(v) for v in args.tokens.split(",")):
                x = rng.standard_normal((t, s if s == 1 else SLOTS, k)).astype(np.float32)
                out, ref = np.empty((t, SLOTS, n), np.float32), np.empty((t, SLOTS, n), np.float32)
                route = [np.stack([rng.choice(E, SLOTS, replace=False) for _ in range(t)]).astype(np.int64) for _ in range(20)]
                per_expert(x, w, route[0], fmt, n, ref)
                assert np.array_equal(qexperts(x, w, route[0], fmt, E), ref)
                runs = {
                    "expert_linear": lambda ids: experts(x, w, ids, (t, x.shape[1], SLOTS, E, n, k), out),
                    "per expert": lambda ids: per_expert(x, w, ids, fmt, n, ref),
                }
                for label, fn in runs.items():
                    passes = []
                    for _ in range(args.repeat):
                        start = time.perf_counter()
                        for ids in route:
                            fn(ids)
                        passes.append((time.perf_counter() - start) / len(route) * 1e6)
                    print(f"{fmt:6s} {name:8s} T={t:<4d} threads={args.threads} {label:14s} best {min(passes):9.1f} us  median {statistics.median(passes):9.1f} us", flush=True)


if __name__ == "__main__":
    main()
