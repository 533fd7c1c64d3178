"""Reference models written directly with the BlockBuilder.

They exercise the whole stack with symbolic shapes and serve the demo, the tests and the
benchmarks: a pre-norm transformer block stack (attention + MLP, GPT-style, biases, GELU) and a
Llama-shaped decoder graph (RMSNorm, grouped KV heads, SwiGLU MLP). Weights are trailing
parameters of ``main`` (the ``num_inputs`` attribute says how many leading params are inputs);
``random_weights`` makes NumPy arrays for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilework import op
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Expr, Var
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar


@dataclass(frozen=True)
class TransformerConfig:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    ffn: int = 256
    dtype: str = "float32"


@dataclass(frozen=True)
class LlamaConfig:
    layers: int = 30
    hidden: int = 576
    heads: int = 9
    kv_heads: int = 3
    ffn: int = 1536
    dtype: str = "float32"


def _w(name: str, shape: tuple[int, ...], dtype: str) -> Var:
    return Var(name, TensorInfo(shape, dtype))


def transformer_weights(cfg: TransformerConfig) -> list[Var]:
    h, f, d = cfg.hidden, cfg.ffn, cfg.dtype
    ws: list[Var] = []
    for i in range(cfg.layers):
        p = f"l{i}_"
        ws += [_w(p + "ln1_g", (h,), d), _w(p + "ln1_b", (h,), d)]
        for proj in ("q", "k", "v", "o"):
            ws += [_w(p + f"w{proj}", (h, h), d), _w(p + f"b{proj}", (h,), d)]
        ws += [_w(p + "ln2_g", (h,), d), _w(p + "ln2_b", (h,), d)]
        ws += [_w(p + "w1", (f, h), d), _w(p + "b1", (f,), d), _w(p + "w2", (h, f), d), _w(p + "b2", (h,), d)]
    return ws


def transformer_block(cfg: TransformerConfig = TransformerConfig(), batch: SymVar | None = None, seq: SymVar | None = None) -> IRModule:
    """``main(x: (batch, seq, hidden), *weights) -> (batch, seq, hidden)``."""
    batch = batch or SymVar("batch", 1)
    seq = seq or SymVar("seq", 1)
    h, nh = cfg.hidden, cfg.heads
    hd = h // nh
    x = Var("x", TensorInfo((batch, seq, h), cfg.dtype))
    weights = transformer_weights(cfg)
    w = {v.name: v for v in weights}
    bb = BlockBuilder()
    with bb.function("main", [x, *weights], attrs={"num_inputs": 1}):
        with bb.dataflow():
            cur: Expr = x
            for i in range(cfg.layers):
                p = f"l{i}_"
                hn = bb.emit(op.layer_norm(cur, w[p + "ln1_g"], w[p + "ln1_b"]), name=p + "ln1")
                heads = []
                for proj in ("q", "k", "v"):
                    t = bb.emit(op.linear(hn, w[p + f"w{proj}"], w[p + f"b{proj}"]), name=p + proj)
                    heads.append(bb.emit(op.reshape(t, (batch, seq, nh, hd)), name=p + proj + "_heads"))
                att = bb.emit(op.attention(heads[0], heads[1], heads[2], causal=True), name=p + "attn")
                att2 = bb.emit(op.reshape(att, (batch, seq, h)), name=p + "attn_flat")
                o = bb.emit(op.linear(att2, w[p + "wo"], w[p + "bo"]), name=p + "o")
                cur = bb.emit(op.add(cur, o), name=p + "res1")
                hn2 = bb.emit(op.layer_norm(cur, w[p + "ln2_g"], w[p + "ln2_b"]), name=p + "ln2")
                up = bb.emit(op.gelu(op.linear(hn2, w[p + "w1"], w[p + "b1"])), name=p + "mlp_up")
                down = bb.emit(op.linear(up, w[p + "w2"], w[p + "b2"]), name=p + "mlp_down")
                cur = bb.emit(op.add(cur, down), name=p + "res2")
            out = bb.emit_output(cur, name="out")
        bb.emit_func_output(out)
    return bb.get()


@dataclass(frozen=True)
class EncoderConfig:
    """A BERT-style (post-norm) encoder; the defaults are all-MiniLM-L6-v2's shapes."""

    layers: int = 6
    hidden: int = 384
    heads: int = 12
    ffn: int = 1536
    dtype: str = "float32"


