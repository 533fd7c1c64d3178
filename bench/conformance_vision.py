"""torchvision classification and segmentation models, built from their constructors with random
weights (``weights=None``, no backbone weights), through both of tilework's frontends:
torch.export with a dynamic batch (``torch.export.Dim``) and, where torch's own ONNX exporter
(TorchScript, ``dynamo=False``, opset 17) succeeds, ONNX with a dynamic batch axis. Each model is
compiled once per frontend and run at batch 1 and 3 against eager torch; an output matches when
its largest error, divided by the output's largest magnitude, is at most 1e-4 (the metric of
``tests/frontend/test_hf_models.py``). Images are small (64x64 unless the table says otherwise)
to keep compile and run times sane on 2 cores; the ops are the same at 224x224.

torchvision is in no extra and lives in a venv of its own (``pip install -c constraints.txt -e
'.[test,all]'`` there, then ``pip install --no-deps torchvision==0.28.0 pillow`` for torch 2.13):
the PyPI build is a CUDA one whose C extension does not load beside the CPU build of torch, and
in the main venv it breaks ``import transformers``. The
models need none of its C++ ops, but its import registers fake kernels for ``torchvision::nms``
and ``qnms``, so this script defines those two schemas first when the extension is missing.

    python bench/conformance_vision.py [--models resnet18,fcn_resnet50] [--write]

``--write`` puts the rows of the models run into the ``vision-models`` block of
docs/conformance.md (rows of models not run this time stay), in the order of ``MODELS``.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "2")  # before torch starts a pool

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import blocks, emit, table, write_block  # noqa: E402

import tilework  # noqa: E402
from tilework.frontend.onnx import from_onnx  # noqa: E402
from tilework.frontend.torch import translate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "conformance.md"
KEY = "vision-models"
TOL = 1e-4
BATCHES = (1, 3)
HEADERS = ("model", "kind", "image", "torch.export", "ONNX", "compile s (export / ONNX)")


def _torchvision_schemas() -> Any:
    """Define ``torchvision::nms``/``qnms`` when torchvision's C extension is not loadable, so
    that its import (which registers fake kernels for them) succeeds. Returns the library,
    which must stay alive."""
    try:
        torch.ops.torchvision.nms.default
        return None
    except (AttributeError, RuntimeError):
        lib = torch.library.Library("torchvision", "DEF")
        for name in ("nms", "qnms"):
            lib.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        return lib


_LIB = _torchvision_schemas()
import torchvision  # noqa: E402
from torchvision import models as tvm  # noqa: E402


@dataclass(frozen=True)
class Spec:
    kind: str  # classification | segmentation
    kwargs: dict[str, Any] = field(default_factory=dict)
    image: int = 64


SEG = {"weights_backbone": None, "num_classes": 5}
MODELS: dict[str, Spec] = {
    "resnet18": Spec("classification"),
    "resnet50": Spec("classification"),
    "mobilenet_v3_small": Spec("classification"),
    "mobilenet_v2": Spec("classification"),
    "efficientnet_b0": Spec("classification"),
    "densenet121": Spec("classification"),
    "vgg11_bn": Spec("classification", image=224),  # at 64x64 its 2x2 map pools adaptively to 7x7, which torch's ONNX exporter refuses
    "regnet_y_400mf": Spec("classification"),
    "convnext_tiny": Spec("classification"),
    "squeezenet1_1": Spec("classification"),
    "shufflenet_v2_x1_0": Spec("classification"),
    "mnasnet0_5": Spec("classification"),
    "googlenet": Spec("classification", {"aux_logits": False, "init_weights": True}),
    "vit_b_16": Spec("classification", {"image_size": 64}),
    "swin_t": Spec("classification"),
    "fcn_resnet50": Spec("segmentation", SEG),
    "deeplabv3_mobilenet_v3_large": Spec("segmentation", SEG),
    "lraspp_mobilenet_v3_large": Spec("segmentation", SEG),
}


class Out(torch.nn.Module):
    """A segmentation model's ``out`` map (its forward returns a dict)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)["out"]


