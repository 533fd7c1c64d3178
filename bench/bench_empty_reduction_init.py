"""A/B: kernels whose reduce extent is symbolic, with the init moved out of the reduce loops
(``init_empty_reductions``, what codegen does) against the init left guarded inside (the old,
wrong-for-K=0 code), in one process. ``python bench/bench_empty_reduction_init.py``."""

from __future__ import annotations

import time

import numpy as np

import tilework as tw
import tilework.codegen.loop_emit as loop_emit
import tilework.op as op
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo

n, k = tw.dim("n", min=0), tw.dim("k", min=0)
CASES = {
    "matmul": ((TensorInfo((n, k), "float32"), TensorInfo((k, 512), "float32")), op.matmul, {"n": 128, "k": 512}),
    "gemv": ((TensorInfo((1, k), "float32"), TensorInfo((k, 2048), "float32")), op.matmul, {"n": 1, "k": 2048}),
    "sum": ((TensorInfo((n, k), "float32"),), lambda x: op.sum(x, axis=1), {"n": 512, "k": 2048}),
    "softmax": ((TensorInfo((n, k), "float32"),), lambda x: op.softmax(x, axis=1), {"n": 512, "k": 2048}),
}


def build() -> tw.VM:
    bb = BlockBuilder()
    for name, (infos, make, _) in CASES.items():
        ps = [Var(f"p{i}", info) for i, info in enumerate(infos)]
        with bb.function(name, ps):
            with bb.dataflow():
                out = bb.emit_output(make(*ps))
            bb.emit_func_output(out)
    return tw.VM(tw.build(bb.get(), target="cpu"))


def best(fn, args, reps: int = 30) -> float:
    fn(*args)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(*args)
        ts.append(time.perf_counter() - t)
    return min(ts)


def main() -> None:
    fixed = build()
    keep = loop_emit.init_empty_reductions
    loop_emit.init_empty_reductions = lambda f: f  # type: ignore[assignment]
    try:
        old = build()
    finally:
        loop_emit.init_empty_reductions = keep
    rng = np.random.default_rng(0)
    for name, (infos, _, dims) in CASES.items():
        args = [rng.standard_normal([d if isinstance(d, int) else dims[str(d)] for d in i.shape]).astype(np.float32) for i in infos]
        a, b = best(old[name], args), best(fixed[name], args)
        print(f"{name:8s} {dims}  init inside: {a * 1e3:8.3f} ms   init moved out: {b * 1e3:8.3f} ms   ratio {b / a:5.2f}")


if __name__ == "__main__":
    main()