def encoder_weights(cfg: EncoderConfig) -> list[Var]:
    h, f, d = cfg.hidden, cfg.ffn, cfg.dtype
    ws: list[Var] = []
    for i in range(cfg.layers):
        p = f"l{i}_"
        for proj in ("q", "k", "v", "o"):
            ws += [_w(p + f"w{proj}", (h, h), d), _w(p + f"b{proj}", (h,), d)]
        ws += [_w(p + "ln1_g", (h,), d), _w(p + "ln1_b", (h,), d)]
        ws += [_w(p + "w1", (f, h), d), _w(p + "b1", (f,), d), _w(p + "w2", (h, f), d), _w(p + "b2", (h,), d)]
        ws += [_w(p + "ln2_g", (h,), d), _w(p + "ln2_b", (h,), d)]
    return ws


def encoder(cfg: EncoderConfig = EncoderConfig(), batch: SymVar | None = None, seq: SymVar | None = None) -> IRModule:
    """``main(x: (batch, seq, hidden), mask: (batch, 1, 1, seq) float additive, *weights)``: the
    encoder layers of a MiniLM/BERT model over embeddings (post-norm, GELU, no causal mask)."""
    batch = batch or SymVar("batch", 1, 64)
    seq = seq or SymVar("seq", 1, 512)
    h, nh = cfg.hidden, cfg.heads
    hd = h // nh
    x = Var("x", TensorInfo((batch, seq, h), cfg.dtype))
    mask = Var("mask", TensorInfo((batch, 1, 1, seq), cfg.dtype))
    weights = encoder_weights(cfg)
    w = {v.name: v for v in weights}
    bb = BlockBuilder()
    with bb.function("main", [x, mask, *weights], attrs={"num_inputs": 2}):
        with bb.dataflow():
            cur: Expr = x
            for i in range(cfg.layers):
                p = f"l{i}_"
                heads = []
                for proj in ("q", "k", "v"):
                    t = bb.emit(op.linear(cur, w[p + f"w{proj}"], w[p + f"b{proj}"]), name=p + proj)
                    heads.append(bb.emit(op.reshape(t, (batch, seq, nh, hd)), name=p + proj + "_heads"))
                att = bb.emit(op.attention(heads[0], heads[1], heads[2], mask=mask), name=p + "attn")
                att2 = bb.emit(op.reshape(att, (batch, seq, h)), name=p + "attn_flat")
                o = bb.emit(op.linear(att2, w[p + "wo"], w[p + "bo"]), name=p + "o")
                cur = bb.emit(op.layer_norm(op.add(cur, o), w[p + "ln1_g"], w[p + "ln1_b"], eps=1e-12), name=p + "ln1")
                up = bb.emit(op.gelu(op.linear(cur, w[p + "w1"], w[p + "b1"])), name=p + "mlp_up")
                down = bb.emit(op.linear(up, w[p + "w2"], w[p + "b2"]), name=p + "mlp_down")
                cur = bb.emit(op.layer_norm(op.add(cur, down), w[p + "ln2_g"], w[p + "ln2_b"], eps=1e-12), name=p + "ln2")
            out = bb.emit_output(cur, name="out")
        bb.emit_func_output(out)
    return bb.get()


def llama_weights(cfg: LlamaConfig) -> list[Var]:
    h, f, d = cfg.hidden, cfg.ffn, cfg.dtype
    kvh = h // cfg.heads * cfg.kv_heads
    ws: list[Var] = []
    for i in range(cfg.layers):
        p = f"l{i}_"
        ws += [_w(p + "attn_norm", (h,), d), _w(p + "wq", (h, h), d), _w(p + "wk", (kvh, h), d)]
        ws += [_w(p + "wv", (kvh, h), d), _w(p + "wo", (h, h), d), _w(p + "mlp_norm", (h,), d)]
        ws += [_w(p + "w_gate", (f, h), d), _w(p + "w_up", (f, h), d), _w(p + "w_down", (h, f), d)]
    ws.append(_w("final_norm", (h,), d))
    return ws


