"""Where a torchvision CNN spends its time in tilework, kernel by kernel, beside onnxruntime's
nodes: each VM instruction timed (its minimum over the calls, the thread's CPU time with one
thread), the matmul kernels (a packed ``[N / 16, K, 16]`` weight among their arguments) with
their shape ``rows x K -> N`` and GFLOP/s; onnxruntime's 1x1 convs from its profile (the
minimum of each node over the calls) with theirs.

    OMP_NUM_THREADS=1 TORCHVISION_PATH=DIR python bench/profile_vision.py [--model mobilenet_v2] [--batch 8] [--calls 10]

A diagnosis, not a benchmark: no docs table."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("OMP_NUM_THREADS", "1")
THREADS = int(os.environ["OMP_NUM_THREADS"])

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if os.environ.get("TORCHVISION_PATH"):
    sys.path.append(os.environ["TORCHVISION_PATH"])
import conformance_vision as cv  # noqa: E402  (torchvision's op schemas, then torchvision)
from vm_timing import instrument  # noqa: E402

import tilework  # noqa: E402

Shape = tuple[int, ...]


def gemm_shape(shapes: list[Shape], consts: list[Shape]) -> tuple[int, int, int] | None:
    """``(rows, K, N)`` of a matmul kernel: a packed weight ``[P, K, 16]`` among its arguments
    (``P`` the panels of ``N``: an activation ``[.., K, 16]`` is not taken for it), the output
    (the last) ``[.., N]``."""
    shapes = [s for s in shapes if s]  # scalars (sym args) aside
    if len(shapes) < 2:
        return None
    out = shapes[-1]
    ws = [s for s in consts + shapes[:-1] if len(s) == 3 and s[2] == 16 and s[0] == -(-out[-1] // 16)]
    if not ws:
        return None
    k = ws[0][1]
    return int(np.prod(out[:-1])), k, out[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--no-onnxruntime", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    clock = time.thread_time if THREADS == 1 else time.perf_counter
    model = cv.build(args.model, cv.MODELS[args.model])
    batch = torch.export.Dim("batch", min=1, max=16)
    cm = tilework.compile(model, (torch.randn(2, 3, 224, 224),), ({0: batch},), opt_level=1)
    cm.runtime = "vm"
    x = torch.randn(args.batch, 3, 224, 224)
    cm(x)
    bound = cm._vm._own
    loaded = bound.variant("main", len(cm.signature.inputs)) if hasattr(bound, "variant") else bound.funcs["main"]
    saved = list(loaded.steps)
    shapes: dict[int, list[Shape]] = {}
    mins = instrument(loaded, clock, shapes)
    for _ in range(args.calls):
        cm(x)
    loaded.steps[:] = saved
    consts = [tuple(getattr(c, "shape", ())) for c in cm._vm.exe.constants] if hasattr(cm._vm, "exe") else []
    total = sum(mins.values())
    kern = 0.0
    gemm: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    others: dict[str, list[float]] = defaultdict(list)
    for i, d in mins.items():
        ins = loaded.fn.code[i]
        kind, name = ins[2]
        if kind != "kernel":
            continue
        kern += d
        cargs = [consts[v] for tag, v in ins[3] if tag == "c" and v < len(consts)]
        g = gemm_shape(shapes.get(i, []), cargs)
        if g is not None:
            gemm[g].append(d)
        else:
            others[name.split("_")[0] if name else name].append(d)
    print(f"{args.model} batch {args.batch}, {THREADS} thread(s), clock {clock.__name__}, load {os.getloadavg()[0]:.1f}")
    print(f"instruction minima {1e3 * total:.2f} ms, kernels {1e3 * kern:.2f} ms, matmul kernels {1e3 * sum(sum(v) for v in gemm.values()):.2f} ms")
    ort_nodes = {} if args.no_onnxruntime else onnxruntime_convs(model, x, args.calls)
    print(f"{'rows x K -> N':>22} {'n':>2} {'tw ms':>7} {'tw GF/s':>8} {'ort ms':>7} {'ort GF/s':>8} {'ort/tw':>6}")
    tw_sum = ort_sum = 0.0
    for (m, k, n), ds in sorted(gemm.items(), key=lambda kv: -sum(kv[1])):
        fl = 2.0 * m * k * n
        t = sum(ds) / len(ds)
        o = ort_nodes.get((m, k, n))
        tw_sum += sum(ds)
        ort_sum += o * len(ds) if o else 0.0
        ot = f"{1e3 * o:7.3f} {fl / o / 1e9:8.1f} {o / t:6.2f}" if o else ""
        print(f"{m:>8} x {k:>4} -> {n:>4} {len(ds):>2} {1e3 * t:7.3f} {fl / t / 1e9:8.1f} {ot}")
    print(f"matmul kernels: tilework {1e3 * tw_sum:.2f} ms, onnxruntime's 1x1 convs of those shapes {1e3 * ort_sum:.2f} ms")
    for name, ds in sorted(others.items(), key=lambda kv: -sum(kv[1]))[:12]:
        print(f"  {name[:40]:40} x{len(ds):3d} {1e3 * sum(ds):8.3f} ms")


def onnxruntime_convs(model: torch.nn.Module, x: torch.Tensor, calls: int) -> dict[tuple[int, int, int], float]:
    """onnxruntime's minimum time of each 1x1 conv node by ``(rows, K, N)`` (the mean over the
    nodes of that shape)."""
    import onnxruntime as ort

    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "m.onnx")
    torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}}, opset_version=17, dynamo=False)
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tmp, "prof")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {"x": x.numpy()}
    for _ in range(calls + 1):
        sess.run(None, feed)
    prof = sess.end_profiling()
    with open(prof) as f:
        events = json.load(f)
    best: dict[str, float] = {}
    shape: dict[str, tuple[int, int, int]] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        a = e.get("args", {})
        if a.get("op_name") not in ("Conv", "FusedConv"):
            continue
        ins = [list(d.values())[0] for d in a.get("input_type_shape", [])]
        if len(ins) < 2 or len(ins[1]) != 4 or ins[1][2:] != [1, 1] or ins[1][1] != ins[0][1]:
            continue
        outs = [list(d.values())[0] for d in a.get("output_type_shape", [])]
        o = outs[0]
        name = e["name"]
        shape[name] = (o[0] * o[2] * o[3], ins[1][1], ins[1][0])
        best[name] = min(best.get(name, float("inf")), e["dur"] * 1e-6)
    by: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for name, d in best.items():
        by[shape[name]].append(d)
    return {s: sum(v) / len(v) for s, v in by.items()}


if __name__ == "__main__":
    main()
