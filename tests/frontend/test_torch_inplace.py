"""In-place ATen ops in exported programs and the weights of compiled torch models.

An in-place op that writes a tensor the graph made (``y = x * 2; y.add_(x)``) is rebound to its
out-of-place op without torch re-tracing the program (``functional``); a write to an input, a
buffer or a view is left to torch's functionalization. The weights of ``tilework.compile`` are
read from the model's tensors without a copy and copied once where kept as they are: a later
in-place change of the model does not reach the compiled model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="the torch frontend needs torch (an optional extra)")
import torch  # noqa: E402

import tilework  # noqa: E402
from tilework.compiled import CompiledModel  # noqa: E402
from tilework.errors import UnsupportedError  # noqa: E402
from tilework.frontend.torch import translate  # noqa: E402
from tilework.frontend.torch.translator import _rebind_inplace, functional  # noqa: E402

Dim = torch.export.Dim
N, M = Dim("n", min=0, max=64), Dim("m", min=0, max=64)


class Intermediates(torch.nn.Module):
    """Writes to tensors the graph made, read before and after each write, through the in-place
    op's result and through the written tensor; a write that promotes (float32 += float64)."""

    def forward(self, x: Any) -> Any:
        y = x * 2
        before = y + 1  # reads y before the write
        r = y.add_(x)  # y = 3x; r is y
        mid = r * 10
        y.mul_(0.5).sub_(x, alpha=0.25)  # y = 1.25x, chained on the results
        e = x.clone()
        e[x > 0] = 0.0  # index_put_
        c = x.clone()
        c.add_(x.double())  # float32 += float64: stays float32
        z = torch.zeros_like(x)
        z.copy_(x * x)
        return before, mid, y, r, e, c, z


class ViewWrite(torch.nn.Module):
    """A write through a view of an intermediate: left to torch's functionalization."""

    def forward(self, x: Any) -> Any:
        y = x + 1
        y.view(-1).mul_(3)
        t = x * 2
        t[:, :1] += 5  # through a slice
        return y, t


class ChunkWrite(torch.nn.Module):
    """A write to a piece of ``split`` (a view of its input, through ``getitem``)."""

    def forward(self, x: Any) -> Any:
        y = x + 1
        a, b = y.split(2, dim=1)
        a.mul_(3)
        return y, b * 1


class BufferWrite(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: Any) -> Any:
        self.count.add_(1)
        return x * self.count


class InputWrite(torch.nn.Module):
    def forward(self, x: Any) -> Any:
        x.add_(1)
        return x * 2


def _export(m: torch.nn.Module, *shape: int, dynamic: bool = True) -> Any:
    dyn = ({0: N, 1: M},) if dynamic else None
    return torch.export.export(m, (torch.randn(*shape),), dynamic_shapes=dyn, strict=False)


def _mutable(ep: Any) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function" and getattr(n.target, "_schema", None) is not None and n.target._schema.is_mutable]


def test_writes_to_intermediates_are_rebound_without_torch() -> None:
    ep = _export(Intermediates(), 3, 5)
    before = _mutable(ep)
    assert {"aten.add_.Tensor", "aten.mul_.Tensor", "aten.sub_.Tensor", "aten.index_put_.default", "aten.copy_.default"} <= set(before)
    rebound = _rebind_inplace(ep)
    assert rebound is not None and _mutable(rebound) == []
    assert _mutable(ep) == before  # the user's program is left as it is
    assert [str(s.arg.name) for s in rebound.graph_signature.output_specs] == [str(a.name) for a in next(n for n in rebound.graph.nodes if n.op == "output").args[0]]
    fn = tilework.compile(ep)
    for shape in ((3, 5), (0, 4), (1, 1), (7, 3)):
        x = torch.randn(*shape)
        want = Intermediates()(x.clone())
        got = fn(x)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6)


def test_rebinding_reads_the_value_at_each_point() -> None:
    """The reads before a write see the old value and those after it the new one: a rebinding
    that read the last value everywhere (or the first) would give other numbers here."""
    ep = _export(Intermediates(), 2, 3, dynamic=False)
    x = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]])
    before, mid, y, r, *_ = tilework.compile(ep)(x)
    np.testing.assert_allclose(before.numpy(), (2 * x + 1).numpy())
    np.testing.assert_allclose(mid.numpy(), (30 * x).numpy())
    np.testing.assert_allclose(y.numpy(), (1.25 * x).numpy())
    np.testing.assert_allclose(r.numpy(), (1.25 * x).numpy())  # r is y: it sees the later writes


