"""Input specs: their errors, and how named dims become sym vars (shared within a method, one
set per method, bounded by dim_bounds)."""

from __future__ import annotations

import pytest

import tilework as tw
from tilework import nn
from tilework.errors import SpecError
from tilework.ir.graph import GraphFunc
from tilework.ir.info import TensorInfo
from tilework.ir.sym import SymVar


class Pair(nn.Module):
    """Two inputs that share a dim, a second method, and an argument with a default."""

    def __init__(self) -> None:
        self.w = nn.Parameter((4,), init="ones")

    def forward(self, x: nn.Tensor, y: nn.Tensor, scale: float = 2.0) -> nn.Tensor:
        return (x * y) * scale

    def project(self, x: nn.Tensor) -> nn.Tensor:
        return x * self.w


def _func(mod: tw.IRModule, name: str) -> GraphFunc:
    f = mod[name]
    assert isinstance(f, GraphFunc)
    return f


def _shape(info: object) -> tuple:
    assert isinstance(info, TensorInfo) and info.shape is not None
    return info.shape


def test_a_name_is_one_sym_var_per_method() -> None:
    spec = {
        "forward": {"x": nn.spec.Tensor(["n", 4]), "y": nn.spec.Tensor(["n", 1])},
        "project": {"x": nn.spec.Tensor(["n", 4])},
    }
    mod, names = Pair().export(spec, dim_bounds={"n": (2, 64)})
    assert names == ["w"]
    fwd, proj = _func(mod, "forward"), _func(mod, "project")
    assert [p.name for p in fwd.params] == ["x", "y", "w"] and fwd.attrs["num_inputs"] == 2
    nx, ny = _shape(fwd.params[0].info)[0], _shape(fwd.params[1].info)[0]
    assert isinstance(nx, SymVar) and nx is ny and (nx.name, nx.lo, nx.hi) == ("n", 2, 64)
    n_proj = _shape(proj.params[0].info)[0]
    assert isinstance(n_proj, SymVar) and n_proj is not nx and (n_proj.lo, n_proj.hi) == (2, 64)
    assert _shape(fwd.ret_info) == (nx, 4) and _shape(proj.ret_info) == (n_proj, 4)
    tw.verify(mod)


def test_forward_shorthand_bounds_and_sym_vars() -> None:
    seq = tw.dim("seq", max=128)
    mod, _ = Pair().export({"x": nn.spec.Tensor([seq, "d"]), "y": nn.spec.Tensor([seq, 1])}, dim_bounds={"d": 4})
    fwd = _func(mod, "forward")
    s, d = _shape(fwd.params[0].info)
    assert s is seq and isinstance(d, SymVar) and (d.lo, d.hi) == (1, 4)
    assert list(mod) == ["forward"]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: nn.spec.Tensor(["seq len", 4]), "spec dim name 'seq len' is not a Python identifier"),
        (lambda: nn.spec.Tensor([-1, 4]), "spec dim -1 is negative"),
        (lambda: nn.spec.Tensor([1.5]), "spec dims are ints, names or SymVars, got 1.5"),  # type: ignore[list-item]
        (lambda: nn.spec.Tensor("n"), "shape must be a list of dims"),
        (lambda: nn.spec.Tensor(["n"], "float"), "unknown dtype 'float'"),
    ],
)
def test_malformed_spec_tensors(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError, match=message):
        make()


@pytest.mark.parametrize(
    "spec, bounds, message",
    [
        ({"forward": {"x": nn.spec.Tensor(["n", 4])}}, None, r"spec for Pair.forward: no spec for argument\(s\) y"),
        ({"x": nn.spec.Tensor(["n", 4]), "y": nn.spec.Tensor(["n", 1]), "z": nn.spec.Tensor([1])}, None, r"unknown argument\(s\) z; it takes \(x, y, scale\)"),
        ({"backward": {"x": nn.spec.Tensor([1])}}, None, "Pair has no method 'backward' to export"),
        ({"_secret": {"x": nn.spec.Tensor([1])}}, None, "Pair has no method '_secret' to export"),
        ({"project": {"x": nn.spec.Tensor(["n", 4])}}, {"m": 8}, r"dim_bounds names dim\(s\) no input has: m"),
        ({"project": {"x": nn.spec.Tensor(["n", 4])}}, {"n": (9, 8)}, "is an empty or negative range"),
        ({"project": {"x": nn.spec.Tensor(["n", 4])}}, {"n": "big"}, "must be an upper bound or a"),
        ({"project": {"x": nn.spec.Tensor([tw.dim("n"), 4])}}, {"n": 8}, "is a SymVar with its own bounds"),
        ({"project": {"x": nn.spec.Tensor([tw.dim("n"), "n"])}}, None, "is both a name and a SymVar"),
        ({"project": [nn.spec.Tensor([4])]}, None, "expected a dict of argument specs"),
        ({"project": {"x": [4]}}, None, r"spec for project\(x\): expected nn.spec.Tensor"),
        ({}, None, "a spec is a non-empty dict"),
    ],
)
def test_spec_errors_name_the_problem(spec, bounds, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError, match=message):
        Pair().export(spec, dim_bounds=bounds)
