"""Exporting tilework.nn modules: the functions they become, the Tensor proxy's operations,
errors raised in forward (naming the module and the shapes), and compiling with weights passed
by the compiled model, checked against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tilework import nn
from tilework.errors import InferenceError, ParameterError, ShapeError, SpecError, TileworkError, UnsupportedError
from tilework.ir.graph import Binding, Call, Constant, GraphFunc, OpRef, bindings_of
from tilework.ir.info import TensorInfo, TupleInfo
from tilework.ir.structural import assert_structural_equal
from tilework.ir.sym import SymVar


class MLP(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.down(nn.silu(self.up(x)))


def _main(mod: tw.IRModule, name: str = "forward") -> GraphFunc:
    f = mod[name]
    assert isinstance(f, GraphFunc)
    return f


def _ops(f: GraphFunc) -> list[str]:
    return [b.value.callee.name for b in bindings_of(f) if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)]


def _shapes(info: object) -> list[tuple]:
    assert isinstance(info, TupleInfo)
    out = []
    for f in info.fields:
        assert isinstance(f, TensorInfo) and f.shape is not None
        out.append(f.shape)
    return out


def test_export_takes_inputs_then_parameters() -> None:
    mod, names = MLP(64, 256).export({"forward": {"x": nn.spec.Tensor(["batch", "seq", 64], "float32")}}, dim_bounds={"seq": 4096})
    f = _main(mod)
    assert names == ["up.weight", "up.bias", "down.weight", "down.bias"]
    assert [p.name for p in f.params] == ["x", "up_weight", "up_bias", "down_weight", "down_bias"]
    assert f.attrs["num_inputs"] == 1
    batch, seq, _ = f.params[0].info.shape  # type: ignore[attr-defined, misc]
    assert (batch.lo, batch.hi, seq.lo, seq.hi) == (1, None, 1, 4096)
    assert f.ret_info == TensorInfo((batch, seq, 64), "float32")
    assert _ops(f) == ["linear", "silu", "linear"]
    text = str(mod)
    assert "up: Tensor((batch, seq, 256), \"float32\") = linear(x, up_weight, up_bias)" in text
    assert_structural_equal(tw.parse(text), mod)
    tw.verify(mod)


class Shapes(nn.Module):
    """Every Tensor-proxy operation, returned as a tuple so the struct info can be read."""

    def __init__(self) -> None:
        self.w = nn.Parameter((8, 8))

    def forward(self, x: nn.Tensor, ids: nn.Tensor) -> tuple[nn.Tensor, ...]:
        b, s, d = x.shape
        heads = x.reshape(b, s, 2, d // 2)
        return (
            1.0 - (x + np.float64(2.0)) * x / 3.0,  # scalars take x's dtype
            -(x @ self.w) ** 2.0,
            heads.permute(0, 2, 1, 3),
            heads.transpose(1, 2).reshape((b, s, -1)),
            x[:, -1],  # the last position, symbolic seq
            x[..., : s - 1, 2:6:2],
            x[0, 1:],
            ids.astype("float32"),
            nn.softmax(x, axis=-1) + np.ones(8, np.float32),  # an array operand is a constant
        )


def test_tensor_operations_and_indexing_have_symbolic_shapes() -> None:
    mod, _ = Shapes().export({"x": nn.spec.Tensor([2, "s", 8]), "ids": nn.spec.Tensor(["s"], "int64")})
    f = _main(mod)
    s = f.params[0].info.shape[1]  # type: ignore[attr-defined]
    assert isinstance(s, SymVar)
    got = _shapes(f.ret_info)
    assert got == [(2, s, 8), (2, s, 8), (2, 2, s, 4), (2, s, 8), (2, 8), (2, s - 1, 2), (s - 1, 8), (s,), (2, s, 8)]
    ops = _ops(f)
    assert ops.count("take") == 2 and ops.count("strided_slice") == 2 and "matmul" in ops and "power" in ops
    consts = [a for b in bindings_of(f) if isinstance(b.value, Call) for a in b.value.args if isinstance(a, Constant)]
    assert {str(c.data.dtype) for c in consts} == {"float32", "int64"}  # scalars as x's dtype, take indices int64


def test_index_and_operator_errors() -> None:
    class Bad(nn.Module):
        def __init__(self, how: str) -> None:
            self.how = how

        def forward(self, x: nn.Tensor) -> nn.Tensor:
            if self.how == "range":
                return x[0, 4]
            if self.how == "many":
                return x[0, 0, 0]
            if self.how == "float_int":
                return x.astype("int32") * 0.5
            if self.how == "bool":
                return x if x else x
            return x[x]

    spec = {"x": nn.spec.Tensor([2, 3])}
    with pytest.raises(ShapeError, match=r"in Bad \(the exported module\).forward\(x: \(2, 3\) float32\): index 4 is out of range for axis 1"):
        Bad("range").export(spec)
    with pytest.raises(ShapeError, match=r"too many indices \(3\)"):
        Bad("many").export(spec)
    with pytest.raises(InferenceError, match="cannot combine a int32 tensor with the float 0.5"):
        Bad("float_int").export(spec)
    with pytest.raises(TileworkError, match="has no truth value while tracing"):
        Bad("bool").export(spec)
    with pytest.raises(ShapeError, match="unsupported index"):
        Bad("gather").export(spec)


class Stack(nn.Module):
    def __init__(self) -> None:
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(6, 8)])

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_shape_error_names_the_innermost_module_and_its_argument_shapes() -> None:
    with pytest.raises(ShapeError) as info:
        Stack().export({"x": nn.spec.Tensor(["n", 8])})
    msg = str(info.value)
    assert msg == "in Linear 'layers.2'.forward(x: (n, 8) float32): the last dim of the input (in_features) is 8, expected 6"

    class Adder(nn.Module):
        def forward(self, x: nn.Tensor, y: nn.Tensor) -> nn.Tensor:
            return x + y

    with pytest.raises(ShapeError, match=r"^in Adder \(the exported module\).forward\(x: \(n, 4\) float32, y: \(n, 5\) float32\): add: shapes \(n, 4\) and \(n, 5\) do not broadcast"):
        Adder().export({"x": nn.spec.Tensor(["n", 4]), "y": nn.spec.Tensor(["n", 5])})

    class Embed(nn.Module):
        def __init__(self) -> None:
            self.tok = nn.Embedding(10, 4)

        def forward(self, ids: nn.Tensor) -> nn.Tensor:
            return self.tok(ids)

    with pytest.raises(InferenceError, match=r"in Embedding 'tok'.forward\(ids: \(n,\) float32\): embedding ids must be an integer tensor"):
        Embed().export({"ids": nn.spec.Tensor(["n"])})


def test_parameters_and_results_must_belong_to_the_export() -> None:
    stray = nn.Parameter((4,))

    class UsesStray(nn.Module):
        def forward(self, x: nn.Tensor) -> nn.Tensor:
            return x * stray

    class ReturnsShape(nn.Module):
        def forward(self, x: nn.Tensor) -> object:
            return x.shape

    with pytest.raises(ParameterError, match=r"a Parameter \(4,\) float32 that is not reachable from the exported module"):
        UsesStray().export({"x": nn.spec.Tensor([4])})
    with pytest.raises(TileworkError, match=r"ReturnsShape.forward must return an nn.Tensor or a tuple of them, got tuple"):
        ReturnsShape().export({"x": nn.spec.Tensor([4])})


def test_weights_as_constants_need_values() -> None:
    m = MLP(4, 8)
    with pytest.raises(ParameterError, match=r"MLP: parameter\(s\) without a value: up.weight, up.bias, down.weight, down.bias"):
        m.export({"x": nn.spec.Tensor(["n", 4])}, weights="constants")
    m.init_random(seed=0)
    mod, names = m.export({"x": nn.spec.Tensor(["n", 4])}, weights="constants")
    f = _main(mod)
    assert [p.name for p in f.params] == ["x"] and f.attrs["num_inputs"] == 1 and len(names) == 4
    assert_structural_equal(tw.parse(str(mod)), mod)


def _mlp_ref(m: MLP, x: np.ndarray) -> np.ndarray:
    w1, b1, w2, b2 = (m.state_dict()[k].astype(np.float64) for k in ("up.weight", "up.bias", "down.weight", "down.bias"))
    h = x.astype(np.float64) @ w1.T + b1
    h = h / (1 + np.exp(-h))
    return h @ w2.T + b2  # type: ignore[no-any-return]


def test_compile_passes_the_weights_and_runs_every_shape() -> None:
    m = MLP(16, 32).init_random(seed=3, scale=0.3)
    spec = {"x": nn.spec.Tensor(["batch", "seq", 16])}
    cm = m.compile(spec, dim_bounds={"seq": 64})
    cm2 = tw.compile(m, {"x": nn.spec.Tensor(["batch", tw.dim("seq", max=64), 16])})
    rng = np.random.default_rng(0)
    for shape in ((1, 1, 16), (2, 7, 16), (3, 64, 16)):
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(cm(x), _mlp_ref(m, x), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(cm2(x=x), _mlp_ref(m, x), rtol=1e-5, atol=1e-5)
    assert "seq          1 <= seq <= 64" in cm.explain() and "x.shape[1]" in cm.explain()
    with pytest.raises(tw.TileworkError):
        cm(np.zeros((1, 65, 16), np.float32))  # seq is bounded by 64
    torch = pytest.importorskip("torch", reason="torch is an optional extra")
    out = cm(torch.ones(1, 3, 16))
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (1, 3, 16)


def test_compile_errors() -> None:
    m = MLP(4, 8)
    with pytest.raises(ParameterError, match=r"parameter\(s\) without a value: up.weight"):
        m.compile({"x": nn.spec.Tensor(["n", 4])})
    m.init_random()
    with pytest.raises(SpecError, match="needs the spec of its inputs"):
        m.compile()
    with pytest.raises(UnsupportedError, match="dynamic_shapes is for torch models"):
        tw.compile(m, {"x": nn.spec.Tensor(["n", 4])}, dynamic_shapes={"x": {0: "n"}})
    with pytest.raises(SpecError, match="compiles forward only"):
        tw.compile(m, {"other": {"x": nn.spec.Tensor(["n", 4])}})
