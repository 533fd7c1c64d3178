"""Single-backend placements against codegen alone and against the peers (issue: backends).

Models (batch 1, float32, weights as trailing inputs): the MLP (x[n, 1024] -> linear 4096 ->
silu -> linear 1024), the MiniLM-shaped encoder (6 layers, hidden 384, 12 heads, ffn 1536)
and the Llama-shaped graph (a few layers of hidden 576, 9 heads, 3 KV heads, ffn 1536), at
n in {1, 32, 256} (rows for the MLP, sequence length otherwise). Each model compiles once per
configuration and runs every n:

- tilework: ``codegen`` alone, ``blas+codegen``, ``torch+codegen``, ``onnxruntime+codegen``,
  built as ``tilework.compile`` builds with backends (``layout_weights="params"``: the linear
  weights left to codegen's kernels are packed for them once, the offloaded ones stay as given);
- peers: torch eager (the same model written with torch.nn.functional, same weights),
  onnxruntime running the whole model exported as one ONNX graph (``session.run`` on NumPy
  arrays, no tilework VM around it) and, where apache-tvm imports (it is in no extra: see
  pyproject.toml), Apache TVM's Relax compiler on the torch model (``bench/tvm_peer.py``; the
  weights bound as constants): ``tvm`` compiled once with the dynamic dim, by the default
  pipeline (on CPU it schedules nothing), and with ``--tvm-trials N`` also ``tvm tuned``:
  MetaSchedule at each static n, N trials per task, its JSON database in ``--tvm-db DIR``
  (a later run with the same directory reuses it and does not tune); its tuning seconds are
  printed apart and counted in its setup. The MLP's 6 tasks (2 fused linears at 3 sizes) at
  32 trials took 815 s on the 2-core machine under a load of ~6 (81 s of it MetaSchedule
  importing its tensor intrinsics, once), the reused database 18 s of export and compile.

Every result is checked against codegen's before it is timed. Prints the median milliseconds
and, per row, each configuration's speed relative to codegen alone (> 1: faster).

Each (model, column) runs in its own process so that the thread pools of different runtimes
never compete; ``--threads`` (default 1) pins every runtime to that many threads (per-core
figures, steadier on a shared machine; 0 keeps each library's default; TVM: ``TVM_NUM_THREADS``
and its target's ``num-cores``).

    python bench/bench_backends.py [--threads 1] [--layers 4] [--repeat 10] [--sizes 1,32,256] [--models mlp,encoder,llama]
                                   [--no-tvm] [--tvm-trials N] [--tvm-db DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np
import tvm_peer
from report import emit, table

import tilework as tw
from tilework.runtime.pages import hold_all
from tilework.transform.layout_weights import lay_out_weights
from tilework.ir.graph import GraphFunc
from tilework.ir.module import IRModule
from tilework.models import reference as R

PEERS = ("torch eager", "ort whole", "tvm", "tvm tuned")  # no (x) in the markdown table
CONFIGS = {"codegen": None, "blas": ["blas", "codegen"], "torch": ["torch", "codegen"], "onnxruntime": ["onnxruntime", "codegen"]}


def timeit(fn: Callable[[], Any], repeat: int, budget_s: float = 2.0) -> float:
    """Median seconds of ``fn`` after two warm-up calls; fewer repeats for slow calls."""
    fn()
    fn()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < repeat and (len(samples) < 3 or time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


# -- models and their inputs --------------------------------------------------------------------


def models(layers: int) -> dict[str, tuple[IRModule, Callable[[int], list[np.ndarray]]]]:
    rng = np.random.default_rng(0)

    def mlp_inputs(n: int) -> list[np.ndarray]:
        return [rng.standard_normal((n, 1024)).astype("float32")]

    def encoder_inputs(n: int) -> list[np.ndarray]:
        return [rng.standard_normal((1, n, 384)).astype("float32"), np.zeros((1, 1, 1, n), "float32")]

    def llama_inputs(n: int) -> list[np.ndarray]:
        return [rng.standard_normal((1, n, 576)).astype("float32")]

    return {
        "mlp": (R.mlp(R.MLPConfig()), mlp_inputs),
        "encoder": (R.encoder(R.EncoderConfig(layers=6)), encoder_inputs),
        "llama": (R.llama_graph(R.LlamaConfig(layers=layers)), llama_inputs),
    }


def weights_of(mod: IRModule) -> list[np.ndarray]:
    main = mod["main"]
    assert isinstance(main, GraphFunc)
    return R.random_weights(list(main.params[int(main.attrs["num_inputs"]) :]), seed=1)


# -- peers --------------------------------------------------------------------------------------


def torch_functions(name: str, layers: int) -> Callable[..., Any]:
    """The model written with torch.nn.functional: its inputs, then its weights, as tensors."""
    import torch.nn.functional as F

    def mlp(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
        return F.linear(F.silu(F.linear(x, w1, b1)), w2, b2)

    def encoder(x: Any, mask: Any, *w: Any) -> Any:
        cfg = R.EncoderConfig(layers=6)
        h, nh = cfg.hidden, cfg.heads
        b, s = x.shape[0], x.shape[1]
        cur = x
        for i in range(cfg.layers):
            wq, bq, wk, bk, wv, bv, wo, bo, g1, be1, w1, b1, w2, b2, g2, be2 = w[16 * i : 16 * i + 16]
            q, k, v = (F.linear(cur, ww, bb).view(b, s, nh, h // nh).transpose(1, 2) for ww, bb in ((wq, bq), (wk, bk), (wv, bv)))
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, h)
            cur = F.layer_norm(cur + F.linear(att, wo, bo), (h,), g1, be1, 1e-12)
            cur = F.layer_norm(cur + F.linear(F.gelu(F.linear(cur, w1, b1)), w2, b2), (h,), g2, be2, 1e-12)
        return cur

    def llama(x: Any, *w: Any) -> Any:
        cfg = R.LlamaConfig(layers=layers)
        h, nh, nkv = cfg.hidden, cfg.heads, cfg.kv_heads
        hd, s = h // nh, x.shape[1]
        cur = x
        for i in range(cfg.layers):
            an, wq, wk, wv, wo, mn, wg, wu, wd = w[9 * i : 9 * i + 9]
            hn = F.rms_norm(cur, (h,), an, 1e-6)
            q = F.linear(hn, wq).view(1, s, nh, hd).transpose(1, 2)
            k = F.linear(hn, wk).view(1, s, nkv, hd).transpose(1, 2)
            v = F.linear(hn, wv).view(1, s, nkv, hd).transpose(1, 2)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(1, s, h)
            cur = cur + F.linear(att, wo)
            hn2 = F.rms_norm(cur, (h,), mn, 1e-6)
            cur = cur + F.linear(F.silu(F.linear(hn2, wg)) * F.linear(hn2, wu), wd)
        return F.rms_norm(cur, (h,), w[-1], 1e-6)

    table: dict[str, Callable[..., Any]] = {"mlp": mlp, "encoder": encoder, "llama": llama}
    return table[name]


def torch_eager(name: str, layers: int) -> Callable[..., Any]:
    import torch

    fn = torch_functions(name, layers)

    def run(*arrays: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return fn(*[torch.from_numpy(a) for a in arrays]).numpy()  # type: ignore[no-any-return]

    return run


def onnxruntime_whole(mod: IRModule, ort_threads: int = 0) -> Callable[..., Any]:
    """The whole ``main`` as one ONNX graph (the onnxruntime backend's exporter), run with
    ``session.run`` on NumPy arrays."""
    import onnxruntime as ort

    from tilework.backend import get_backend
    from tilework.backend.partition import partition_by_rules
    from tilework.backend.onnx_export import export
    from tilework.pattern.graph import graphs_of
    from tilework.backend.offload import region_of

    placement = partition_by_rules(mod, ["onnxruntime"])
    if len(placement.regions) != 1:
        raise RuntimeError(f"the model is not one ONNX region ({len(placement.regions)} regions)")
    main = mod["main"]
    assert isinstance(main, GraphFunc)
    region = region_of(graphs_of("main", main)[0], placement.regions[0], get_backend("onnxruntime"))
    syms = region.sym_vars()
    model, takes_dims = export(region.inputs, region.bindings, region.outputs, syms)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = ort_threads
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    order = [main.params.index(e) for e in region.inputs]  # type: ignore[arg-type]
    dim_sources = _dim_sources(main, syms)

    def run(*arrays: np.ndarray) -> np.ndarray:
        feeds = {names[i]: arrays[p] for i, p in enumerate(order)}
        if takes_dims:
            feeds["tw_dims"] = np.array([arrays[p].shape[a] for p, a in dim_sources], np.int64)
        return sess.run(None, feeds)[0]  # type: ignore[no-any-return]

    return run


def _tvm_module(name: str, layers: int, weights: list[np.ndarray]) -> Any:
    """The torch model with ``weights`` held as its parameters (TVM binds them as constants)."""
    import torch

    fn = torch_functions(name, layers)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.ParameterList([torch.nn.Parameter(torch.from_numpy(w.copy()), requires_grad=False) for w in weights])

        def forward(self, *inputs: Any) -> Any:
            return fn(*inputs, *self.w)

    return Model().eval()


def tvm_columns(name: str, layers: int, num_inputs: int, weights: list[np.ndarray], sizes: list[int], threads: int, trials: int, db: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """TVM on the model: untuned (``trials`` 0: compiled once, n dynamic) or tuned (one module
    per size, static). Returns a callable on (inputs..., weights...) and what to report."""
    import torch

    def example(n: int) -> tuple[Any, ...]:  # a fresh generator: the timed inputs stay those of every column
        return tuple(torch.from_numpy(a) for a in models(layers)[name][1](n)[:num_inputs])

    module = _tvm_module(name, layers, weights)
    if not trials:
        n = torch.export.Dim("n", min=1, max=4096)
        dims = {"mlp": ({0: n},), "encoder": ({1: n}, {3: n}), "llama": ({1: n},)}[name]
        run = tvm_peer.compile_untuned(module, example(2), (dims,), threads)  # forward(*inputs): one tuple
        return (lambda *arrays: run(*arrays[:num_inputs])), {}
    by_n: dict[int, tvm_peer.Tuned] = {}
    for s in sizes:
        by_n[s] = tvm_peer.tune(module, example(s), trials, db, threads)
    axis = 0 if name == "mlp" else 1

    def run_tuned(*arrays: np.ndarray) -> np.ndarray:
        return by_n[arrays[0].shape[axis]].run(*arrays[:num_inputs])

    info = {
        "tune_s": sum(t.tune_s for t in by_n.values()),
        "intrin_import_s": sum(t.intrin_import_s for t in by_n.values()),
        "tasks": sum(t.tasks for t in by_n.values()),
        "reused": all(t.reused for t in by_n.values()),
    }
    return run_tuned, info


def _dim_sources(main: GraphFunc, syms: tuple[Any, ...]) -> list[tuple[int, int]]:
    out = []
    for v in syms:
        for p, param in enumerate(main.params):
            shape = getattr(param.info, "shape", None) or ()
            if v in shape:
                out.append((p, shape.index(v)))
                break
    return out


# -- the run: one process per (model, configuration) ----------------------------------------------


def _inputs(make_inputs: Callable[[int], list[np.ndarray]], n: int) -> list[np.ndarray]:
    np.random.seed(n)
    return make_inputs(n)


def worker(model_name: str, column: str, sizes: list[int], layers: int, repeat: int, ref_path: str, threads: int, tvm_trials: int = 0, tvm_db: str = "") -> dict[str, Any]:
    """Build (or set up) one column for one model, check it against codegen's results (which
    the codegen worker writes to ``ref_path``) and time it at every size."""
    if threads:
        from tilework.backend import onnxruntime as ort_backend

        ort_backend.INTRA_OP_THREADS = threads
        if column in ("torch", "torch eager"):
            import torch

            torch.set_num_threads(threads)
    mod, make_inputs = models(layers)[model_name]
    weights = weights_of(mod)
    info: dict[str, Any] = {}
    t = time.perf_counter()
    if column in CONFIGS:  # as tilework.compile builds with backends: the weights left to codegen's kernels laid out for them, all in one arena of 2 MiB pages
        exe = tw.build(mod, backends=CONFIGS[column], layout_weights="params")
        weights = lay_out_weights(exe.meta.get("weight_layout") or {}, weights)
        hold_all(weights)
        run = tw.VM(exe)["main"]
    elif column == "torch eager":
        run = torch_eager(model_name, layers)
    elif column in ("tvm", "tvm tuned"):
        main = mod["main"]
        assert isinstance(main, GraphFunc)
        trials = tvm_trials if column == "tvm tuned" else 0
        run, info = tvm_columns(model_name, layers, int(main.attrs["num_inputs"]), weights, sizes, threads, trials, os.path.join(tvm_db, f"{model_name}-{threads or 'all'}t"))
    else:
        run = onnxruntime_whole(mod, threads)
    setup_s = time.perf_counter() - t
    ms: dict[int, float] = {}
    refs: dict[str, np.ndarray] = {}
    for n in sizes:
        arrays = _inputs(make_inputs, n) + weights
        got = run(*arrays)
        if column == "codegen":
            refs[str(n)] = got
        else:
            want = np.load(ref_path)[str(n)]
            if not np.allclose(got, want, rtol=2e-3, atol=2e-3):
                raise SystemExit(f"{model_name} n={n}: {column} differs from codegen by {float(np.abs(got - want).max()):.3g}")
        ms[n] = 1e3 * timeit(lambda: run(*arrays), repeat)
    if column == "codegen":
        np.savez(ref_path, **refs)  # type: ignore[arg-type]
    return {"setup_s": setup_s, "ms": ms, **info}


def _spawn(model_name: str, column: str, args: argparse.Namespace, ref_path: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", model_name, column, ref_path, "--sizes", args.sizes, "--layers", str(args.layers), "--repeat", str(args.repeat), "--threads", str(args.threads), "--tvm-trials", str(args.tvm_trials), "--tvm-db", args.tvm_db]
    env = dict(os.environ)
    if args.threads:
        env.update({k: str(args.threads) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS")})
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{model_name} / {column} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4, help="Llama layers (default 4)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--sizes", default="1,32,256")
    ap.add_argument("--models", default="mlp,encoder,llama")
    ap.add_argument("--threads", type=int, default=1, help="threads for every runtime (OpenMP, OpenBLAS, torch, onnxruntime); 0: each library's default (default 1: per-core figures, steadier on a shared machine)")
    ap.add_argument("--no-tvm", action="store_true", help="leave Apache TVM out even where it imports")
    ap.add_argument("--tvm-trials", type=int, default=0, help="also 'tvm tuned': MetaSchedule with this many trials per task at each static n (default 0: TVM untuned only)")
    ap.add_argument("--tvm-db", default="", help="directory of TVM's tuning databases (one per model and thread count), kept for a later run to reuse (default: a temporary one)")
    ap.add_argument("--worker", nargs=3, metavar=("MODEL", "COLUMN", "REF"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        model_name, column, ref_path = args.worker
        res = worker(model_name, column, sizes, args.layers, args.repeat, ref_path, args.threads, args.tvm_trials, args.tvm_db)
        print(json.dumps({**res, "ms": {str(k): v for k, v in res["ms"].items()}}))
        return 0
    have_torch = importlib.util.find_spec("torch") is not None
    have_ort = importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None
    configs = [k for k in CONFIGS if (k != "torch" or have_torch) and (k != "onnxruntime" or have_ort)]
    have_tvm, tvm_line = (False, "left out (--no-tvm)") if args.no_tvm else tvm_peer.available() if have_torch else (False, "needs torch")
    tvm_cols = (["tvm"] + (["tvm tuned"] if args.tvm_trials > 0 else [])) if have_tvm else []
    columns = configs + (["torch eager"] if have_torch else []) + (["ort whole"] if have_ort else []) + tvm_cols
    from tilework.backend import availability

    threads = f"{args.threads} thread(s) per runtime" if args.threads else "each runtime's default threads"
    print(f"numpy {np.__version__}, {os.cpu_count()} cpu(s), {threads}; each column runs in its own process (BLAS,")
    print("OpenMP and ONNX Runtime thread pools never share one); ms = median; (x) = speed vs codegen alone, > 1 is faster")
    for name in ("blas", "torch", "onnxruntime"):
        print(f"  {name}: {availability(name)[1]}")
    print(f"  tvm (peer): {tvm_line}" + ("" if have_tvm else ", its columns skipped"))
    md_rows, tvm_notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        args.tvm_db = args.tvm_db or os.path.join(tmp, "tvm-db")
        for model_name in args.models.split(","):
            ref_path = os.path.join(tmp, f"{model_name}.npz")
            results = {c: _spawn(model_name, c, args, ref_path) for c in columns}
            setup = ", ".join(f"{c} {r['setup_s']:.1f}s" for c, r in results.items())
            if "tvm tuned" in results:
                r = results["tvm tuned"]
                how = "its database reused, no tuning" if r["reused"] else f"{args.tvm_trials} trials per task, tuning {r['tune_s']:.0f} s (of it {r['intrin_import_s']:.0f} s importing MetaSchedule's tensor intrinsics)"
                tvm_notes.append(f"{model_name}: tvm tuned {r['tasks']} tasks over {len(sizes)} static sizes, {how}; setup {r['setup_s']:.0f} s with export and compile")
                print(f"  {tvm_notes[-1]}")
            print(f"\n{model_name} (setup: {setup})")
            print(f"  {'n':>5} " + "".join(f"{c:>21}" for c in columns))
            for n in sizes:
                base = results["codegen"]["ms"][str(n)]
                cells = "".join(f"{results[c]['ms'][str(n)]:>11.2f} ({base / results[c]['ms'][str(n)]:>6.2f}x)" for c in columns)
                print(f"  {n:>5} {cells}")
                md_rows.append([model_name, n] + [f"{results[c]['ms'][str(n)]:.2f}" + ("" if c == "codegen" or c in PEERS else f" ({base / results[c]['ms'][str(n)]:.2f}x)") for c in columns])
    tvm_md = (f"\n\ntvm: {tvm_line}; untuned: the default Relax pipeline, compiled once with n dynamic. " + " ".join(n + "." for n in tvm_notes)) if tvm_cols else ""
    emit("backends", f"Each configuration in its own process, {threads}, median ms, (x) = speed vs codegen alone; n = rows for the MLP, seq for the others (batch 1):\n\n" + table(["model", "n"] + columns, md_rows) + tvm_md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