def llama_graph(cfg: LlamaConfig = LlamaConfig(), seq: SymVar | None = None) -> IRModule:
    """A Llama-shaped decoder over hidden states: ``main(x: (1, seq, hidden), *weights)``."""
    seq = seq or SymVar("seq", 1, 4096)
    h, nh, nkv = cfg.hidden, cfg.heads, cfg.kv_heads
    hd = h // nh
    x = Var("x", TensorInfo((1, seq, h), cfg.dtype))
    weights = llama_weights(cfg)
    w = {v.name: v for v in weights}
    bb = BlockBuilder()
    with bb.function("main", [x, *weights], attrs={"num_inputs": 1}):
        with bb.dataflow():
            cur: Expr = x
            for i in range(cfg.layers):
                p = f"l{i}_"
                hn = bb.emit(op.rms_norm(cur, w[p + "attn_norm"]), name=p + "attn_norm")
                q = bb.emit(op.reshape(op.linear(hn, w[p + "wq"]), (1, seq, nh, hd)), name=p + "q")
                k = bb.emit(op.reshape(op.linear(hn, w[p + "wk"]), (1, seq, nkv, hd)), name=p + "k")
                v = bb.emit(op.reshape(op.linear(hn, w[p + "wv"]), (1, seq, nkv, hd)), name=p + "v")
                att = bb.emit(op.reshape(op.attention(q, k, v, causal=True), (1, seq, h)), name=p + "attn")
                cur = bb.emit(op.add(cur, op.linear(att, w[p + "wo"])), name=p + "res1")
                hn2 = bb.emit(op.rms_norm(cur, w[p + "mlp_norm"]), name=p + "mlp_norm")
                gate = bb.emit(op.silu(op.linear(hn2, w[p + "w_gate"])), name=p + "gate")
                up = bb.emit(op.linear(hn2, w[p + "w_up"]), name=p + "up")
                down = bb.emit(op.linear(op.multiply(gate, up), w[p + "w_down"]), name=p + "down")
                cur = bb.emit(op.add(cur, down), name=p + "res2")
            out = bb.emit_output(op.rms_norm(cur, w["final_norm"]), name="out")
        bb.emit_func_output(out)
    return bb.get()


@dataclass(frozen=True)
class MLPConfig:
    """A two-layer MLP: ``x[n, hidden] -> linear ffn -> silu -> linear hidden``."""

    hidden: int = 1024
    ffn: int = 4096
    bias: bool = True
    dtype: str = "float32"


def mlp_weights(cfg: MLPConfig) -> list[Var]:
    h, f, d = cfg.hidden, cfg.ffn, cfg.dtype
    ws = [_w("w1", (f, h), d)] + ([_w("b1", (f,), d)] if cfg.bias else [])
    ws += [_w("w2", (h, f), d)] + ([_w("b2", (h,), d)] if cfg.bias else [])
    return ws


def mlp(cfg: MLPConfig = MLPConfig(), n: SymVar | None = None) -> IRModule:
    """``main(x: (n, hidden), *weights) -> (n, hidden)``: ``linear(silu(linear(x, w1, b1)), w2, b2)``."""
    n = n or SymVar("n", 1, 4096)
    x = Var("x", TensorInfo((n, cfg.hidden), cfg.dtype))
    weights = mlp_weights(cfg)
    w = {v.name: v for v in weights}
    bb = BlockBuilder()
    with bb.function("main", [x, *weights], attrs={"num_inputs": 1}):
        with bb.dataflow():
            up = bb.emit(op.linear(x, w["w1"], w.get("b1")), name="up")
            act = bb.emit(op.silu(up), name="act")
            out = bb.emit_output(op.linear(act, w["w2"], w.get("b2")), name="out")
        bb.emit_func_output(out)
    return bb.get()


def random_weights(params: list[Var], seed: int = 0, scale: float = 0.05) -> list[np.ndarray]:
    """Random arrays for weight params: norm scales near 1, everything else small."""
    rng = np.random.default_rng(seed)
    out = []
    for p in params:
        info = p.info
        assert isinstance(info, TensorInfo) and info.shape is not None and info.dtype is not None
        shape = tuple(d for d in info.shape if isinstance(d, int))
        assert len(shape) == len(info.shape), f"weight {p.name} has a symbolic shape"
        if any(s in p.name for s in ("norm", "ln1_g", "ln2_g")):
            a = 1.0 + scale * rng.standard_normal(shape)
        else:
            a = scale * rng.standard_normal(shape)
        out.append(a.astype(info.dtype))
    return out
