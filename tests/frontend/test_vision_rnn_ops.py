"""The vision and recurrent ops through both frontends, with symbolic dims: transposed
convolution, upsampling (sizes from symbolic sizes), grid sampling, padding in every mode,
instance norm, pixel (un)shuffle, adaptive pools, topk/sort/argsort, embedding bags, weight
norm, binary max/min and LSTM/GRU/RNN. Each small module goes through torch.export and, where
torch's ONNX exporter handles it, through ONNX with dynamic axes; all functions of a frontend are
compiled in one executable and run at sizes including 1 and odd ones against torch eager.

The default run takes the cheaper half (every op family at least once); the cases whose kernels
take long to compile (bicubic sampling, 2-layer bidirectional LSTM, the remaining ONNX paths)
run with TILEWORK_LONG_TESTS=1:

    TILEWORK_LONG_TESTS=1 python -m pytest tests/frontend/test_vision_rnn_ops.py -n 0
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest
from tests.long import LONG

pytest.importorskip("torch", reason="the torch frontend needs torch (an optional extra)")
pytest.importorskip("onnx", reason="the ONNX frontend needs onnx (an optional extra)")
import torch  # noqa: E402

import tilework  # noqa: E402
from tilework.frontend.onnx import from_onnx  # noqa: E402
from tilework.frontend.torch import translate  # noqa: E402
from tilework.ir.module import IRModule  # noqa: E402

F = torch.nn.functional
Dim = torch.export.Dim
N, M = Dim("n", min=1, max=64), Dim("m", min=1, max=64)


class Fn(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any], **mods: Any) -> None:
        super().__init__()
        self.fn = fn
        for k, v in mods.items():
            setattr(self, k, v)

    def forward(self, *xs: Any) -> Any:
        return self.fn(self, *xs)


@dataclass
class Case:
    name: str
    module: torch.nn.Module
    make: Callable[[int, int], tuple[Any, ...]]  # inputs at n, m
    dyn: tuple[dict[int, Any] | None, ...]  # torch.export's dynamic dims per input
    sizes: tuple[tuple[int, int], ...] = ((1, 3), (4, 5), (7, 2))
    onnx: bool | str = "long"  # also through torch.onnx.export (dynamo=False) and from_onnx ("long": only in long runs)
    torch: bool | str = True  # through torch.export (likewise)
    example: tuple[int, int] = (4, 6)
    tol: float = 1e-4
    onnx_axes: list[dict[int, str]] = field(default_factory=list)


def r(*shape: int) -> Any:
    return torch.randn(*shape)


def _pad_to_window(s: Any, x: Any) -> Any:
    """Swin's window padding and shift mask: pads computed from the input's (static) sizes, then
    a slice of a new mask assigned (torch's ONNX exporter reorders the pads with a Transpose, and
    the mask's assignment is a ScatterND that needs the padded shape static)."""
    x = F.pad(x, (0, (4 - x.shape[-1] % 4) % 4, 0, (4 - x.shape[-2] % 4) % 4))
    mask = x.new_zeros(x.shape[-2:])
    mask[-2:, 1:3] = 1.0
    return x + mask


def _slice_assign(s: Any, x: Any) -> Any:
    """Assignments to slices (torch.export writes them as slice_scatter/select_scatter)."""
    y = x.clone()
    y[:, 1:5:2] = x[:, :2] * 2
    y[:, -1] = 0.25
    y[1:, 0] = x[:-1, 3]
    return y


def _cases() -> list[Case]:
    torch.manual_seed(0)
    ct = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
    ct1 = torch.nn.ConvTranspose1d(3, 2, 4, stride=3, dilation=2)
    emb = torch.nn.EmbeddingBag(10, 4, mode="sum")
    emb_mean = torch.nn.EmbeddingBag(10, 4, mode="mean", padding_idx=0)
    emb_max = torch.nn.EmbeddingBag(10, 4, mode="max")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wn = torch.nn.utils.weight_norm(torch.nn.Linear(4, 5))
    hw = {0: Dim("b", min=1, max=8), 2: N, 3: M}
    return [
        Case("conv_transpose", Fn(lambda s, x, y: (s.ct(x), s.ct1(y)), ct=ct, ct1=ct1), lambda n, m: (r(2, 4, n, m), r(2, 3, n + 2)), ({2: N, 3: M}, {2: N + 2}), onnx=True),
        Case("upsample", Fn(lambda s, x: (F.interpolate(x, scale_factor=2), F.interpolate(x, scale_factor=2, mode="bilinear"), F.interpolate(x, scale_factor=3, mode="bilinear", align_corners=True), F.interpolate(x, scale_factor=2, mode="nearest-exact"), F.interpolate(x, scale_factor=2, mode="bicubic"))), lambda n, m: (r(2, 3, n, m),), ({2: N, 3: M},), onnx=False, torch="long"),
        Case("upsample_to", Fn(lambda s, x, y: (F.interpolate(x, size=y.shape[-2:], mode="bilinear", align_corners=True), F.interpolate(x, size=y.shape[-2:]))), lambda n, m: (r(2, 3, n, m), r(1, 1, m + 3, n + 1)), ({2: N, 3: M}, {2: M + 3, 3: N + 1}), onnx=True),
        Case("grid_sample", Fn(lambda s, x, g: (F.grid_sample(x, g, align_corners=False), F.grid_sample(x, g, mode="nearest", padding_mode="border", align_corners=True))), lambda n, m: (r(2, 3, n, m), torch.rand(2, m, 5, 2) * 2.6 - 1.3), ({2: N, 3: M}, {1: M}), onnx=False),
        Case("grid_sample_more", Fn(lambda s, x, g: (F.grid_sample(x, g, mode="bicubic", padding_mode="reflection"), F.grid_sample(x, g, padding_mode="reflection", align_corners=True))), lambda n, m: (r(2, 3, n, m), torch.rand(2, m, 5, 2) * 2.6 - 1.3), ({2: N, 3: M}, {1: M}), onnx=False, torch="long"),
        Case("pad", Fn(lambda s, x: (F.pad(x, (2, 1, 1, 2), mode="reflect"), F.pad(x, (2, 1, 1, 2), mode="replicate"), F.pad(x, (2, 1, 0, 3), mode="circular"), F.pad(x, (1, 2, 3, 0), value=0.5))), lambda n, m: (r(2, 3, n + 2, m + 2),), ({2: N + 2, 3: M + 2},), sizes=((2, 3), (4, 5), (7, 2))),
        Case("norm_shuffle", Fn(lambda s, x: (s.inorm(x), F.instance_norm(x), F.pixel_shuffle(x, 2), F.pixel_unshuffle(F.pixel_shuffle(x, 2), 2)), inorm=torch.nn.InstanceNorm2d(8, affine=True)), lambda n, m: (r(2, 8, n + 1, m),), (hw | {2: N + 1},), sizes=((2, 3), (4, 5), (7, 1))),
        Case("adaptive_pools", Fn(lambda s, x, y: (F.adaptive_avg_pool1d(y, 3), F.adaptive_max_pool2d(x, (2, 3)), F.adaptive_max_pool1d(y, 2))), lambda n, m: (r(2, 3, n + 1, m + 2), r(2, 3, m + 2)), ({2: N + 1, 3: M + 2}, {2: M + 2}), sizes=((2, 3), (4, 5), (7, 2)), onnx=False),
        Case("max_pool_indices", Fn(lambda s, x: (*F.max_pool2d(x, 3, 2, 1, return_indices=True), *F.max_pool2d(x, (2, 3), (1, 2), (1, 1), dilation=(2, 1), ceil_mode=True, return_indices=True))), lambda n, m: (r(2, 3, n + 2, m + 2),), ({2: N + 2, 3: M + 2},), sizes=((2, 2), (4, 5), (7, 3)), onnx=True),
        Case("ordering", Fn(lambda s, x: (*torch.topk(x, 3, dim=-1), *torch.topk(x, 2, dim=0, largest=False), *torch.sort(x, dim=-1, descending=True), torch.argsort(x, dim=0), *torch.sort(x, dim=1, stable=True))), lambda n, m: (r(n, m + 3),), ({0: N, 1: M + 3},), sizes=((2, 3), (4, 5), (7, 2)), onnx=False),
        Case("embedding_bag", Fn(lambda s, i, o, j: (s.e(i, o), s.em(i, o), s.ex(i, o), s.e(j), s.em(j)), e=emb, em=emb_mean, ex=emb_max), lambda n, m: (torch.randint(0, 10, (n + 4,)), torch.tensor([0, 2, 2, n + 1]), torch.randint(0, 10, (m, 3))), ({0: N + 4}, None, {0: M}), sizes=((2, 3), (4, 5), (7, 1)), onnx=False, torch="long"),
        # torch.export narrows m to >= 2 here; torch's ONNX exporter needs dims and |shift| <= the dim's length
        Case("roll", Fn(lambda s, x: (torch.roll(x, 2, 1), torch.roll(x, (-1, 3), (0, 2)), torch.roll(x, -3, -1))), lambda n, m: (r(n, m + 1, 4),), ({0: N, 1: M + 1},), sizes=((1, 3), (4, 2), (7, 5)), onnx=True),
        Case("roll_flat", Fn(lambda s, x: (torch.roll(x, 5), torch.roll(x, -7, 1))), lambda n, m: (r(n, 3),), ({0: N},), onnx=False),
        Case("pad_to_window", Fn(_pad_to_window), lambda n, m: (r(n, 2, 5, 6),), ({0: N},), sizes=((1, 1), (3, 1), (6, 1)), onnx=True),
        Case("slice_assign", Fn(_slice_assign), lambda n, m: (r(n + 1, 6),), ({0: N + 1},), sizes=((2, 1), (3, 1), (6, 1)), onnx=False),  # export narrows n to >= 2; ONNX: ScatterND on symbolic rows is refused
        Case("weight_norm_minmax", Fn(lambda s, x, y: (s.wn(x), torch.max(x, y), torch.min(x, y * 2)), wn=wn), lambda n, m: (r(n, 4), r(n, 4)), ({0: N}, {0: N})),
        Case("lstm", Fn(lambda s, x: s.l(x), l=torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True)), lambda n, m: (r(n, 7, 4),), ({0: N},), sizes=((1, 1), (3, 1), (4, 1)), onnx=False, torch="long"),
        Case("gru_rnn", Fn(lambda s, x: (*s.g(x), *s.rn(x)), g=torch.nn.GRU(4, 3), rn=torch.nn.RNN(4, 3, nonlinearity="relu", bidirectional=True)), lambda n, m: (r(5, n, 4),), ({1: N},), onnx=False),
        # through ONNX the sequence length stays symbolic (torch.export specializes it)
        Case("lstm_gru_seq", Fn(lambda s, x: (*s.l(x)[1], s.g(x)[0]), l=torch.nn.LSTM(4, 5, bidirectional=True), g=torch.nn.GRU(4, 3)), lambda n, m: (r(n, m, 4),), ({1: M},), sizes=((1, 2), (5, 3), (2, 1)), torch=False, onnx=True, example=(6, 2)),
    ]  # fmt: skip


