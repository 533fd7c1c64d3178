"""``tilework.compile`` and ``CompiledModel``: the frontend registry, calling like the original
model (torch in -> torch out, NumPy in -> NumPy out, positional or keyword inputs), saving to one
file and loading back, ``explain()``, weights as params or constants, dim names and bounds, and
the errors for what is not supported yet."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="the torch frontend needs torch (an optional extra)")
import torch  # noqa: E402
Dim = torch.export.Dim

import tilework  # noqa: E402
from tilework import compiled  # noqa: E402
from tilework.frontend import registry  # noqa: E402
from tilework.compiled import CompiledModel, Imported, Signature, register_frontend  # noqa: E402
from tilework.errors import RuntimeCheckError, TileworkError, UnsupportedError  # noqa: E402
from tilework.ir.builder import BlockBuilder  # noqa: E402
from tilework.ir.graph import GraphFunc, Var  # noqa: E402
from tilework.ir.info import TensorInfo  # noqa: E402
from tilework.runtime.executable import load_file  # noqa: E402


_Pair = collections.namedtuple("_Pair", "a b")


class Tiny(torch.nn.Module):
    """Embedding -> linear -> layer norm, with a mask and a dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(40, 16)
        self.lin = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, ids: Any, mask: Any, scale: float = 2.0) -> Any:
        h = self.norm(torch.relu(self.lin(self.emb(ids)))) * scale
        h = h * mask[..., None]
        return {"hidden": h, "pooled": h.sum(1) / mask.sum(1, keepdim=True)}


def _inputs(b: int, s: int, seed: int = 0) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 40, (b, s), generator=g)
    mask = torch.ones(b, s)
    mask[0, s // 2 :] = 0
    return ids, mask


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, CompiledModel]:
    torch.manual_seed(0)
    model = Tiny().eval()
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=128)
    cm = tilework.compile(model, _inputs(2, 6), ({0: batch, 1: seq}, {0: batch, 1: seq}))
    return model, cm


def _close(got: Any, want: Any) -> None:
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_called_like_the_model(tiny: tuple[Any, CompiledModel]) -> None:
    model, cm = tiny
    for b, s in ((1, 2), (3, 11), (8, 128)):
        ids, mask = _inputs(b, s, seed=b)
        want = model(ids, mask)
        got = cm(ids, mask)
        assert isinstance(got, dict) and isinstance(got["hidden"], torch.Tensor)
        _close(got["hidden"], want["hidden"])
        _close(got["pooled"], want["pooled"])
    as_numpy = cm(ids.numpy(), mask.numpy())
    assert isinstance(as_numpy["pooled"], np.ndarray)
    _close(as_numpy["pooled"], want["pooled"])
    _close(cm(ids, mask=mask)["hidden"], want["hidden"])  # keyword inputs bind too


def test_dims_are_named_and_checked_at_run_time(tiny: tuple[Any, CompiledModel]) -> None:
    _, cm = tiny
    assert cm.module is not None
    main = cm.module["main"]
    assert isinstance(main, GraphFunc)
    assert [str(p.info.shape) for p in main.params[:2]] == ["(batch, seq)", "(batch, seq)"]  # type: ignore[attr-defined]
    assert main.attrs["num_inputs"] == 2
    ids, mask = _inputs(2, 129)
    with pytest.raises(RuntimeCheckError, match="seq"):
        cm(ids, mask)


def test_specialized_inputs_are_checked(tiny: tuple[Any, CompiledModel]) -> None:
    class Scaled(torch.nn.Module):
        def forward(self, x: Any, k: float) -> Any:
            return x * k

    cm = tilework.compile(Scaled(), (torch.ones(3), 2.0))
    assert [(i["name"], i["tensor"], i["value"]) for i in cm.signature.inputs] == [("x", True, None), ("k", False, 2.0)]
    np.testing.assert_allclose(cm(torch.ones(3), 2.0).numpy(), [2.0, 2.0, 2.0])
    with pytest.raises(TileworkError, match=r"input k was fixed to 2.0 when the model was compiled, got 3.0"):
        cm(torch.ones(3), 3.0)
    assert "k                    fixed to 2.0 at compile time" in cm.explain()
    ids, mask = _inputs(2, 4)
    with pytest.raises(TileworkError, match=r"compiled for model\(ids, mask\)\n  called as    model\(Tensor\[2, 4\]\)"):
        tiny[1](ids)


def test_explain(tiny: tuple[Any, CompiledModel]) -> None:
    _, cm = tiny
    text = cm.explain()
    for part in (
        "source: torch.nn.Module Tiny via torch.export",
        'ids                  Tensor((batch, seq), "int64")',
        "1 <= batch <= 8",
        "2 <= seq <= 128",
        "weights: 5 tensor(s)",
        "layer_norm x1",
        "kernel(s)",
        "lowering: legalize",
        "compile time:",
    ):
        assert part in text, f"{part!r} missing from:\n{text}"


