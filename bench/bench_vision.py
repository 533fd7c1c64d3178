"""Vision CNNs side by side: tilework vs torch eager, torch.compile and onnxruntime.

Two networks written in plain torch with the block structure of torchvision's ResNet-18 and
MobileNetV3-Small (torchvision itself is not a dependency), random weights, eval mode, at
batch 1 and 8 and 224x224. tilework compiles each once through the torch.export frontend with
a symbolic batch; onnxruntime runs the same module exported to ONNX with a dynamic batch.
Every system runs in this one process with ``OMP_NUM_THREADS`` threads (2 unless set;
``torch.set_num_threads``, onnxruntime's ``intra_op_num_threads``). Each time is the median
of ``--repeat`` calls after one warm-up call; a ratio above 1 means tilework is faster.

    python bench/bench_vision.py [--repeat 10] [--batches 1,8] [--models resnet18,mobilenet_v3_small]

``--torchvision NAMES`` (``default``: ``TORCHVISION_MODELS``) runs torchvision's own
constructors instead (random weights and batch-norm statistics as ``conformance_vision.build``
makes them, 224x224) into a second table, ``vision-torchvision``. torchvision is a bench-only
peer outside every extra (its PyPI build is a CUDA one that breaks ``import transformers``
beside CPU torch): install it into a folder of its own, ``pip install --no-deps --target DIR
torchvision==0.28.0 pillow``, and name that folder in ``TORCHVISION_PATH``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "2")  # before torch or onnxruntime start a pool
THREADS = int(os.environ["OMP_NUM_THREADS"])

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import cpu_features, cpu_model, emit, median_ms_in_rounds, table  # noqa: E402

import tilework  # noqa: E402

# -- the networks (torchvision's block structure, written here) ---------------------------------


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, cout, 3, stride), conv_bn(cout, cout, 3, act=None))
        self.down = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.down(x))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        blocks: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, squeeze: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))


def _div8(v: float) -> int:
    return max(8, int(v + 4) // 8 * 8)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, act: type[nn.Module], stride: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [] if exp == cin else [conv_bn(cin, exp, 1, act=act)]
        layers.append(conv_bn(exp, exp, k, stride, groups=exp, act=act))
        if se:
            layers.append(SqueezeExcite(exp, _div8(exp / 4)))
        layers.append(conv_bn(exp, cout, 1, act=None))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


# (kernel, expanded, out, squeeze-excite, hardswish, stride): torchvision's mobilenet_v3_small
_SMALL = [(3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2), (3, 88, 24, False, False, 1), (5, 96, 40, True, True, 2), (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1), (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1), (5, 288, 96, True, True, 2), (5, 576, 96, True, True, 1), (5, 576, 96, True, True, 1)]


class MobileNetV3Small(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 16, 3, 2, act=nn.Hardswish)]
        cin = 16
        for k, exp, cout, se, hs, stride in _SMALL:
            layers.append(InvertedResidual(cin, k, exp, cout, se, nn.Hardswish if hs else nn.ReLU, stride))
            cin = cout
        layers.append(conv_bn(cin, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.head(torch.flatten(x, 1))


MODELS: dict[str, Callable[[], nn.Module]] = {"resnet18": ResNet18, "mobilenet_v3_small": MobileNetV3Small}
# torchvision's models beyond the two above that its users run most (``--torchvision default``)
TORCHVISION_MODELS = ("resnet50", "mobilenet_v2", "efficientnet_b0", "densenet121", "regnet_y_400mf", "convnext_tiny", "shufflenet_v2_x1_0", "googlenet")


def torchvision_models(names: str) -> dict[str, Callable[[], nn.Module]]:
    """Constructors of torchvision's models ``names`` (comma-separated, or ``default``), from
    the folder in ``TORCHVISION_PATH`` (or wherever ``import torchvision`` finds it)."""
    path = os.environ.get("TORCHVISION_PATH")
    if path:
        sys.path.append(path)
    try:
        import conformance_vision as cv  # defines torchvision's C++ op schemas, then imports it
    except ImportError as e:
        raise SystemExit(f"bench_vision: --torchvision needs torchvision ({e}); install it with `pip install --no-deps --target DIR torchvision==0.28.0 pillow` and set TORCHVISION_PATH=DIR")
    chosen = TORCHVISION_MODELS if names == "default" else tuple(n for n in names.split(",") if n)
    unknown = [n for n in chosen if n not in cv.MODELS or cv.MODELS[n].kind != "classification"]
    if unknown:
        raise SystemExit(f"bench_vision: --torchvision: unknown model(s) {', '.join(unknown)}; known: {', '.join(n for n, s in cv.MODELS.items() if s.kind == 'classification')}")
    return {n: (lambda n=n: cv.build(n, cv.MODELS[n])) for n in chosen}

# -- measuring ------------------------------------------------------------------------------------


def randomized(model: nn.Module) -> nn.Module:
    """Random weights and non-trivial batch-norm statistics, in eval mode."""
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)
    return model.eval()


def compile_tilework(model: nn.Module, opt_level: int = 1) -> Any:
    batch = torch.export.Dim("batch", min=1, max=16)
    return tilework.compile(model, (torch.randn(2, 3, 224, 224),), ({0: batch},), opt_level=opt_level)


def onnx_session(model: nn.Module, path: str) -> Any:
    import onnxruntime as ort

    torch.onnx.export(model, (torch.randn(2, 3, 224, 224),), path, input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17, dynamo=False)
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def systems_for(model: nn.Module, use_compile: bool, use_ort: bool, tmp: str) -> tuple[dict[str, Callable[[torch.Tensor], Any]], dict[str, float]]:
    out: dict[str, Callable[[torch.Tensor], Any]] = {}
    compile_s: dict[str, float] = {}
    t = time.perf_counter()
    tw = compile_tilework(model)
    compile_s["tilework"] = time.perf_counter() - t
    out["tilework"] = lambda x: tw(x)

    def eager(x: torch.Tensor) -> Any:
        with torch.no_grad():
            return model(x)

    out["torch eager"] = eager
    if use_compile:
        compiled = torch.compile(model, dynamic=True)

        def tc(x: torch.Tensor) -> Any:
            with torch.no_grad():
                return compiled(x)

        out["torch.compile"] = tc
    if use_ort:
        try:
            t = time.perf_counter()
            sess = onnx_session(model, os.path.join(tmp, "model.onnx"))
            compile_s["onnxruntime"] = time.perf_counter() - t
            out["onnxruntime"] = lambda x: sess.run(None, {"x": x.numpy()})[0]
        except Exception as e:  # an optional peer: report and go on
            print(f"onnxruntime skipped: {e}")
    return out, compile_s


def as_numpy(y: Any) -> np.ndarray:
    if isinstance(y, (list, tuple)):
        y = y[0]
    return y.detach().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--torchvision", default="", metavar="NAMES", help="torchvision's models instead (comma-separated, or 'default'), into the table vision-torchvision; torchvision from TORCHVISION_PATH")
    ap.add_argument("--no-torch-compile", action="store_true", help="skip torch.compile (slow to compile)")
    ap.add_argument("--no-onnxruntime", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    names = ["tilework", "torch eager", "torch.compile", "onnxruntime"]
    tmp = tempfile.mkdtemp()
    builders = torchvision_models(args.torchvision) if args.torchvision else {m: (lambda m=m: randomized(MODELS[m]())) for m in args.models.split(",")}
    for mname, build in builders.items():
        model = build()
        systems, compile_s = systems_for(model, not args.no_torch_compile, not args.no_onnxruntime, tmp)
        print(f"{mname}: tilework compile {compile_s['tilework']:.1f} s", flush=True)
        for b in batches:
            x = torch.randn(b, 3, 224, 224)
            with torch.no_grad():
                ref = model(x).numpy()
            err = float(np.abs(as_numpy(systems["tilework"](x)) - ref).max() / (np.abs(ref).max() + 1e-30))
            timed: dict[str, Callable[[], Any]] = {n: (lambda f=f: f(x)) for n, f in systems.items()}
            ms = median_ms_in_rounds(timed, args.repeat)
            best = min(v for n, v in ms.items() if n != "tilework")
            print(f"{mname} batch {b}: " + ", ".join(f"{n} {v:.1f} ms" for n, v in ms.items()) + f"; tilework / best peer {best / ms['tilework']:.2f}x; max rel error {err:.1e}", flush=True)
            rows.append([mname, str(b)] + [f"{ms[n]:.1f}" if n in ms else "-" for n in names] + [f"{best / ms['tilework']:.2f}x", f"{err:.0e}"])
    head = ["model", "batch"] + [f"{n} ms" for n in names] + ["best peer / tilework", "max rel err"]
    source = "torchvision's constructors (`--torchvision`), " if args.torchvision else ""
    flags = (f" --torchvision {args.torchvision}" if args.torchvision else "") + (" --no-torch-compile" if args.no_torch_compile else "") + (" --no-onnxruntime" if args.no_onnxruntime else "")
    note = f"`python bench/bench_vision.py --repeat {args.repeat}{flags}`: {cpu_model()} ({cpu_features()}), {THREADS} threads each, {source}224x224, random weights, median of {args.repeat} calls (in 3 rounds over the systems)."
    emit("vision-torchvision" if args.torchvision else "vision", note + "\n\n" + table(head, rows))


if __name__ == "__main__":
    main()