CASES = _cases()


def _export(case: Case) -> Any:
    return torch.export.export(case.module.eval(), case.make(*case.example), dynamic_shapes=(case.dyn,), strict=False)


def _onnx_bytes(case: Case) -> bytes:
    example = case.make(*case.example)
    other = case.make(case.example[0] + 1, case.example[1] + 1)
    names = [f"x{i}" for i in range(len(example))]
    axes = {nm: {k: f"{nm}_{k}" for k in range(a.dim()) if a.shape[k] != b.shape[k]} for nm, a, b in zip(names, example, other)}
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(case.module.eval(), example, f, input_names=names, dynamic_axes=axes, opset_version=17, dynamo=False)
    return f.getvalue()


@pytest.fixture(scope="module")
def compiled() -> dict[tuple[str, str], Any]:
    """Every case through both frontends, compiled together: one function per case and frontend."""
    funcs, weights = {}, {}
    def wanted(flag: bool | str) -> bool:
        return flag is True or (flag == "long" and LONG)

    for case in CASES:
        if wanted(case.torch):
            tr = translate(_export(case))
            funcs[f"t_{case.name}"] = tr.module["main"]
            weights[("torch", case.name)] = [a for _, a in tr.weights]
        if wanted(case.onnx):
            funcs[f"o_{case.name}"] = from_onnx(_onnx_bytes(case))["main"]
            weights[("onnx", case.name)] = []
    vm = tilework.VM(tilework.build(IRModule(funcs)))
    return {key: (vm[("t_" if key[0] == "torch" else "o_") + key[1]], w) for key, w in weights.items()}