def test_save_and_load(tiny: tuple[Any, CompiledModel], tmp_path: Path) -> None:
    model, cm = tiny
    path = str(tmp_path / "tiny.tw")
    cm.save(path)
    loaded = load_file(path)
    assert loaded.extra["kind"] == "tilework.compiled_model" and len(loaded.arrays["weights"]) == len(cm.weights) and "module" in loaded.texts
    assert [i["name"] for i in loaded.extra["signature"]["inputs"]] == ["ids", "mask"]
    back = CompiledModel.load(path)
    ids, mask = _inputs(3, 9)
    _close(back(ids, mask)["pooled"], model(ids, mask)["pooled"])
    assert tilework.structural_equal(back.module, cm.module)
    def account(cm: CompiledModel) -> list[str]:  # the explain lines but the runtime's
        return [line for line in cm.explain().splitlines()[2:] if not line.startswith("  runtime:")]

    assert account(back) == account(cm)
    assert back.runtime == "vm" and "runtime: the Python VM; read from a file" in back.explain()  # its kernel calls checked
    exe = tilework.load(path)  # the same file is a plain executable: main(inputs..., weights...)
    out = tilework.VM(exe)["main"](ids.numpy(), mask.numpy(), *cm.weights)
    _close(out[1], model(ids, mask)["pooled"])


class Ranked(torch.nn.Module):
    """Returns torch.return_types (``topk``, ``max``, ``sort``) and a plain namedtuple, whose
    pytree nodes torch cannot write as text."""

    def forward(self, x: Any) -> Any:
        return torch.topk(x, 2, dim=-1), x.max(1), _Pair(x.sum(-1), x * 2), torch.sort(x, dim=-1)


def test_outputs_of_torch_return_types_and_namedtuples(tmp_path: Path) -> None:
    """The compiled model returns them as the model does; a saved one as plain tuples (it was
    torch's NotImplementedError from compile: "No registered serialization name")."""
    model = Ranked()
    for runtime in ("native", "vm"):
        cm = tilework.compile(model, (torch.randn(3, 5),), dynamic_shapes=({0: Dim("n", min=0, max=32)},), runtime=runtime)
        for n in (0, 1, 7):
            x = torch.randn(n, 5)
            got, want = cm(x), model(x)
            assert [type(g) for g in got] == [type(w) for w in want]
            assert torch.equal(got[0].values, want[0].values) and torch.equal(got[0].indices, want[0].indices)
            assert torch.equal(got[1].values, want[1].values) and torch.equal(got[1].indices, want[1].indices)
            _close(got[2].a, want[2].a)
            assert torch.equal(got[2].b, want[2].b) and torch.equal(got[3].values, want[3].values)
    path = str(tmp_path / "ranked.tw")
    cm.save(path)
    back = CompiledModel.load(path)(x)
    assert type(back[0]) is tuple and type(back[2]) is tuple
    assert torch.equal(back[0][1], want[0].indices) and torch.equal(back[3][0], want[3].values)


def test_exported_program_and_weights_as_constants(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = Tiny().eval()
    seq = Dim("seq", min=2, max=32)
    ep = torch.export.export(model, _inputs(2, 5), dynamic_shapes=({1: seq}, {1: seq}), strict=False)
    cm = compiled.compile(ep, weights="constants", dim_names={"ids.1": "length"}, dim_bounds={"length": (None, 16)})
    assert cm.module is not None
    main = cm.module["main"]
    assert isinstance(main, GraphFunc)
    assert cm.weights == [] and main.attrs["num_inputs"] == 2 and len(main.params) == 2
    assert "1 <= length" not in cm.explain() and "2 <= length <= 16" in cm.explain()
    ids, mask = _inputs(2, 16)
    _close(cm(ids, mask)["hidden"], model(ids, mask)["hidden"])
    path = str(tmp_path / "c.tw")
    cm.save(path)
    assert load_file(path).arrays["weights"] == []
    _close(CompiledModel.load(path)(ids, mask)["hidden"], model(ids, mask)["hidden"])


def test_a_rename_onto_another_dims_torch_name_is_refused() -> None:
    """``dim_names`` giving input.0 the torch name of input.1 (a dim it does not rename) is
    refused like two names given alike: both dims printed with one name, and every message about
    either said that name. Renaming both (a swap) is fine."""
    ep = torch.export.export(torch.nn.Linear(16, 4).eval(), (torch.randn(2, 5, 16),), dynamic_shapes=({0: Dim("b", max=8), 1: Dim("s", max=64)},), strict=False)
    first, second = (str(d.node.expr) for d in next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == "input").meta["val"].shape[:2])
    want = f"two dynamic dims share a name: '{second}' given to input.0 \\({first}\\) is the name of the dynamic dim {second} \\(input.1\\)"
    with pytest.raises(UnsupportedError, match=want):
        compiled.compile(ep, weights="constants", dim_names={"input.0": second})
    with pytest.raises(UnsupportedError, match=want):
        compiled.compile(ep, weights="constants", dim_names={first: second})
    cm = compiled.compile(ep, weights="constants", dim_names={"input.0": second, "input.1": first})
    assert list(cm.report["dims"]) == [second, first]
    with pytest.raises(RuntimeCheckError, match=f"input.shape\\[0\\] = 9 but {second} <= 8"):
        cm(np.ones((9, 3, 16), np.float32))


