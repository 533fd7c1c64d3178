"""tilework.nn modules without compiling: parameter discovery and naming, state dicts, random
init, and the errors for tensors and parameters used outside an export."""

from __future__ import annotations

import numpy as np
import pytest

from tilework import nn
from tilework.errors import ParameterError, TileworkError


class Block(nn.Module):
    def __init__(self) -> None:
        self.norm = nn.RMSNorm(8)
        self.proj = nn.Linear(8, 4, bias=False)


class Net(nn.Module):
    def __init__(self) -> None:
        self.embed = nn.Embedding(10, 8)
        self.layers = nn.ModuleList([Block(), Block()])
        self.extra = [nn.Linear(4, 4)]  # a plain list of modules counts too
        self._cache = nn.Linear(2, 2)  # private: not part of the model
        self.scale = nn.Parameter((4,), init="ones")
        self.head = nn.Linear(4, 10)


def test_parameter_names_follow_attribute_paths_in_order() -> None:
    names = [n for n, _ in Net().named_parameters()]
    assert names == [
        "embed.weight",
        "layers.0.norm.weight", "layers.0.proj.weight",
        "layers.1.norm.weight", "layers.1.proj.weight",
        "extra.0.weight", "extra.0.bias",
        "scale",
        "head.weight", "head.bias",
    ]  # fmt: skip
    paths = [p for p, _ in Net().named_modules()]
    assert paths == ["", "embed", "layers", "layers.0", "layers.0.norm", "layers.0.proj", "layers.1", "layers.1.norm", "layers.1.proj", "extra.0", "head"]


def test_a_shared_parameter_is_one_parameter_named_by_its_first_path() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            self.embed = nn.Embedding(10, 4)
            self.out = nn.Linear(4, 10, bias=False)
            self.out.weight = self.embed.weight

    m = Tied()
    assert [n for n, _ in m.named_parameters()] == ["embed.weight"]
    m.load_state_dict({"embed.weight": np.ones((10, 4), np.float32)})
    assert m.out.weight.data is not None and m.out.weight.data.sum() == 40


def test_load_state_dict_checks_names_shapes_and_dtypes() -> None:
    m = Block()
    good = {"norm.weight": np.ones(8, np.float64), "proj.weight": np.zeros((4, 8), np.float32)}
    m.load_state_dict(good)
    assert m.norm.weight.data is not None and m.norm.weight.data.dtype == np.float32  # float64 converted
    with pytest.raises(ParameterError, match=r"Block.load_state_dict: missing proj.weight; unexpected proj.bias"):
        Block().load_state_dict({"norm.weight": good["norm.weight"], "proj.bias": np.zeros(4)})
    with pytest.raises(ParameterError, match=r"proj.weight: a value of shape \(8, 4\) for a parameter of shape \(4, 8\)"):
        Block().load_state_dict({**good, "proj.weight": np.zeros((8, 4), np.float32)})
    with pytest.raises(ParameterError, match=r"norm.weight: a int64 value for a float32 parameter"):
        Block().load_state_dict({**good, "norm.weight": np.ones(8, np.int64)})
    fresh = Block()
    with pytest.raises(ParameterError):
        fresh.load_state_dict({**good, "proj.weight": np.zeros((8, 4), np.float32)})
    assert fresh.missing_parameters() == ["norm.weight", "proj.weight"], "a failed load sets nothing"
    partial = Block()
    partial.load_state_dict({"norm.weight": good["norm.weight"]}, strict=False)
    assert partial.missing_parameters() == ["proj.weight"]
    with pytest.raises(ParameterError, match=r"Block: parameter\(s\) without a value: proj.weight; set them with module.load_state_dict"):
        partial.state_dict()


def test_load_state_dict_takes_torch_tensors() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra")
    m = Block()
    w = torch.randn(4, 8, requires_grad=True)
    m.load_state_dict({"norm.weight": torch.ones(8, dtype=torch.bfloat16), "proj.weight": w})
    assert m.norm.weight.data is not None and m.norm.weight.data.dtype == np.float32
    np.testing.assert_array_equal(m.proj.weight.data, w.detach().numpy())  # type: ignore[arg-type]


def test_init_random_uses_each_parameters_init() -> None:
    m = nn.LayerNorm(6)
    m.init_random(seed=1)
    assert m.weight.data is not None and m.bias is not None and m.bias.data is not None
    np.testing.assert_array_equal(m.weight.data, np.ones(6, np.float32))
    np.testing.assert_array_equal(m.bias.data, np.zeros(6, np.float32))
    lin = nn.Linear(3, 5).init_random(seed=1, scale=0.5)
    assert isinstance(lin, nn.Linear) and lin.weight.data is not None
    assert lin.weight.data.shape == (5, 3) and 0 < np.abs(lin.weight.data).max() < 5
    state = lin.state_dict()
    assert list(state) == ["weight", "bias"]


def test_parameter_declaration_errors() -> None:
    with pytest.raises(ParameterError, match="shape must be non-negative ints"):
        nn.Parameter((4, -1))
    with pytest.raises(ParameterError, match="unknown dtype 'float8'"):
        nn.Parameter((4,), "float8")
    with pytest.raises(ParameterError, match="unknown init 'uniform'"):
        nn.Parameter((4,), init="uniform")


def test_tensors_and_modules_need_an_export() -> None:
    lin = nn.Linear(4, 4)
    with pytest.raises(TileworkError, match=r"run only while a module is exported: call module.export\(spec\)"):
        lin.weight + 1.0
    with pytest.raises(TileworkError, match="run only while a module is exported"):
        lin(lin.weight)
    assert "no value" in repr(lin.weight) and "(4, 4) float32" in repr(lin.weight)