def build(name: str, spec: Spec) -> torch.nn.Module:
    torch.manual_seed(0)
    model = tvm.get_model(name, weights=None, **spec.kwargs).eval()
    if spec.kind == "segmentation":
        model = Out(model).eval()
    # random BatchNorm statistics, so that eval-mode normalization is not the identity, and random
    # values for parameters initialized to zero (ViT's head: its output would be all zeros)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """The largest error over the output divided by the output's largest magnitude."""
    return float(np.abs(got - want).max() / np.abs(want).max())


def check(fn: Any, weights: list[Any], model: torch.nn.Module, image: int) -> str:
    worst = 0.0
    for b in BATCHES:
        x = torch.randn(b, 3, image, image, generator=torch.Generator().manual_seed(b))
        with torch.no_grad():
            want = model(x).numpy()
        got = np.asarray(fn(x.numpy(), *weights))
        if got.shape != want.shape:
            return f"wrong shape {got.shape} at batch {b}, want {want.shape}"
        err = rel_err(got, want)
        if not np.isfinite(err) or err > TOL:
            return f"MISMATCH {err:.1e} at batch {b}"
        worst = max(worst, err)
    return f"match, {worst:.1e}"


def _short(e: BaseException) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return (text[:160] + "...") if len(text) > 160 else text


def via_export(model: torch.nn.Module, image: int) -> tuple[str, float]:
    example = torch.randn(2, 3, image, image)
    try:
        ep = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},), strict=False)
    except Exception as e:  # noqa: BLE001  (torch's failure, reported as such)
        return f"torch.export fails: {_short(e)}", 0.0
    t = time.perf_counter()
    try:
        tr = translate(ep)
        fn = tilework.VM(tilework.build(tr.module))["main"]
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return f"FAIL: {_short(e)}", time.perf_counter() - t
    secs = time.perf_counter() - t
    try:
        return check(fn, [a for _, a in tr.weights], model, image), secs
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return f"FAIL at run: {_short(e)}", secs


def via_onnx(model: torch.nn.Module, image: int) -> tuple[str, float]:
    f = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.randn(2, 3, image, image),), f, input_names=["x"], dynamic_axes={"x": {0: "batch"}}, opset_version=17, dynamo=False)
    except Exception as e:  # noqa: BLE001  (torch's exporter fails: not ours to count)
        return f"torch.onnx.export fails: {_short(e)}", 0.0
    t = time.perf_counter()
    try:
        fn = tilework.VM(tilework.build(from_onnx(f.getvalue())))["main"]
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return f"FAIL: {_short(e)}", time.perf_counter() - t
    secs = time.perf_counter() - t
    try:
        return check(fn, [], model, image), secs
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return f"FAIL at run: {_short(e)}", secs


def row(name: str, frontends: set[str]) -> list[str]:
    spec = MODELS[name]
    model = build(name, spec)
    ex, ex_s = via_export(model, spec.image) if "export" in frontends else ("not run", 0.0)
    print(f"{name} torch.export: {ex} ({ex_s:.0f} s)", flush=True)
    ox, ox_s = via_onnx(model, spec.image) if "onnx" in frontends else ("not run", 0.0)
    print(f"{name} ONNX: {ox} ({ox_s:.0f} s)", flush=True)
    return [name, spec.kind, f"{spec.image}x{spec.image}", ex, ox, f"{ex_s:.0f} / {ox_s:.0f}"]


def merge(old: str, new: list[list[str]]) -> str:
    """The block's table with ``new`` rows replacing those of the same model, in MODELS order."""
    rows = {r[0]: r for r in new}
    for line in old.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in MODELS and cells[0] not in rows and len(cells) == len(HEADERS):
            rows[cells[0]] = cells
    return table(HEADERS, [rows[n] for n in MODELS if n in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated names (default: all)")
    ap.add_argument("--frontends", default="export,onnx", help="export, onnx or both")
    ap.add_argument("--write", action="store_true", help=f"put the rows into docs/conformance.md's {KEY} block")
    args = ap.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, batches {BATCHES}", flush=True)
    rows = [row(n, set(args.frontends.split(","))) for n in names]
    text = table(HEADERS, rows)
    if args.write:
        text = merge(blocks(DOC.read_text(encoding="utf-8")).get(KEY, ""), rows)
        write_block(DOC, KEY, text)
    emit(KEY, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
