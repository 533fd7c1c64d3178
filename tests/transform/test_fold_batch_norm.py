"""fold_batch_norm: an inference batch norm after a conv folds into the conv's weight and bias,
from constants (the pass) or from the values of main's weight params (``fold_batch_norm(mod,
weights)``, what ``tilework.compile`` does). Numerics against the unfolded module at symbolic
batch 0, 1 and odd sizes and odd spatial sizes, over stride/padding/groups/dilation variants
with and without a conv bias, with non-trivial running statistics; through torch.export too."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tests.transform.util import ir, run
from tilework.ir.graph import Binding, Call, Constant, GraphFunc, OpRef, bindings_of
from tilework.ir.visitor import substitute
from tilework.transform.rewrite_driver import apply_rules
from tilework.transform.fold_batch_norm import FoldBatchNorm, fold_batch_norm

# four convs on one input: strided and padded with a bias, grouped and dilated without,
# depthwise with asymmetric padding, and one whose result is also read elsewhere (not folded)
CONVS = """
@graph(attrs={"num_inputs": 1})
def main(x: Tensor((n, 6, h, w), "float32"), w1: Tensor((8, 6, 3, 3), "float32"), c1: Tensor((8,), "float32"), w2: Tensor((4, 3, 3, 2), "float32"), w3: Tensor((6, 1, 5, 5), "float32"), w4: Tensor((5, 6, 1, 1), "float32"), m: Tensor((8,), "float32"), v: Tensor((8,), "float32"), g: Tensor((8,), "float32"), b: Tensor((8,), "float32"), m2: Tensor((4,), "float32"), v2: Tensor((4,), "float32"), g2: Tensor((4,), "float32"), b2: Tensor((4,), "float32"), m3: Tensor((6,), "float32"), v3: Tensor((6,), "float32"), g3: Tensor((6,), "float32"), b3: Tensor((6,), "float32"), m4: Tensor((5,), "float32"), v4: Tensor((5,), "float32"), g4: Tensor((5,), "float32"), b4: Tensor((5,), "float32")):
    n = sym(lo=0, hi=16)
    h = sym(lo=5, hi=64)
    w = sym(lo=6, hi=64)
    with dataflow():
        y1 = conv2d(x, w1, c1, strides=[2, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1)
        z1 = batch_norm(y1, m, v, g, b, axis=1, eps=1e-3)
        y2 = conv2d(x, w2, strides=[1, 1], padding=[0, 1, 0, 1], dilation=[2, 1], groups=2)
        z2 = batch_norm(y2, m2, v2, g2, b2, axis=1, eps=1e-5)
        y3 = conv2d(x, w3, strides=[1, 2], padding=[2, 1, 2, 3], dilation=[1, 1], groups=6)
        z3 = batch_norm(y3, m3, v3, g3, b3, axis=1, eps=1e-5)
        y4 = conv2d(x, w4, strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1)
        z4 = batch_norm(y4, m4, v4, g4, b4, axis=1, eps=1e-5)
        r4 = relu(y4)
        gv = (z1, z2, z3, z4, r4)
        output(gv)
    return gv
"""


def _ops(mod: tw.IRModule) -> list[str]:
    f = mod["main"]
    assert isinstance(f, GraphFunc)
    return [b.value.callee.name for b in bindings_of(f) if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)]


def _weights(rng: np.random.Generator) -> list[np.ndarray]:
    out = [rng.standard_normal(s).astype(np.float32) for s in ((8, 6, 3, 3), (8,), (4, 3, 3, 2), (6, 1, 5, 5), (5, 6, 1, 1))]
    for c in (8, 4, 6, 5):  # running mean, running var, gamma, beta: far from the identity
        out += [rng.uniform(-1, 1, c), rng.uniform(0.2, 3, c), rng.uniform(-2, 2, c), rng.uniform(-1, 1, c)]
    return [a.astype(np.float32) for a in out]


def test_weight_params_fold_and_compute_the_same() -> None:
    rng = np.random.default_rng(0)
    mod, weights = ir(CONVS), _weights(rng)
    folded, new = fold_batch_norm(mod, weights)
    assert _ops(folded).count("batch_norm") == 1  # the fourth conv's result is read twice
    main = folded["main"]
    assert isinstance(main, GraphFunc)
    assert [tuple(p.info.shape) for p in main.params[1:]] == [w.shape for w in new]  # type: ignore[union-attr]
    assert len(new) == len(weights) - 3 * 5 - 1 + 3 * 2  # w1, c1, w2, w3 and 3 x 4 statistics go, 3 x 2 folded arrays come
    exe_ref, exe = tw.build(mod), tw.build(folded)
    for n, h, w in ((0, 7, 9), (1, 5, 6), (3, 11, 8)):
        x = rng.standard_normal((n, 6, h, w)).astype(np.float32)
        want = tw.VM(exe_ref)["main"](x, *weights)
        got = tw.VM(exe)["main"](x, *new)
        for a, b in zip(got, want):
            assert np.asarray(a).shape == np.asarray(b).shape
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


def test_constants_fold_in_the_pass() -> None:
    rng = np.random.default_rng(1)
    mod, weights = ir(CONVS), _weights(rng)
    main = mod["main"]
    assert isinstance(main, GraphFunc)
    consts = {p: Constant.of(a) for p, a in zip(main.params[1:], weights)}
    bound = apply_rules(mod.with_func("main", main.replace(params=main.params[:1], body=substitute(main.body, consts))), [])  # infos re-inferred
    after = FoldBatchNorm()(bound)
    assert _ops(after).count("batch_norm") == 1
    x = rng.standard_normal((2, 6, 9, 7)).astype(np.float32)
    for a, b in zip(run(after, [x]), run(bound, [x])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


def test_nothing_folds_without_values() -> None:
    mod = ir(CONVS)
    assert _ops(FoldBatchNorm()(mod)).count("batch_norm") == 4  # params without values stay
    folded, new = fold_batch_norm(mod, [])
    assert _ops(folded).count("batch_norm") == 4 and new == []


torch = pytest.importorskip("torch", reason="the torch frontend needs torch (an optional extra)")


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 2, dilation=2, groups=8), nn.BatchNorm2d(8, eps=1e-3), nn.Hardswish())
        self.c = nn.Sequential(nn.Conv2d(8, 6, 1), nn.BatchNorm2d(6))
        self.d = nn.Sequential(nn.Conv1d(6, 4, 3, padding=1), nn.BatchNorm1d(4))
        for m in self.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.3, 2.0)
                m.weight.data.uniform_(-1.5, 1.5)
                m.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x: "torch.Tensor") -> "torch.Tensor":
        y = self.c(self.b(self.a(x)))
        return self.d(y.flatten(2)).sum(-1)


def test_through_torch_export() -> None:
    torch.manual_seed(0)
    net = _Net().eval()
    n = torch.export.Dim("n", min=1, max=16)
    ex = (torch.randn(2, 3, 13, 11),)
    cm = tw.compile(net, ex, ({0: n, 2: torch.export.Dim("h", min=5, max=32), 3: torch.export.Dim("w", min=5, max=32)},))
    assert "batch_norm" not in [op for op, _ in cm.report["graph"]["ops"]]
    assert len(cm.weights) == 8  # a folded weight and bias per conv
    for b, h, w in ((1, 13, 11), (3, 9, 7)):
        x = torch.randn(b, 3, h, w)
        with torch.no_grad():
            want = net(x).numpy()
        np.testing.assert_allclose(np.asarray(cm(x)), want, rtol=1e-4, atol=1e-4)