class ReadAfterWrite(torch.nn.Module):
    def forward(self, x: Any) -> Any:
        y = x * 2
        y.add_(x)
        return y * 3, y - x


def test_reads_of_the_written_tensor_itself_after_the_write() -> None:
    """torch.export reads a written tensor after the write through the in-place op's result; a
    graph may read the tensor itself (the same storage, so the new value): rewired here so, the
    rebound program must read the out-of-place op's result there too."""
    ep = _export(ReadAfterWrite(), 2, 3)
    mul = next(n for n in ep.graph.nodes if n.target is torch.ops.aten.mul.Tensor and n.args[1] == 2)
    write = next(n for n in ep.graph.nodes if n.target is torch.ops.aten.add_.Tensor)
    for user in list(write.users):
        user.replace_input_with(write, mul)
    ep.graph_module.recompile()
    assert not write.users
    x = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]])
    want = ep.module()(x.clone())
    np.testing.assert_allclose(want[0].numpy(), (9 * x).numpy())  # torch reads the new value
    assert _rebind_inplace(ep) is not None
    for shape in ((2, 3), (0, 3), (1, 1), (5, 7)):
        x = torch.randn(*shape)
        for g, w in zip(tilework.compile(ep)(x), ep.module()(x.clone())):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6)


def test_writes_through_views_are_functionalized_by_torch() -> None:
    ep = _export(ViewWrite(), 3, 4)
    assert _rebind_inplace(ep) is None
    assert _mutable(functional(ep)) == []
    fn = tilework.compile(ep)
    for shape in ((3, 4), (1, 1), (5, 3)):
        x = torch.randn(*shape)
        for g, w in zip(fn(x), ViewWrite()(x)):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6)
    ep = _export(ChunkWrite(), 3, 4, dynamic=False)
    assert _rebind_inplace(ep) is None
    x = torch.randn(3, 4)
    for g, w in zip(tilework.compile(ep)(x), ChunkWrite()(x)):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6)


@pytest.mark.parametrize("model", [BufferWrite, InputWrite])
def test_writes_to_state_are_not_rebound(model: type) -> None:
    """A write to a buffer or an input is state the caller sees: not rebound, and refused as
    before (tilework does not write back)."""
    ep = _export(model(), 2, 3, dynamic=False)
    assert _rebind_inplace(ep) is None
    with pytest.raises(UnsupportedError, match="mutates state"):
        tilework.compile(ep)


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(5, 3)
        self.register_buffer("shift", torch.arange(3.0))
        self.emb = torch.nn.Embedding(7, 3)

    def forward(self, x: Any, i: Any) -> Any:
        return self.lin(x) + self.shift + self.emb(i)


def test_compiled_weights_are_the_models_at_compile_time(tmp_path: Any) -> None:
    """The compiled model keeps weights of its own: an in-place change of the model's
    parameters and buffers afterwards changes neither it nor a saved copy of it."""
    torch.manual_seed(0)
    m = Linear().eval()
    x, i = torch.randn(4, 5), torch.tensor([0, 6, 3, 3])
    cm = tilework.compile(m, (x, i))
    want = m(x, i).detach().clone()
    tensors = [t for t in (*m.parameters(), *m.buffers())]
    for w in cm.weights:
        assert not any(np.shares_memory(w, t.detach().numpy()) for t in tensors)
    with torch.no_grad():
        for t in tensors:
            t.add_(100.0)
    np.testing.assert_allclose(cm(x, i).numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    cm.save(str(tmp_path / "m.tw"))
    np.testing.assert_allclose(CompiledModel.load(str(tmp_path / "m.tw"))(x, i).numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tilework.compile(m, (x, i))(x, i).numpy(), m(x, i).detach().numpy(), rtol=1e-5, atol=1e-4)  # compiled again: the new values


def test_translate_copies_weights_unless_asked_not_to() -> None:
    m = Linear().eval()
    ep = torch.export.export(m, (torch.randn(2, 5), torch.tensor([1, 2])), strict=False)
    copies = translate(ep).weights
    views = translate(ep, copy_weights=False).weights
    state = {**ep.state_dict, **ep.constants}
    for (name, c), (_, v) in zip(copies, views):
        t = state[name].detach().numpy()
        assert not np.shares_memory(c, t) and c.flags.writeable
        assert np.shares_memory(v, t) and not v.flags.writeable
        np.testing.assert_array_equal(c, v)
    consts = translate(ep, False, copy_weights=False).weights  # weights as constants: copies
    assert consts == [] or all(not np.shares_memory(w, state[n].detach().numpy()) for n, w in consts)