def test_irmodule_compiles_as_is() -> None:
    n = tilework.dim("n")
    x = Var("x", TensorInfo((n, 4), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        from tilework import op

        out = bb.emit(op.softmax(bb.emit(op.multiply(x, x))))
        bb.emit_func_output(out)
    cm = tilework.compile(bb.get())
    a = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    e = np.exp(a * a - (a * a).max(-1, keepdims=True))
    np.testing.assert_allclose(cm(a), e / e.sum(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(cm(x=a), cm(a))
    assert "source: IRModule" in cm.explain()


def test_a_bad_placement_is_refused(tiny: tuple[Any, CompiledModel]) -> None:
    model, _ = tiny  # placement="auto" itself: tests/collage
    with pytest.raises(UnsupportedError, match="placement='bogus': not 'auto' and no such placement file"):
        tilework.compile(model, _inputs(1, 2), placement="bogus")
    with pytest.raises(UnsupportedError, match=r"budget_s, pins need\(s\) placement='auto'.*got placement=None"):
        tilework.compile(model, _inputs(1, 2), budget_s=5, pins={"linear": "blas"})


def test_unknown_models_and_missing_examples() -> None:
    with pytest.raises(UnsupportedError, match=r"cannot compile a builtins.str; it accepts: irmodule, torch.export, torch"):
        tilework.compile("model.bin")
    with pytest.raises(UnsupportedError, match="needs example_args"):
        tilework.compile(Tiny())


def test_a_list_given_for_a_tensor_is_described_briefly(tiny: tuple[Any, CompiledModel]) -> None:
    """A nested Python list where a tensor goes: its first items and its length, not every
    element (one line of thousands of characters)."""
    _, cm = tiny
    ids, mask = _inputs(2, 6)
    with pytest.raises(TileworkError, match="does not match the inputs") as err:
        cm(ids, torch.ones(64, 64).tolist())
    text = str(err.value)
    assert "[[float, float, float, float, ... 64 items], [float, float, float, float, ... 64 items], [float" in text
    assert text.endswith("... 64 items], ... 64 items])") and len(text) < 400
    from tilework.runtime.builtins import check_tensor_info

    with pytest.raises(RuntimeCheckError, match=r"x expects a tensor, got dict \{0: 0, 1: 1, .* \.\.\.$") as err2:
        check_tensor_info({i: i for i in range(1000)}, 2, "float32", "x")
    assert len(str(err2.value)) < 120


def test_a_torch_export_failure_keeps_torch_explanation() -> None:
    """torch's first line is only a summary ("Constraints violated (h)!"); why, and the fix it
    suggests, are on the lines after it, and the message keeps them."""

    class Halve(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return torch.nn.functional.max_pool1d(x, 2) * 2 if x.shape[-1] // 2 != 1 else x

    h = Dim("h", min=2, max=64)
    with pytest.raises(UnsupportedError) as err:
        tilework.compile(Halve(), (torch.randn(1, 1, 16),), dynamic_shapes=({2: h},))
    text = str(err.value)
    assert text.startswith("torch.export cannot export Halve with these example_args and dynamic_shapes: ")
    assert "Constraints violated (h)" in text and "specialized it to be a constant (16)" in text and "Suggested fixes:\n  h = 16" in text


def test_a_frontend_is_one_registration() -> None:
    class Fake:
        pass

    n = tilework.dim("n")
    x = Var("x", TensorInfo((n,), "float32"))
    w = Var("w", TensorInfo((n,), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, w], attrs={"num_inputs": 1}):
        from tilework import op

        bb.emit_func_output(bb.emit(op.add(x, w)))

    def load(model: Any, options: Any) -> Imported:
        return Imported(bb.get(), [np.ones(3, np.float32)], Signature([{"name": "x", "tensor": True, "value": None}]), "a fake framework", {n: "x.0"})

    register_frontend("fake", lambda m: isinstance(m, Fake), load, first=True)
    try:
        cm = tilework.compile(Fake())
        np.testing.assert_allclose(cm(np.arange(3, dtype=np.float32)), [1, 2, 3])
        assert "fake" in compiled.frontends() and "a fake framework" in cm.explain()
    finally:
        registry._FRONTENDS[:] = [f for f in registry._FRONTENDS if f[0] != "fake"]