def _flat(v: Any) -> list[Any]:
    return [x for item in v for x in _flat(item)] if isinstance(v, (tuple, list)) else [v]


@pytest.mark.parametrize("frontend", ["torch", "onnx"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_torch(compiled: dict[tuple[str, str], Any], case: Case, frontend: str) -> None:
    if (frontend, case.name) not in compiled:
        why = "a long case: set TILEWORK_LONG_TESTS=1" if getattr(case, frontend) == "long" else "not through this frontend (torch's ONNX exporter refuses the module, or torch.export specializes its dims)"
        pytest.skip(why)
    fn, weights = compiled[(frontend, case.name)]
    for k, (n, m) in enumerate(case.sizes):
        torch.manual_seed(10 + k)
        inputs = case.make(n, m)
        with torch.no_grad():
            want = _flat(case.module(*inputs))
        got = _flat(fn(*[x.numpy() for x in inputs], *weights))
        assert len(got) == len(want)
        for i, (g, w_) in enumerate(zip(got, want)):
            w_ = w_.numpy()
            where = f"{case.name} ({frontend}) output {i} at n={n}, m={m}"
            assert g.shape == w_.shape, f"{where}: {g.shape}, torch {w_.shape}"
            if w_.dtype.kind == "f":
                np.testing.assert_allclose(g, w_, rtol=case.tol, atol=case.tol, err_msg=where)
            else:
                np.testing.assert_array_equal(g, w_, err_msg=where)


def test_rnn_sequence_length_stays_symbolic() -> None:
    """An LSTM and a GRU from ONNX keep the time dim symbolic: one ``rnn`` op per direction
    loops over it, and the outputs carry it."""
    case = next(c for c in CASES if c.name == "lstm_gru_seq")
    text = str(from_onnx(_onnx_bytes(case)))
    assert text.count("= rnn(") == 3  # LSTM forward and reverse, GRU
    assert 'Tensor((x0_0, x0_1, 3), "float32")' in text.splitlines()[1]  # the GRU's output: [time, batch, 3]
