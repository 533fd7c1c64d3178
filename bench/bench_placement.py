"""Automatic placement (tilework.collage) against every single-backend configuration and the
peers (issue: placement).

Models (float32, weights as trailing inputs, the graphs of ``tilework.models.reference``):
the MLP (x[n, 1024] -> linear 4096 -> silu -> linear 1024) at n = 1, 32, 256; the MiniLM-shaped
encoder (6 layers, hidden 384, 12 heads, ffn 1536) at (batch, seq) in {1, 8} x {8, 64, 256};
the Llama-shaped graph (``--layers`` layers of hidden 576, 9 heads, 3 KV heads, ffn 1536) at
seq 1 (decode-sized) and 32 (prefill). Each model is compiled once per configuration and runs
every shape:

- tilework by rules: ``codegen`` alone, ``blas+codegen``, ``torch+codegen``,
  ``onnxruntime+codegen``;
- tilework ``placement="auto"``: every available backend, buckets at the benchmark's shapes
  (``buckets=``), measured on this machine with the persistent cost cache; then compiled a
  second time (the cost cache warm) to show what the cache saves;
- ``codegen again``: codegen alone built once more after the search, the same plan as the
  ``codegen`` column in an executable of its own: how far apart two builds of one plan time
  here is the floor of what the comparison can tell apart (printed with the verdict);
- peers: torch eager (the same model in torch.nn.functional, same weights), torch.compile
  (dynamic) of it, and onnxruntime running the whole model exported as one ONNX graph.

Every result is checked against codegen's. Each shape's systems are timed side by side (rounds
calling each in turn, untimed calls for 0.1 s then a timed one: ``report.median_ms_in_rounds``;
each timed call finds its own weights in the caches and no other runtime's thread pool still
spinning from the system before, as a model called in a loop does and as the placement search
times its plans). Prints median ms per shape, auto
placement's speed over the best single-backend configuration at that shape (> 1: faster), the
geometric mean, the search time, candidates measured, the share served from the cache, and the
second compile's time against the first. ``--fresh`` starts from an empty cost cache (a private one in
a temporary directory) so the first compile measures everything.

    python bench/bench_placement.py [--models mlp,encoder,llama] [--layers 2] [--repeat 20] [--threads 1] [--fresh]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tilework as tw  # noqa: E402
from bench_backends import onnxruntime_whole, torch_eager, weights_of  # noqa: E402
from report import emit, median_ms_in_rounds, table  # noqa: E402
from tilework.collage import PlacementPlan  # noqa: E402
from tilework.ir.module import IRModule  # noqa: E402
from tilework.models import reference as R  # noqa: E402
from tilework.runtime.pages import hold_all  # noqa: E402
from tilework.transform.layout_weights import lay_out_weights  # noqa: E402

ORT_THREADS = [0]  # the whole-model session's threads (--threads)
WARM_S = 0.1  # each timed call follows untimed calls of its own system for this long (see median_ms_in_rounds)
AGAIN = "codegen again"
SINGLE = {"codegen": None, "blas": ["blas", "codegen"], "torch": ["torch", "codegen"], "onnxruntime": ["onnxruntime", "codegen"]}


def models(layers: int) -> dict[str, tuple[IRModule, list[Any], Callable[[Any], list[np.ndarray]], dict[str, list[int]]]]:
    """name -> (module, shapes, inputs(shape), buckets)."""
    rng = np.random.default_rng(0)

    def mlp_inputs(n: int) -> list[np.ndarray]:
        return [rng.standard_normal((n, 1024)).astype("float32")]

    def encoder_inputs(bs: tuple[int, int]) -> list[np.ndarray]:
        b, s = bs
        return [rng.standard_normal((b, s, 384)).astype("float32"), np.zeros((b, 1, 1, s), "float32")]

    def llama_inputs(n: int) -> list[np.ndarray]:
        return [rng.standard_normal((1, n, 576)).astype("float32")]

    enc_shapes = [(b, s) for b in (1, 8) for s in (8, 64, 256)]
    return {
        "mlp": (R.mlp(R.MLPConfig()), [1, 32, 256], mlp_inputs, {"n": [1, 32, 256]}),
        "encoder": (R.encoder(R.EncoderConfig(layers=6)), enc_shapes, encoder_inputs, {"batch": [1, 8], "seq": [8, 64, 256]}),
        "llama": (R.llama_graph(R.LlamaConfig(layers=layers)), [1, 32], llama_inputs, {"seq": [1, 32]}),
    }


def torch_compiled(name: str, layers: int) -> Callable[..., Any]:
    """torch.compile (dynamic shapes) of the eager model; the NumPy <-> torch conversions stay
    outside the compiled graph."""
    import torch

    fn = next(c.cell_contents for c in torch_eager(name, layers).__closure__ or () if callable(c.cell_contents) and c.cell_contents.__name__ == name)
    compiled = torch.compile(fn, dynamic=True)

    def run(*arrays: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return compiled(*[torch.from_numpy(a) for a in arrays]).numpy()  # type: ignore[no-any-return]

    return run


def _bound(exe: Any, weights: list[np.ndarray]) -> Callable[..., Any]:
    """``exe``'s main with the weights laid out as it takes them (``exe.meta["weight_layout"]``:
    the linears left to codegen read packed weights) and kept in one arena of 2 MiB pages, as
    ``tilework.compile`` passes them, bound once, called with the inputs."""
    laid_out = lay_out_weights(exe.meta.get("weight_layout") or {}, weights)
    hold_all(laid_out)
    return tw.VM(exe).bind("main", *laid_out)  # type: ignore[no-any-return]


def run_model(name: str, layers: int, repeat: int, budget: float | None) -> dict[str, Any]:
    mod, shapes, make_inputs, buckets = models(layers)[name]
    weights = weights_of(mod)
    have_torch = importlib.util.find_spec("torch") is not None
    have_ort = importlib.util.find_spec("onnxruntime") is not None
    runs: dict[str, Callable[..., Any]] = {}
    setup: dict[str, float] = {}
    for col, backends in SINGLE.items():
        if (col == "torch" and not have_torch) or (col == "onnxruntime" and not have_ort):
            continue
        t = time.perf_counter()
        runs[col] = _bound(tw.build(mod, backends=backends, layout_weights="params"), weights)
        setup[col] = time.perf_counter() - t
    t = time.perf_counter()
    exe = tw.build(mod, placement="auto", placement_options={"buckets": buckets, "budget_s": budget, "progress": True}, layout_weights="params")
    first = time.perf_counter() - t
    t = time.perf_counter()
    exe2 = tw.build(mod, placement="auto", placement_options={"buckets": buckets, "budget_s": budget, "progress": False}, layout_weights="params")
    second = time.perf_counter() - t
    plan = PlacementPlan.from_dict(exe.meta["placement"])
    runs["auto"] = _bound(exe, weights)
    # codegen alone built once more, now (after the search, as auto was): two builds of one
    # plan, whose difference is the floor of what this timing can tell apart
    runs[AGAIN] = _bound(tw.build(mod, layout_weights="params"), weights)
    peers: dict[str, Callable[..., Any]] = {}
    if have_torch:
        peers["torch eager"] = torch_eager(name, layers)
        peers["torch.compile"] = torch_compiled(name, layers)
    if have_ort:
        peers["ort whole"] = onnxruntime_whole(mod, ORT_THREADS[0])
    ms: dict[str, dict[Any, float]] = {c: {} for c in [*runs, *peers]}
    for shape in shapes:
        inputs = make_inputs(shape)
        arrays = inputs + weights
        want = runs["codegen"](*inputs)
        calls: dict[str, Callable[[], Any]] = {}
        for col, fn in [*runs.items(), *peers.items()]:
            args = inputs if col in runs else arrays
            got = np.asarray(fn(*args))
            if not np.allclose(got, want, rtol=3e-3, atol=3e-3):
                raise SystemExit(f"{name} {shape}: {col} differs from codegen by {float(np.abs(got - want).max()):.3g}")
            calls[col] = lambda fn=fn, args=args: fn(*args)
        for col, t in median_ms_in_rounds(calls, repeat, rounds=repeat, settle_s=0, budget_s=2.0, warm_s=WARM_S).items():
            ms[col][shape] = t
    same = [b["placement"] for b in exe2.meta["placement"]["buckets"]] == [b["placement"] for b in exe.meta["placement"]["buckets"]]
    return {"ms": ms, "shapes": shapes, "setup": setup, "first_s": first, "second_s": second, "plan": plan, "same_plan": same}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,encoder,llama")
    ap.add_argument("--layers", type=int, default=2, help="Llama layers (default 2)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--budget", type=float, default=None, help="placement budget_s (default: none)")
    ap.add_argument("--fresh", action="store_true", help="an empty private cost cache (the first compile measures everything)")
    ap.add_argument("--plans", action="store_true", help="print each model's placement table")
    ap.add_argument("--threads", type=int, default=1, help="threads for every runtime (OpenMP, OpenBLAS, torch, onnxruntime); 0: each library's default (default 1: steadier on a shared machine)")
    args = ap.parse_args(argv)
    if args.threads and os.environ.get("OMP_NUM_THREADS") != str(args.threads):
        # the thread counts must be set before the libraries load: run again with them
        env = {**os.environ, **{k: str(args.threads) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    if args.threads:
        from tilework.backend import onnxruntime as ort_backend

        ort_backend.INTRA_OP_THREADS = ORT_THREADS[0] = args.threads
        if importlib.util.find_spec("torch") is not None:
            import torch

            torch.set_num_threads(args.threads)
    if args.fresh:
        from tilework.collage import cache as cache_mod

        tmp = tempfile.mkdtemp(prefix="tw-placement-")
        path = os.path.join(tmp, "costs.sqlite")
        cache_mod.cache_path = lambda: __import__("pathlib").Path(path)  # type: ignore[assignment]
    from tilework.backend import availability

    threads = f"{args.threads} thread(s) per runtime" if args.threads else "each runtime's default threads"
    print(f"numpy {np.__version__}, {os.cpu_count()} cpu(s), {threads}, all configurations in one process; ms = median")
    for b in ("blas", "torch", "onnxruntime"):
        print(f"  {b}: {availability(b)[1]}")
    speedups: list[float] = []
    worst: list[tuple[float, str]] = []
    summary: list[tuple[str, ...]] = []
    per_shape: list[str] = []
    floor: list[float] = []
    for name in args.models.split(","):
        r = run_model(name, args.layers, args.repeat, args.budget)
        ms, cols = r["ms"], list(r["ms"])
        singles = [c for c in SINGLE if c in ms]
        print(f"\n{name}")
        print("| shape | " + " | ".join(cols) + " | best single | auto vs best single |")
        print("|" + "---|" * (len(cols) + 3))
        rows = []
        for shape in r["shapes"]:
            best = min(singles, key=lambda c: ms[c][shape])
            ratio = ms[best][shape] / ms["auto"][shape]
            speedups.append(ratio)
            worst.append((ratio, f"{name} {shape}"))
            cells = " | ".join(f"{ms[c][shape]:.3f}" for c in cols)
            print(f"| {shape} | {cells} | {best} | {ratio:.2f}x |")
            rows.append([str(shape)] + [f"{ms[c][shape]:.3f}" for c in cols] + [best, f"{ratio:.2f}x"])
        per_shape.append(f"{name}, ms:\n\n" + table(["shape"] + cols + ["best single", "auto vs best single"], rows))
        s = r["plan"].stats
        share = s.get("cache_share", 0.0)
        print(f"  search {s.get('search_s', 0):.1f} s over {s.get('candidates')} candidates x {s.get('buckets')} bucket(s): {s.get('measured', 0)} measured, {s.get('cache_hits', 0)} from the cache, {s.get('e2e_measured', 0)} whole plans timed end to end, {s.get('builds', 0)} builds ({100 * share:.0f}% of all from the cache)")
        for b in r["plan"].buckets:
            print(f"  {b.bucket.label()}: {b.chosen_by}")
        print(f"  compile with placement: first {r['first_s']:.1f} s, second (warm cost cache) {r['second_s']:.2f} s = {100 * r['second_s'] / r['first_s']:.1f}% of the first; same plan: {r['same_plan']}")
        print("  single-backend compiles: " + ", ".join(f"{c} {t:.1f} s" for c, t in r["setup"].items()))
        summary.append((
            name,
            f"{s.get('search_s', 0):.1f} s",
            f"{s.get('candidates')} x {s.get('buckets')}, {s.get('measured', 0)} measured, {s.get('e2e_measured', 0)} plans end to end, {100 * share:.0f}% from the cache",
            f"{r['first_s']:.1f} s",
            f"{r['second_s']:.2f} s ({100 * r['second_s'] / r['first_s']:.1f}%), same plan: {r['same_plan']}",
        ))
        if args.plans:
            print("\n".join("  " + line for line in r["plan"].table().splitlines()))
        floor.extend(abs(ms[AGAIN][shape] / ms["codegen"][shape] - 1) for shape in r["shapes"])
    geo = math.exp(statistics.fmean(math.log(x) for x in speedups))
    slower = [w for w in worst if w[0] < 0.97]
    verdict = f"auto vs the best single backend at each shape: geometric mean {geo:.3f}x (aim 1.15x); slower than it by more than 3% at {len(slower)} of {len(worst)} shapes" + (f" ({', '.join(f'{n} {x:.2f}x' for x, n in sorted(slower))})" if slower else "")
    verdict += f"; the two builds of codegen alone (`{AGAIN}`: the same plan built twice) differ by up to {100 * max(floor):.1f}% (median {100 * statistics.median(floor):.1f}%), the floor of what these timings tell apart"
    print("\n" + verdict)
    emit(
        "placement",
        f"`placement=\"auto\"` vs every single-backend configuration, {threads}, all in one process{', empty cost cache' if args.fresh else ''}; median ms of calls each after 0.1 s of untimed calls of the same system:\n\n"
        + table(["model", "search", "candidates x buckets", "first compile", "second compile (warm cost cache)"], summary)
        + "\n\n" + "\n\n".join(per_shape) + f"\n\n{verdict}.",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
