"""layout_weights: linear weights (constants, and with ``params=True`` the trailing weight params
of main) are packed once in column panels for ``linear_io``; the numerics equal the
unoptimized module's at symbolic row counts 1, odd ones and ones past a register tile."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tests.transform.util import ir, run
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Binding, Call, Constant, GraphFunc, OpRef, Var, bindings_of
from tilework.ir.info import TensorInfo
from tilework.transform.layout_weights import ATTR, PANEL, TRANSPOSED, LayoutWeights, lay_out, pack_weights, packed_shape

ROWS = (1, 3, 7, 8, 13, 40)


def _ops(mod: tw.IRModule) -> list[str]:
    f = mod["main"]
    assert isinstance(f, GraphFunc)
    return [b.value.callee.name for b in bindings_of(f) if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)]


def _agree(mod: tw.IRModule, after: tw.IRModule, weights: list[np.ndarray], xs: list[np.ndarray], out_features: int) -> None:
    """``after`` (weights packed by ``pack_weights``) computes what ``mod`` does for each input."""
    laid = pack_weights(after, weights)
    before_fn, after_fn = tw.VM(tw.build(mod))["main"], tw.VM(tw.build(after))["main"]
    for x in xs:
        got = after_fn(x, *laid)
        assert got.shape == (*x.shape[:-1], out_features)
        np.testing.assert_allclose(got, before_fn(x, *weights), rtol=1e-5, atol=1e-5)


def test_weights_are_packed_in_column_panels() -> None:
    w = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)  # [out, in]
    wp = lay_out(w, panel=2)
    assert wp.shape == (3, 3, 2) and wp.flags.c_contiguous
    for j in range(5):
        np.testing.assert_array_equal(wp[j // 2, :, j % 2], w[j])
    assert not wp[2, :, 1].any()  # past out_features: zeros
    assert lay_out(np.ones((70, 9), np.float32)).shape == (-(-70 // PANEL), 9, PANEL)


MLP_PARAMS = """
@graph(attrs={"num_inputs": 1})
def main(x: Tensor((n, 24), "float32"), w1: Tensor((40, 24), "float32"), b1: Tensor((40,), "float32"), w2: Tensor((9, 40), "float32"), b2: Tensor((9,), "float32"), s: Tensor((9,), "float32")):
    n = sym(lo=1)
    with dataflow():
        h = linear(x, w1, b1)
        a = silu(h)
        y = linear(a, w2)
        z = add(y, b2)
        gv = add(z, s)
        output(gv)
    return gv
