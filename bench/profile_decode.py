"""Where a decode step of the embedded SmolLM2-135M spends its time in tilework, per kernel,
at each batch and thread count: each VM instruction of ``decode`` timed, the minimum of every
instruction over the calls summed by callee (kernel, extern or builtin), beside the whole
step's minimum and median. Minima per instruction hold up on a loaded machine where step
medians do not (a preempted OpenMP worker holds its whole team at the next barrier); with one
thread the clock is the thread's CPU time (``time.thread_time``), with more the wall clock.

Each shape's sequences are prefilled with random tokens, then ``decode`` runs ``--calls``
times on the same cache positions (the step's keys and values are written to the same slots
again, so every call has the same shape); the thread counts take turns within one process
(``omp_set_num_threads``: every OpenMP library of the process shares one runtime).

    python bench/profile_decode.py [--precision q] [--shapes 1x32,8x32] [--threads 1,2] [--calls 40] [--model PATH]

Prints one table per shape and thread count, then the batch-8 to batch-1 throughput ratios
(by whole-step minimum and by the sum of instruction minima). A diagnosis, not a docs table.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "2")  # the most threads; --threads picks fewer per run

import numpy as np  # noqa: E402

import tilework  # noqa: E402,F401  (registers the LLM compiler and the externs)
from tilework.backend import quant  # noqa: E402
from tilework.llm import LLM  # noqa: E402
from tilework.llm.engine import logit_rows  # noqa: E402
from vm_timing import instrument  # noqa: E402


def profile(llm: Any, step: Callable[[], Any], threads: int, calls: int) -> tuple[float, float, dict[tuple[str, str], list[float]]]:
    """(whole-step minimum, median, instruction minima by callee) of ``step`` at ``threads``."""
    quant.library().set_threads(threads)
    clock = time.thread_time if threads == 1 else time.perf_counter
    for _ in range(3):
        step()
    loaded = llm.vm._own.variant("decode", 5)  # what the bound decode runs (5 leading params)
    saved = list(loaded.steps)
    mins = instrument(loaded, clock)
    try:
        for _ in range(calls):
            step()
    finally:
        loaded.steps[:] = saved
    whole = []
    for _ in range(calls):
        t = clock()
        step()
        whole.append(clock() - t)
    by: dict[tuple[str, str], list[float]] = defaultdict(list)
    for i, d in mins.items():
        kind, name = loaded.fn.code[i][2]
        by[(kind, name)].append(d)
    return min(whole), float(np.median(whole)), by


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="q", help="fp32, bf16 or q")
    ap.add_argument("--shapes", default="1x32,8x32", help="(batch)x(prompt tokens), comma-separated")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--top", type=int, default=12, help="callees shown per table")
    ap.add_argument("--model", default=None, help="a GGUF file or checkpoint instead of the embedded SmolLM2-135M")
    ap.add_argument("--kv-dtype", default=None, help="the KV cache's dtype (default: the precision's)")
    args = ap.parse_args()
    llm = LLM(args.model, precision=args.precision, runtime="vm", kv_dtype=args.kv_dtype)  # the VM's instructions are what is timed (native code runs the same kernels)
    cache, rng = llm.cache, np.random.default_rng(0)
    print(f"tilework {args.precision}, KV cache {cache.dtype}, load {os.getloadavg()[0]:.1f} at the start")
    results: dict[tuple[int, int, int], tuple[float, float]] = {}
    for shape in args.shapes.split(","):
        batch, prompt = (int(v) for v in shape.split("x"))
        sids = [cache.add() for _ in range(batch)]
        for sid in sids:
            kv_len, table = cache.step_inputs([sid], prompt)
            llm._prefill(rng.integers(100, 49000, (1, prompt)).astype(np.int32), logit_rows(prompt), kv_len, table, *llm.kv_args)
            cache.advance([sid], prompt)
        kv_len, table = cache.step_inputs(sids, 1)
        tokens = rng.integers(100, 49000, batch).astype(np.int32)

        def step() -> Any:
            return llm._decode(tokens, kv_len, table, *llm.kv_args)

        for threads in (int(t) for t in args.threads.split(",")):
            best, median, by = profile(llm, step, threads, args.calls)
            total = sum(sum(v) for v in by.values())
            results[(batch, prompt, threads)] = (best, total)
            print(f"\n(batch {batch}, prompt {prompt}), {threads} thread(s), load {os.getloadavg()[0]:.1f}: step min {1e3 * best:.2f} ms, median {1e3 * median:.2f} ms; "
                  f"instruction minima {1e3 * total:.2f} ms ({batch / best:.0f} tok/s by the step minimum)")
            for (kind, name), v in sorted(by.items(), key=lambda kv: -sum(kv[1]))[: args.top]:
                print(f"  {kind:8} {name[:44]:44} x{len(v):3d} {1e3 * sum(v):7.3f} ms {1e6 * sum(v) / len(v):8.1f} us/call {100 * sum(v) / total:5.1f}%")
        for sid in sids:
            cache.remove(sid)
    print()
    for (batch, prompt, threads), (best, total) in sorted(results.items()):
        one = results.get((1, prompt, threads))
        if batch != 1 and one is not None:
            print(f"batch {batch} / batch 1 tok/s, prompt {prompt}, {threads} thread(s): {batch * one[0] / best:.2f}x by step minima, {batch * one[1] / total:.2f}x by instruction minima")


if __name__ == "__main__":
    main()
