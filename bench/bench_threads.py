"""What thread safety costs a single thread, and what threads give.

1. The guard on the single-threaded path, A/B in one process, rounds interleaved: a VM call
   through ``vm["main"]`` (non-blocking lock, then the VM's own memory) against a replica of
   the call as it was before the guard (same checks and conversions, no lock), and a kernel
   call through ``Kernel.__call__`` against its unguarded replica.
2. Throughput of one shared VM from 1, 2 and 4 Python threads (calls per second).

    python bench/bench_threads.py [--rounds 7] [--calls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any, Callable

import numpy as np

import tilework as tw
from tilework import op
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.models.reference import TransformerConfig, random_weights, transformer_block


def exp_add(cols: int = 16) -> tw.IRModule:
    """One fused elementwise kernel, exp(x) + y on (n, cols) (at 16 columns the VM's overhead
    dominates; bench/probe_wake.py takes wider rows)."""
    n = tw.dim("n")
    x, y = Var("x", TensorInfo((n, cols), "float32")), Var("y", TensorInfo((n, cols), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            r = bb.emit_output(op.add(op.exp(x), y))
        bb.emit_func_output(r)
    return bb.get()


def _unguarded_vm_call(vm: tw.VM, name: str) -> Callable[..., Any]:
    """``vm[name]`` as it was before the guard: the same checks and conversions, the VM's own
    steps and memory, no lock."""
    from tilework.runtime.tensor import as_array, is_torch_tensor

    loaded, params, memory = vm._own.funcs[name], vm._own.funcs[name].fn.params, vm.memory

    def call(*args: Any) -> Any:
        if len(args) != len(params):
            raise TypeError("argument count")
        torch_in = any(is_torch_tensor(a) for a in args)
        try:
            out = loaded.invoke(*[as_array(a) for a in args])
        except BaseException:
            memory.reclaim()
            raise
        return out if not torch_in else None

    return call


def _unguarded_kernel_call(kernel: Any) -> Callable[..., None]:
    """``Kernel.__call__`` before the guard: count check, the shared buffers, no lock."""

    def call(arrays: Any, sym_values: Any) -> None:
        if len(arrays) != kernel._nb or len(sym_values) != kernel._ns:
            raise TypeError("counts")
        if kernel._invoke(arrays, sym_values, kernel._objs, kernel._ptrs, kernel._syms):
            raise MemoryError

    return call


def _per_call(f: Callable[[], Any], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - t0) / calls * 1e6


def _ab(name: str, a: Callable[[], Any], b: Callable[[], Any], rounds: int, calls: int) -> None:
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(_per_call(a, calls))
        tb.append(_per_call(b, calls))
    ma, mb = statistics.median(ta), statistics.median(tb)
    print(f"{name:<34} {ma:8.2f} us {mb:8.2f} us {ma - mb:+7.2f} us ({ma / mb:5.3f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()

    vm = tw.VM(tw.build(exp_add()))
    x, y = np.ones((4, 16), np.float32), np.ones((4, 16), np.float32)
    main_fn, before = vm["main"], _unguarded_vm_call(vm, "main")
    print(f"{'single thread (median of rounds)':<34} {'guarded':>11} {'unguarded':>11}")
    _ab("VM call, 1 kernel", lambda: main_fn(x, y), lambda: before(x, y), args.rounds, args.calls)

    kernel = vm.exe.modules[0][next(iter(vm.exe.modules[0].functions))]
    out = np.empty((4, 16), np.float32)
    arrays, syms = [x, y, out], [4]
    kbefore = _unguarded_kernel_call(kernel)
    _ab("kernel call", lambda: kernel(arrays, syms), lambda: kbefore(arrays, syms), args.rounds, args.calls * 5)

    cfg = TransformerConfig(layers=2, hidden=32, heads=4, ffn=64)
    mod = transformer_block(cfg)
    bvm = tw.VM(tw.build(mod))
    weights = random_weights(list(mod["main"].params[1:]))
    xb = np.random.default_rng(0).standard_normal((1, 8, cfg.hidden)).astype(np.float32)
    bmain, bbefore = bvm["main"], _unguarded_vm_call(bvm, "main")
    _ab("VM call, transformer block", lambda: bmain(xb, *weights), lambda: bbefore(xb, *weights), args.rounds, args.calls // 10)

    print("\none shared VM (transformer block, x of (1, 8, 32)), calls per second:")
    for threads in (1, 2, 4):
        per = args.calls // 4

        def work() -> None:
            for _ in range(per):
                bmain(xb, *weights)

        ts = [threading.Thread(target=work) for _ in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        print(f"  {threads} thread(s): {threads * per / (time.perf_counter() - t0):9.0f}")


if __name__ == "__main__":
    main()
