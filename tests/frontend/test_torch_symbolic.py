"""torch.export sizes as tilework dims: symbols with their ranges become SymVars, sympy size
expressions become canonical dims, input sizes derived from a dim (``2 * m``) get a var of
their own, and ``--dim`` specs parse."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch", reason="the torch frontend needs torch (an optional extra)")
import torch  # noqa: E402
pytest.importorskip("sympy", reason="torch's symbolic sizes are sympy expressions")
import sympy  # noqa: E402

import tilework  # noqa: E402
from tilework.errors import UnsupportedError  # noqa: E402
from tilework.frontend.torch import from_exported_program, parse_dim_spec  # noqa: E402
from tilework.frontend.torch.symbolic import SymbolTable  # noqa: E402
from tilework.ir import sym  # noqa: E402
from tilework.ir.graph import GraphFunc  # noqa: E402
from tilework.ir.info import TensorInfo  # noqa: E402


class _Range:
    def __init__(self, lower: Any, upper: Any) -> None:
        self.lower, self.upper = lower, upper


def test_symbols_and_expressions() -> None:
    from torch.utils._sympy.functions import CeilDiv, FloorDiv, Mod, ModularIndexing

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    table = SymbolTable({s0: _Range(1, 512), s1: _Range(2, sympy.oo)}, dim_names={"s0": "seq"}, dim_bounds={"s1": (4, None)})
    seq, s1v = table.dim(s0), table.dim(s1)
    assert isinstance(seq, sym.SymVar) and (seq.name, seq.lo, seq.hi) == ("seq", 1, 512)
    assert isinstance(s1v, sym.SymVar) and (s1v.name, s1v.lo, s1v.hi) == ("s1", 4, None)
    assert table.dim(s0) is seq  # one var per symbol
    assert table.dim(2 * s0 + 1) is sym.add(sym.mul(seq, 2), 1)
    assert table.dim(s0 * s1) is sym.mul(seq, s1v)
    assert table.dim(FloorDiv(s0, 2)) is sym.floordiv(seq, 2)
    assert table.dim(CeilDiv(s0, 4)) is sym.ceildiv(seq, 4)
    assert table.dim(Mod(s0, 3)) is sym.floormod(seq, 3)
    assert table.dim(ModularIndexing(s0, 2, 8)) is sym.floormod(sym.floordiv(seq, 2), 8)
    assert table.dim(sympy.Max(1, s0 - 1)) is sym.max_(1, sym.sub(seq, 1))
    assert table.dim(s0**2) is sym.mul(seq, seq)
    assert table.dim(7) == 7
    with pytest.raises(UnsupportedError, match="fractional coefficient"):
        table.dim(s0 / 2)


def test_bounds_only_narrow() -> None:
    s0 = sympy.Symbol("s0", integer=True)
    with pytest.raises(UnsupportedError, match="upper bound 600 is above the exported upper bound 512"):
        SymbolTable({s0: _Range(1, 512)}, dim_bounds={"s0": (None, 600)}).dim(s0)
    with pytest.raises(UnsupportedError, match="lower bound 0 is below the exported lower bound 1"):
        SymbolTable({s0: _Range(1, 512)}, dim_bounds={"s0": (0, None)}).dim(s0)
    with pytest.raises(UnsupportedError, match="no dynamic dim s9"):
        SymbolTable({s0: _Range(1, 512)}, dim_bounds={"s9": (None, 5)})


@pytest.mark.parametrize(
    "spec, parsed",
    [
        ("seq<=512", ("seq", None, (None, 512))),
        ("seq=input_ids.1<=512", ("input_ids.1", "seq", (None, 512))),
        ("2<=s53<=64", ("s53", None, (2, 64))),
        ("batch=x.0>=2", ("x.0", "batch", (2, None))),
        ("n=x.0", ("x.0", "n", (None, None))),
    ],
)
def test_parse_dim_spec(spec: str, parsed: tuple[Any, ...]) -> None:
    assert parse_dim_spec(spec) == parsed


def test_parse_dim_spec_errors() -> None:
    with pytest.raises(UnsupportedError, match="bounds must be integers"):
        parse_dim_spec("seq<=lots")
    with pytest.raises(UnsupportedError, match="no dim named"):
        parse_dim_spec("<=5")
    with pytest.raises(UnsupportedError, match="'b a' has a space in it"):  # it became a dim named ba
        parse_dim_spec("b a=x.0<=8")
    with pytest.raises(UnsupportedError, match="'1 6' has a space in it"):
        parse_dim_spec("x.0 <= 1 6")
    assert parse_dim_spec(" seq = x.0 <= 8 ") == ("x.0", "seq", (None, 8))


def test_derived_input_size_gets_its_own_var() -> None:
    """An input of size ``2 * m`` (m never a whole input size) is bound by a var of its own;
    m is that var // 2 and a cast asserts the size is even."""

    class Halves(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            a, b = x.split(x.shape[0] // 2)
            return a * b

    m = torch.export.Dim("m", min=1, max=100)
    ep = torch.export.export(Halves(), (torch.randn(8, 3),), dynamic_shapes=({0: 2 * m},), strict=False)
    mod = from_exported_program(ep)
    main = mod["main"]
    assert isinstance(main, GraphFunc)
    (x,) = main.params
    assert isinstance(x.info, TensorInfo) and x.info.shape is not None
    d = x.info.shape[0]
    assert isinstance(d, sym.SymVar) and (d.name, d.lo, d.hi) == ("x_0", 4, 200)  # torch.export raises m to >= 2
    assert "match_cast" in str(mod)
    exe = tilework.build(mod)
    vm = tilework.VM(exe)
    a = torch.randn(10, 3)
    torch.testing.assert_close(torch.from_numpy(vm["main"](a.numpy())), Halves()(a))
    with pytest.raises(tilework.TileworkError):
        vm["main"](torch.randn(7, 3).numpy())  # not of the form 2 * m
