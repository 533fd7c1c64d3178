"""Indices outside their dim where torch raises: ``check_index`` gives the indices unchanged and
raises ``IndexOutOfRange`` (an ``IndexError``) at run time, on every target and runtime; the
torch frontend puts it before ``embedding``, ``index_select``, ``gather`` and advanced
indexing, which clamp (docs/semantics.md). Before, an embedding id past the vocabulary read
the last row."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
from tilework import op
from tilework.errors import IndexOutOfRange
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Tuple, Var
from tilework.ir.info import TensorInfo


def _checks_vm(target: str, dtype: str) -> Any:
    """``main(ids, x)``: ``ids`` checked against ``x``'s (symbolic) rows, from 0 and from -rows."""
    n, r = tw.dim("n", min=0), tw.dim("r", min=0)
    ids, x = Var("ids", TensorInfo((n,), dtype)), Var("x", TensorInfo((r, 3), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [ids, x]):
        with bb.dataflow():
            plain = bb.emit(op.check_index(ids, r))
            signed = bb.emit(op.check_index(ids, r, negative=True))
            out = bb.emit_output(Tuple((plain, signed, bb.emit(op.take(x, plain, 0)))))
        bb.emit_func_output(out)
    return tw.VM(tw.build(bb.get(), target=target))["main"]


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_in_range_unchanged_out_of_range_raises(target: str, dtype: str) -> None:
    f = _checks_vm(target, dtype)
    rng = np.random.default_rng(0)
    for rows, n in ((1, 1), (7, 5), (7, 0), (0, 0)):
        x = rng.standard_normal((rows, 3)).astype(np.float32)
        ids = rng.integers(0, max(rows, 1), n).astype(dtype) if rows else np.zeros(0, dtype)
        plain, signed, taken = f(ids, x)
        assert plain.tolist() == ids.tolist() and signed.tolist() == ids.tolist()
        np.testing.assert_array_equal(taken, x[ids])
    x = rng.standard_normal((7, 3)).astype(np.float32)
    for bad in ([7], [0, 3, -1], [2**31 - 1], [-8]):
        with pytest.raises(IndexOutOfRange, match="out of range") as info:
            f(np.array(bad, dtype), x)
        assert isinstance(info.value, IndexError)
    with pytest.raises(IndexOutOfRange):
        f(np.array([0], dtype), np.zeros((0, 3), np.float32))  # no row at all
    # the model keeps working after the error
    plain, signed, taken = f(np.array([6, 0], dtype), x)
    assert plain.tolist() == [6, 0]
    np.testing.assert_array_equal(taken, x[[6, 0]])


torch = pytest.importorskip("torch")


class _Indexing(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, ids: Any, x: Any, i: Any, g: Any) -> tuple[Any, ...]:
        return self.emb(ids), torch.index_select(x, 0, i), x[i], torch.gather(x, 0, g)


@pytest.mark.parametrize("runtime", ["native", "vm"])
def test_torch_indexing_raises_where_torch_does(runtime: str) -> None:
    torch.manual_seed(0)
    model = _Indexing().eval()
    dims = ({0: torch.export.Dim("n", max=64)}, {0: torch.export.Dim("r", max=64)}, {0: torch.export.Dim("k", max=64)}, None)
    x = torch.randn(5, 3)
    args = (torch.tensor([1, 9, 0]), x, torch.tensor([0, 4, 2]), torch.tensor([[4, 0, 3]]))
    cm = tw.compile(model, args, dims, runtime=runtime)
    assert cm.runtime == runtime
    for got, want in zip(cm(*args), model(*args)):
        np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-6)
    x[torch.tensor([-5])]  # advanced indexing takes -rows ... rows - 1
    bad = {
        "embedding id past the table": (torch.tensor([10]), x, args[2], args[3]),
        "negative embedding id": (torch.tensor([-1]), x, args[2], args[3]),
        "index_select past the rows": (args[0], x, torch.tensor([5]), args[3]),
        "negative index_select": (args[0], x, torch.tensor([-1]), args[3]),
        "gather past the rows": (args[0], x, args[2], torch.tensor([[5, 0, 0]])),
        "x[i] below -rows": (args[0], x, torch.tensor([-6]), args[3]),
    }
    for what, a in bad.items():
        with pytest.raises((IndexError, RuntimeError)):
            model(*a)  # torch raises
        with pytest.raises(IndexOutOfRange, match="out of range"):
            cm(*a)
    for got, want in zip(cm(*args), model(*args)):
        np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-6)
