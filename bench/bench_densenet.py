"""DenseNet-121 (torchvision, 224x224, random weights, eval) in tilework against onnxruntime and
torch eager in one process: the minimum and median CPU time (``time.thread_time``) of each
system's calls, taken in turn, at one thread.

    OMP_NUM_THREADS=1 PYTHONPATH=.:/tmp/tvpkgs python bench/bench_densenet.py [--batches 1,8] [--repeat 10]

Needs torchvision (bench only). Prints one line per batch (no docs table: docs/benchmarks.md
quotes its figures in prose)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import conformance_vision  # noqa: E402,F401  (the torchvision::nms schemas, before torchvision)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402

from bench_vision import compile_tilework, onnx_session, randomized  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    model = randomized(torchvision.models.densenet121())
    t = time.perf_counter()
    cm = compile_tilework(model)
    print(f"tilework compile {time.perf_counter() - t:.1f} s, load {os.getloadavg()[0]:.1f}", flush=True)
    sess = onnx_session(model, os.path.join(tempfile.mkdtemp(), "densenet121.onnx"))
    for b in (int(v) for v in args.batches.split(",")):
        x = torch.randn(b, 3, 224, 224)
        with torch.no_grad():
            ref = model(x).numpy()
            err = float(np.abs(np.asarray(cm(x)) - ref).max() / np.abs(ref).max())
            systems: dict[str, Callable[[], Any]] = {"tilework": lambda: cm(x), "onnxruntime": lambda: sess.run(None, {"x": x.numpy()}), "torch eager": lambda: model(x)}
            times: dict[str, list[float]] = defaultdict(list)
            for _ in range(args.repeat):
                for name, f in systems.items():
                    t = time.thread_time()
                    f()
                    times[name].append(time.thread_time() - t)
        cells = ", ".join(f"{n} min {1e3 * min(v):.1f} / median {1e3 * float(np.median(v)):.1f} ms" for n, v in times.items())
        ratio = min(times["onnxruntime"]) / min(times["tilework"])
        print(f"batch {b}: {cells}; onnxruntime / tilework (minima) {ratio:.2f}x; max rel error {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
