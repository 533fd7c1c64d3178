"""Where a MiniLM forward spends its time in tilework: each VM instruction timed, the minimum
of every instruction over the calls summed by callee (kernel or builtin), the whole call's
minimum beside it, and onnxruntime's in the same process. Minima per instruction hold up on a
loaded machine where whole-call medians do not; with one thread the clock is the thread's CPU
time (``time.thread_time``), with more the wall clock.

    OMP_NUM_THREADS=1 python bench/profile_minilm.py [--shapes 1x8,1x32] [--calls 80] [--precision bf16] [--no-onnxruntime]

Prints one table per shape (no docs table: this is a diagnosis, not a benchmark)."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch  # noqa: E402

import bench_minilm as bm  # noqa: E402
from vm_timing import instrument  # noqa: E402

THREADS = int(os.environ["OMP_NUM_THREADS"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x8,1x32", help="(batch)x(seq), comma-separated")
    ap.add_argument("--calls", type=int, default=80)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--no-onnxruntime", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    clock = time.thread_time if THREADS == 1 else time.perf_counter
    model = bm.load_model()
    cm = bm.compile_tilework(model, 1, args.precision)
    cm.runtime = "vm"  # the instructions timed are the VM's (native graph code has none to time)
    sess = None
    if not args.no_onnxruntime:
        import onnxruntime as ort

        path = os.path.join(tempfile.mkdtemp(), "minilm.onnx")
        bm.export_onnx(model, path)
        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    print(f"tilework {args.precision}, {THREADS} thread(s), clock {clock.__name__}, load {os.getloadavg()[0]:.1f}")
    for shape in args.shapes.split(","):
        batch, seq = (int(v) for v in shape.split("x"))
        x = bm.inputs(batch, seq, model.config.vocab_size)
        cm(**x)
        bound = cm._vm._own  # the function the CompiledModel's bound call runs
        loaded = bound.variant("main", len(cm.signature.inputs)) if hasattr(bound, "variant") else bound.funcs["main"]
        saved = list(loaded.steps)
        mins = instrument(loaded, clock)
        for _ in range(args.calls):
            cm(**x)
        loaded.steps[:] = saved
        whole = {"tilework": float("inf"), "onnxruntime": float("inf")}
        for _ in range(args.calls):
            t = clock()
            cm(**x)
            whole["tilework"] = min(whole["tilework"], clock() - t)
            if sess is not None:
                feed = {k: v.numpy() for k, v in x.items()}
                t = clock()
                sess.run(None, feed)
                whole["onnxruntime"] = min(whole["onnxruntime"], clock() - t)
        by: dict[tuple[str, str], list[float]] = defaultdict(list)
        for i, d in mins.items():
            kind, name = loaded.fn.code[i][2]
            by[(kind, name)].append(d)
        total = sum(mins.values())
        kernels = sum(sum(v) for (k, _), v in by.items() if k == "kernel")
        print(f"\n({batch}, {seq}): whole call min {1e3 * whole['tilework']:.3f} ms" + (f" (onnxruntime {1e3 * whole['onnxruntime']:.3f} ms)" if sess is not None else ""))
        print(f"  instruction minima {1e3 * total:.3f} ms over {len(mins)} calls: kernels {1e3 * kernels:.3f}, builtins {1e3 * (total - kernels):.3f}")
        for (kind, name), v in sorted(by.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {kind:8} {name[:56]:56} x{len(v):3d} {1e3 * sum(v):8.3f} ms {1e6 * sum(v) / len(v):8.1f} us/call")


if __name__ == "__main__":
    main()
