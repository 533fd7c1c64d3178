"""GFLOP/s of the default-scheduled matmul kernels at MobileNetV2's 1x1 convs (channel-last,
batch 8 at 224x224): ``epilogue(x[b, HW, K] @ w.T)`` with the weight packed in 16-column
panels as ``tilework.compile`` lays it out, the batch symbolic (one kernel for every batch, as
the model compiles), the epilogue the model fuses (the folded batch norm's bias, then ReLU6,
or a residual added).

    OMP_NUM_THREADS=1 python bench/bench_pointwise.py [--repeat 20] [--batch 8] [--shapes 0,3]

Each time is the minimum over ``--repeat`` calls of the thread's CPU time with one thread
(the wall clock with more); the kernels run in turn, round after round, so that all see the
same load. Prints a line a shape and the sum over the model (each shape times its count)."""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
THREADS = int(os.environ["OMP_NUM_THREADS"])

import numpy as np  # noqa: E402

from tilework import te  # noqa: E402
from tilework.codegen import build_library  # noqa: E402
from tilework.ir import sym  # noqa: E402
from tilework.ir.sym import SymVar  # noqa: E402
from tilework.schedule import default_schedule  # noqa: E402
from tilework.transform.layout_weights import lay_out  # noqa: E402

PANEL = 16
# (H * W, K, N, epilogue, count in MobileNetV2)
SHAPES = [
    (12544, 32, 16, "bias", 1), (12544, 16, 96, "relu6", 1), (3136, 96, 24, "bias", 1),
    (3136, 24, 144, "relu6", 2), (3136, 144, 24, "residual", 1), (784, 144, 32, "bias", 1),
    (784, 32, 192, "relu6", 3), (784, 192, 32, "residual", 2), (196, 192, 64, "bias", 1),
    (196, 64, 384, "relu6", 4), (196, 384, 64, "residual", 3), (196, 384, 96, "bias", 1),
    (196, 96, 576, "relu6", 3), (196, 576, 96, "residual", 2), (49, 576, 160, "bias", 1),
    (49, 160, 960, "relu6", 3), (49, 960, 160, "residual", 2), (49, 960, 320, "bias", 1),
    (49, 320, 1280, "relu6", 1),
]  # fmt: skip


def pointwise(hw: int, k: int, n: int, epilogue: str) -> object:
    b = SymVar("batch", 1)
    x = te.placeholder((b, hw, k), "float32", "x")
    w = te.placeholder((-(-n // PANEL), k, PANEL), "float32", "w")
    bias = te.placeholder((n,), "float32", "bias")
    res = te.placeholder((b, hw, n), "float32", "res")
    r = te.reduce_axis(k, "r")
    y = te.compute((b, hw, n), lambda i, p, j: te.sum(x[i, p, r] * w[sym.floordiv(j, PANEL), r, sym.floormod(j, PANEL)], axis=r), "y")
    if epilogue == "relu6":
        out = te.compute(y.shape, lambda i, p, j: te.minimum(te.maximum(y[i, p, j] + bias[j], 0.0), 6.0), "out")
    elif epilogue == "residual":
        out = te.compute(y.shape, lambda i, p, j: y[i, p, j] + bias[j] + res[i, p, j], "out")
    else:
        out = te.compute(y.shape, lambda i, p, j: y[i, p, j] + bias[j], "out")
    return te.create_func([x, w, bias, res, out])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--shapes", default="", help="indices into SHAPES, comma-separated (default all)")
    ap.add_argument("--source", default="", help="write the kernels' C here")
    args = ap.parse_args()
    chosen = [int(s) for s in args.shapes.split(",")] if args.shapes else list(range(len(SHAPES)))
    funcs = {f"pw{i}": default_schedule(pointwise(*SHAPES[i][:4])) for i in chosen}  # type: ignore[arg-type]
    lib = build_library(funcs)
    if args.source:
        with open(args.source, "w") as f:
            f.write(lib.source())
    clock = time.thread_time if THREADS == 1 else time.perf_counter
    rng = np.random.default_rng(0)
    data = {}
    for i in chosen:
        hw, k, n, ep, _ = SHAPES[i]
        x = rng.standard_normal((args.batch, hw, k)).astype(np.float32)
        wt = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        res = rng.standard_normal((args.batch, hw, n)).astype(np.float32)
        out = np.empty((args.batch, hw, n), np.float32)
        data[i] = [x, lay_out(wt, PANEL), bias, res, out]
        lib[f"pw{i}"].run(data[i])
        want = x @ wt.T + bias
        want = np.clip(want, 0, 6) if ep == "relu6" else want + res if ep == "residual" else want
        err = float(np.abs(out - want).max())
        assert err < 1e-3, (SHAPES[i], err)
    times: dict[int, list[float]] = {i: [] for i in chosen}
    for _ in range(args.repeat):
        for i in chosen:
            kern, d = lib[f"pw{i}"], data[i]
            t = clock()
            kern.run(d)
            times[i].append(clock() - t)
    print(f"{THREADS} thread(s), clock {clock.__name__}, batch {args.batch}, load {os.getloadavg()[0]:.1f}")
    print(f"{'rows x K -> N':>22} {'epilogue':>9} {'min ms':>8} {'med ms':>8} {'GFLOP/s':>8} {'GB/s':>6}")
    total = 0.0
    for i in chosen:
        hw, k, n, ep, count = SHAPES[i]
        rows = args.batch * hw
        best, med = min(times[i]), float(np.median(times[i]))
        total += best * count
        byts = 4 * (rows * k + rows * n * (2 if ep == "residual" else 1))
        print(f"{rows:>8} x {k:>4} -> {n:>4} {ep:>9} {1e3 * best:8.3f} {1e3 * med:8.3f} {2 * rows * k * n / best / 1e9:8.1f} {byts / best / 1e9:6.1f}")
    print(f"sum over the model (min x count): {1e3 * total:.2f} ms")


if __name__ == "__main__":
    main()
