"""The reference models written with the builder: text round trip, verification, exact struct info."""

from __future__ import annotations

import pytest

import tilework as tw
from tilework.ir.graph import GraphFunc
from tilework.ir.info import TensorInfo
from tilework.ir.structural import assert_structural_equal
from tilework.ir.sym import SymVar
from tilework.models.reference import EncoderConfig, LlamaConfig, TransformerConfig, encoder, llama_graph, transformer_block


def main_of(mod: tw.IRModule) -> GraphFunc:
    f = mod["main"]
    assert isinstance(f, GraphFunc)
    return f


def test_two_layer_transformer_block_prints_parses_verifies() -> None:
    batch, seq = SymVar("batch", 1), SymVar("seq", 1, 4096)
    cfg = TransformerConfig(layers=2, hidden=64, heads=4, ffn=256)
    mod = transformer_block(cfg, batch, seq)
    assert main_of(mod).ret_info == TensorInfo((batch, seq, 64), "float32")
    text = str(mod)
    assert "seq = sym(lo=1, hi=4096)" in text
    back = tw.parse(text)
    tw.verify(mod)
    tw.verify(back)
    assert_structural_equal(back, mod)
    ret = main_of(back).ret_info
    assert isinstance(ret, TensorInfo) and ret.dtype == "float32" and ret.shape is not None
    assert ret.shape[2] == 64 and all(isinstance(d, SymVar) for d in ret.shape[:2])
    assert str(back) == text


@pytest.mark.parametrize(
    "build",
    [lambda: encoder(EncoderConfig(layers=2)), lambda: llama_graph(LlamaConfig(layers=3))],
    ids=["encoder", "llama"],
)
def test_other_reference_models_verify_and_round_trip(build) -> None:  # type: ignore[no-untyped-def]
    mod = build()
    tw.verify(mod)
    assert_structural_equal(tw.parse(str(mod)), mod)
    ret = main_of(mod).ret_info
    assert isinstance(ret, TensorInfo) and ret.ndim == 3 and ret.dtype == "float32"