"""


def _mlp_weights(rng: np.random.Generator) -> list[np.ndarray]:
    shapes = [(40, 24), (40,), (9, 40), (9,), (9,)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def test_weight_params_are_laid_out_once_and_compute_the_same() -> None:
    mod = ir(MLP_PARAMS)
    after = LayoutWeights(params=True)(mod)
    main = after["main"]
    assert isinstance(main, GraphFunc)
    assert main.attrs[ATTR] == (1, 3)  # w1 and w2; biases and the residual s stay
    assert [p.info.shape for p in main.params if isinstance(p.info, TensorInfo)][1:4] == [packed_shape(40, 24), (40,), packed_shape(9, 40)]
    assert _ops(after).count("linear_io") == 2 and "linear" not in _ops(after)
    rng = np.random.default_rng(0)
    weights = _mlp_weights(rng)
    laid = pack_weights(after, weights)
    assert laid[0].shape == packed_shape(40, 24) and laid[2].shape == packed_shape(9, 40) and laid[1] is weights[1]
    exe_before, exe_after = tw.build(mod), tw.build(after)
    for rows in ROWS:
        x = rng.standard_normal((rows, 24)).astype(np.float32)
        want = tw.VM(exe_before)["main"](x, *weights)
        got = tw.VM(exe_after)["main"](x, *laid)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_constants_are_laid_out_at_compile_time_once_each() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((33, 16)).astype(np.float32)
    bias = rng.standard_normal(33).astype(np.float32)
    bb = BlockBuilder()
    x = Var("x", TensorInfo((tw.dim("n", min=1), 5, 16), "float32"))
    wc, bc = Constant.of(w, name="w"), Constant.of(bias, name="b")
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(tw.op.linear(x, wc, bc))
            g = bb.emit(tw.op.linear(x, wc))  # the same constant: one laid-out copy
            out = bb.emit_output(tw.op.add(h, g))
        bb.emit_func_output(out)
    mod = bb.get()
    after = LayoutWeights()(mod)
    consts = {id(b.value.args[1]): b.value.args[1] for b in bindings_of(after["main"]) if isinstance(b, Binding) and isinstance(b.value, Call) and b.value.args and isinstance(b.value.args[1], Constant)}  # type: ignore[arg-type]
    assert len(consts) == 1
    (c,) = consts.values()
    assert c.data.shape == packed_shape(33, 16)
    np.testing.assert_array_equal(c.data, lay_out(w))
    for rows in (1, 2, 9):
        xv = rng.standard_normal((rows, 5, 16)).astype(np.float32)
        np.testing.assert_allclose(run(after, [xv]), run(mod, [xv]), rtol=1e-5, atol=1e-5)


def test_params_read_other_than_as_a_linear_weight_and_narrow_types_stay() -> None:
    text = """
    @graph(attrs={"num_inputs": 1})
    def main(x: Tensor((n, 8), "float32"), w: Tensor((8, 8), "float32"), v: Tensor((4, 8), "float16"), xh: Tensor((2, 8), "float16")):
        n = sym(lo=1)
        with dataflow():
            y = linear(x, w)
            z = add(y, w)
            q = linear(xh, v)
            output(z, q)
        return (z, q)
    """
    mod = ir(text)
    after = LayoutWeights(params=True)(mod)
    assert ATTR not in after["main"].attrs  # type: ignore[union-attr]
    assert _ops(after) == _ops(mod)


def test_compile_lays_out_torch_weights_and_saves_them(tmp_path: object) -> None:
    torch = pytest.importorskip("torch")

    class MLP(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.l1, self.l2 = torch.nn.Linear(32, 72), torch.nn.Linear(72, 24)

        def forward(self, x: object) -> object:
            return self.l2(torch.nn.functional.silu(self.l1(x))) + x[..., :24]  # type: ignore[index]

    torch.manual_seed(0)
    model = MLP().eval()
    n = torch.export.Dim("n", min=1, max=64)
    cm = tw.compile(model, (torch.randn(4, 32),), ({0: n},))
    assert "layout_weights" in cm.report["passes"]["graph"]
    assert sorted(w.shape for w in cm.weights if w.ndim == 3) == sorted([packed_shape(72, 32), packed_shape(24, 72)])
    path = str(tmp_path) + "/mlp.tw"
    cm.save(path)
    loaded = tw.CompiledModel.load(path)
    for rows in (1, 5, 8, 33):
        x = torch.randn(rows, 32)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(cm(x).numpy(), want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(loaded(x).numpy(), want, rtol=1e-4, atol=1e-4)


MATMUL_PARAMS = """
@graph(attrs={"num_inputs": 1})
def main(x: Tensor((b, n, 24), "float32"), w1: Tensor((24, 40), "float32"), b1: Tensor((40,), "float32"), w2: Tensor((40, 9), "float32"), v: Tensor((9,), "float32")):
    b = sym(lo=0)
    n = sym(lo=0)
    with dataflow():
        h = matmul(x, w1)
        a = add(h, b1)
        y = matmul(a, w2)
        z = add(y, v)
        output(z)
    return z
