"""The cost of the checks a VM runs for an executable read from a file (``Executable.untrusted``:
each kernel call checked against the kernel's loop IR, each error not a TileworkError turned
into one) against the same executable built in this process (no checks), in one process run.

1. Dispatch overhead per instruction: N trivial builtin calls (no kernels: the checked loop only).
2. Per-op cost with tiny kernels: a chain of 64 ``neg`` kernels on a 1-element tensor, built
   here vs saved and loaded back.

    python bench/bench_checked_calls.py
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

import tilework as tw
from tilework import op
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo

from bench_vm import dispatch_overhead, timeit


def tiny_ops(n: int = 64) -> tuple[float, float]:
    x = Var("x", TensorInfo((tw.dim("n"),), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        cur = x
        for _ in range(n):
            cur = bb.emit(op.neg(cur))
        bb.emit_func_output(cur)
    built = tw.build(bb.get())
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.tw")
        built.save(path)
        loaded = tw.load(path)
    assert loaded.untrusted and not built.untrusted
    a = np.zeros(1, np.float32)
    fb, fl = tw.VM(built)["main"], tw.VM(loaded)["main"]
    return timeit(lambda: fb(a), 50) / n, timeit(lambda: fl(a), 50) / n


def main() -> None:
    d0, d1 = dispatch_overhead(untrusted=False), dispatch_overhead(untrusted=True)
    t0, t1 = tiny_ops()
    print(f"dispatch per instruction: built {d0 * 1e9:.0f} ns, loaded (checked) {d1 * 1e9:.0f} ns")
    print(f"tiny kernel op:           built {t0 * 1e6:.2f} us, loaded (checked) {t1 * 1e6:.2f} us, check cost {(t1 - t0) * 1e6:.2f} us per kernel call")


if __name__ == "__main__":
    main()