"""


def test_matmul_weights_in_in_out_layout_become_packed_linears() -> None:
    """ONNX's ``MatMul`` by an ``[in, out]`` weight: the param is transposed and packed once
    (both listed in main's attrs); a param also read elsewhere stays a matmul operand."""
    mod = ir(MATMUL_PARAMS)
    after = LayoutWeights(params=True)(mod)
    main = after["main"]
    assert isinstance(main, GraphFunc)
    assert main.attrs[TRANSPOSED] == (1, 3) and main.attrs[ATTR] == (1, 3)
    assert _ops(after).count("linear_io") == 2 and "matmul" not in _ops(after)
    rng = np.random.default_rng(2)
    weights = [rng.standard_normal(s).astype(np.float32) for s in [(24, 40), (40,), (40, 9), (9,)]]
    np.testing.assert_array_equal(pack_weights(after, weights)[0], lay_out(weights[0].T))
    _agree(mod, after, weights, [rng.standard_normal((b, n, 24)).astype(np.float32) for b, n in ((1, 1), (0, 3), (2, 0), (3, 7), (2, 33))], 9)


def test_matmul_by_a_constant_is_transposed_once_and_other_matmuls_stay() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 33)).astype(np.float32)  # [in, out]
    bb = BlockBuilder()
    x = Var("x", TensorInfo((tw.dim("n", min=1), 16), "float32"))
    y = Var("y", TensorInfo((33, 4), "float32"))
    wc = Constant.of(w, name="w")
    with bb.function("main", [x, y]):
        with bb.dataflow():
            h = bb.emit(tw.op.matmul(x, wc))
            g = bb.emit(tw.op.matmul(x, wc))
            s = bb.emit(tw.op.add(h, g))
            out = bb.emit_output(tw.op.matmul(s, y))  # activations on both sides: a matmul
        bb.emit_func_output(out)
    mod = bb.get()
    after = LayoutWeights()(mod)
    assert _ops(after).count("linear_io") == 2 and _ops(after).count("matmul") == 1
    consts = {id(b.value.args[1]) for b in bindings_of(after["main"]) if isinstance(b, Binding) and isinstance(b.value, Call) and b.value.args and isinstance(b.value.args[1], Constant)}  # type: ignore[arg-type]
    assert len(consts) == 1
    yv = rng.standard_normal((33, 4)).astype(np.float32)
    for rows in (1, 2, 9):
        xv = rng.standard_normal((rows, 16)).astype(np.float32)
        np.testing.assert_allclose(run(after, [xv, yv]), run(mod, [xv, yv]), rtol=1e-4, atol=1e-4)


BIAS_ADDS = """
@graph(attrs={"num_inputs": 1})
def main(x: Tensor((n, 24), "float32"), w1: Tensor((24, 40), "float32"), b1: Tensor((40,), "float32"), w2: Tensor((40, 9), "float32"), b2: Tensor((9,), "float32"), w3: Tensor((9, 9), "float32"), r: Tensor((1, 9), "float32")):
    n = sym(lo=0)
    with dataflow():
        h = matmul(x, w1)
        a = add(b1, h)
        y = matmul(a, w2)
        z = add(y, b2)
        u = multiply(y, z)
        p = matmul(u, w3)
        q = add(p, r)
        output(q)
    return q
"""


def test_a_bias_added_after_a_product_becomes_the_linears_bias() -> None:
    """ONNX's ``MatMul`` then ``Add`` of the bias (either order) is one linear with its bias, as
    torch.export gives it; the add stays where the product is read elsewhere too (``y``) or the
    addend is not a vector of the out features (``r``: ``[1, 9]``)."""
    mod = ir(BIAS_ADDS)
    after = LayoutWeights(params=True)(mod)
    linears = [b.value for b in bindings_of(after["main"]) if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef) and b.value.callee.name == "linear_io"]  # type: ignore[arg-type]
    assert [len(c.args) for c in linears] == [3, 2, 2]
    assert _ops(after).count("add") == 2 and "matmul" not in _ops(after)
    rng = np.random.default_rng(4)
    weights = [rng.standard_normal(s).astype(np.float32) for s in [(24, 40), (40,), (40, 9), (9,), (9, 9), (1, 9)]]
    _agree(mod, after, weights, [rng.standard_normal((n, 24)).astype(np.float32) for n in (0, 1, 7, 33)], 9)


def test_a_bias_fold_takes_the_side_nothing_else_reads() -> None:
    """``add(y, z)`` of two linears, ``y`` (``[n, 9]``) read again later and ``z`` a vector of 9
    read once: ``z`` is not folded into a second copy of ``y``'s product."""
    text = """
    @graph(attrs={"num_inputs": 2})
    def main(x: Tensor((n, 24), "float32"), v: Tensor((24,), "float32"), w1: Tensor((9, 24), "float32"), w2: Tensor((9, 24), "float32")):
        n = sym(lo=0)
        with dataflow():
            y = linear(x, w1)
            z = linear(v, w2)
            s = add(y, z)
            t = multiply(s, y)
            output(t)
        return t
    """
    mod = ir(text)
    after = LayoutWeights(params=True)(mod)
    assert _ops(after).count("linear_io") == 2 and "add" in _ops(after)
