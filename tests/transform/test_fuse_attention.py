"""fuse_attention: attention written out as matmul / scale / mask / softmax / matmul (ONNX's
TorchScript exporter, torch.export of eager attention) becomes the fused ``attention`` op, and
the head transposes around it cancel; results equal NumPy's at symbolic batch and sequence
sizes 0, 1 and odd ones. A match whose scores or probabilities are read elsewhere stays.

The ONNX BERT layer exported from eager attention runs only in the long tier
(TILEWORK_LONG_TESTS=1): the written-out tests cover its pattern, test_onnx_minilm.py the eager
export end to end, and the SDPA export (the harder pattern) runs here by default."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tests.long import long_param
from tests.transform.util import ir
from tilework.ir.graph import Binding, Call, GraphFunc, OpRef, bindings_of
from tilework.transform.dead_code_elimination import DeadCodeElimination
from tilework.transform.fuse_attention import FuseAttention
from tilework.transform.pipeline import Pipeline

# q, k, v arrive as [b, s, h, d] (projections reshaped to heads), as exporters write them; {extra}:
# the parameters after them
SIGNATURE = """
@graph
def main(q: Tensor((b, s, 4, 8), "float32"), k: Tensor((b, s, 4, 8), "float32"), v: Tensor((b, s, 4, 8), "float32"){extra}):
    b = sym(lo=0, hi=16)
    s = sym(lo=0, hi=256)
    with dataflow():
"""
HEAD = SIGNATURE + """        qh = permute_dims(q, axes=[0, 2, 1, 3])
        kt = permute_dims(k, axes=[0, 2, 3, 1])
        vh = permute_dims(v, axes=[0, 2, 1, 3])
        sc = matmul(qh, kt)
"""
TAIL = """
        p = softmax(m, axis=3)
        o = matmul(p, vh)
        ob = permute_dims(o, axes=[0, 2, 1, 3])
        output({out})
    return {ret}
"""
MASKED = HEAD.format(extra=', mask: Tensor((b, 1, 1, s), "float32")') + """
        sd = multiply(sc, const(0.35355339, "float32"))
        m = add(sd, mask)
""" + TAIL.format(out="ob", ret="ob")
DIVIDED = HEAD.format(extra="") + """
        m = divide(sc, const(2.828427, "float32"))
""" + TAIL.format(out="ob", ret="ob")
# torch's ONNX export of scaled_dot_product_attention: q and kt scaled by sqrt(scale) each, the
# softmax guarded against rows that see no key
GUARDED = SIGNATURE.format(extra=', mask: Tensor((b, 1, 1, s), "float32")') + """        qp = permute_dims(q, axes=[0, 2, 1, 3])
        kp = permute_dims(k, axes=[0, 2, 3, 1])
        qh = multiply(qp, const(0.59460356, "float32"))
        kt = multiply(kp, const(0.59460356, "float32"))
        vh = permute_dims(v, axes=[0, 2, 1, 3])
        sc = matmul(qh, kt)
        m = add(sc, mask)
        sm = softmax(m, axis=-1)
        nan = isnan(sm)
        p = where(nan, const(0.0, "float32"), sm)
        o = matmul(p, vh)
        ob = permute_dims(o, axes=[0, 2, 1, 3])
        output(ob)
    return ob
"""
PROBS_READ = HEAD.format(extra="") + """
        m = multiply(sc, const(0.35355339, "float32"))
""" + TAIL.format(out="ob, p", ret="(ob, p)")


def _ops(mod: tw.IRModule) -> list[str]:
    f = mod["main"]
    assert isinstance(f, GraphFunc)
    return [b.value.callee.name for b in bindings_of(f) if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)]


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: np.ndarray | None) -> np.ndarray:
    qh, kh, vh = (x.transpose(0, 2, 1, 3).astype(np.float64) for x in (q, k, v))
    s = qh @ kh.transpose(0, 1, 3, 2) * scale
    if mask is not None:
        s = s + mask
    s = s - s.max(axis=-1, keepdims=True) if s.size else s
    p = np.exp(s)
    p = p / p.sum(axis=-1, keepdims=True)
    return (p @ vh).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("text, scale, masked", [(MASKED, 0.35355339, True), (DIVIDED, 1 / 2.828427, False)])
def test_written_out_attention_becomes_the_fused_op(text: str, scale: float, masked: bool) -> None:
    mod = ir(text)
    after = Pipeline([FuseAttention(), DeadCodeElimination()])(mod)
    ops = _ops(after)
    assert ops.count("attention") == 1 and "softmax" not in ops and "matmul" not in ops
    assert "permute_dims" not in ops  # the exporter's head transposes cancel
    f = tw.VM(tw.build(mod))["main"]
    rng = np.random.default_rng(0)
    for b, s in ((1, 1), (2, 0), (0, 3), (3, 7), (2, 33)):
        q, k, v = (rng.standard_normal((b, s, 4, 8)).astype(np.float32) for _ in range(3))
        mask = np.where(rng.random((b, 1, 1, s)) < 0.3, np.float32(-1e9), np.float32(0)).astype(np.float32) if masked else None
        if mask is not None and s:
            mask[..., 0] = 0  # every row keeps a key
        got = f(q, k, v, *([mask] if masked else []))
        assert got.shape == (b, s, 4, 8)
        np.testing.assert_allclose(got, _reference(q, k, v, scale, mask), rtol=2e-5, atol=2e-5)


def test_prescaled_and_guarded_attention_becomes_the_fused_op() -> None:
    """Scales on q and kt multiply into the op's; a row masked whole (-inf everywhere: NaN
    probabilities, zeroed by the guard) is zeros from the kernel too."""
    mod = ir(GUARDED)
    after = Pipeline([FuseAttention(), DeadCodeElimination()])(mod)
    ops = _ops(after)
    assert ops.count("attention") == 1 and not {"softmax", "matmul", "isnan", "where", "multiply"} & set(ops), ops
    f = tw.VM(tw.build(after))["main"]
    rng = np.random.default_rng(2)
    for b, s in ((1, 1), (2, 0), (3, 7), (2, 33)):
        q, k, v = (rng.standard_normal((b, s, 4, 8)).astype(np.float32) for _ in range(3))
        mask = np.where(rng.random((b, 1, 1, s)) < 0.3, np.float32(-np.inf), np.float32(0)).astype(np.float32)
        if s:
            mask[..., 0] = 0
            mask[0] = -np.inf  # sequence 0 sees no key at all
        want = _reference(q, k, v, 0.59460356**2, np.where(np.isinf(mask), -1e30, mask))
        want[0] = 0.0
        got = f(q, k, v, mask)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        if s:
            np.testing.assert_array_equal(tw.VM(tw.build(mod, opt_level=0))["main"](q, k, v, mask)[0], 0.0)  # the unfused guard agrees


def test_probabilities_read_elsewhere_keep_the_ops() -> None:
    mod = ir(PROBS_READ)
    after = Pipeline([FuseAttention(), DeadCodeElimination()])(mod)
    assert "attention" not in _ops(after) and _ops(after) == _ops(mod)


@pytest.mark.parametrize("impl", [long_param("eager", why="the eager pattern is covered by the written-out tests and test_onnx_minilm.py"), "sdpa"])
def test_onnx_minilm_attention_is_fused(tmp_path: object, impl: str) -> None:
    """The ONNX route of a BERT encoder layer (TorchScript exporter, dynamic batch and seq)
    gets the fused op and matches onnxruntime, from eager attention and from SDPA (q and k
    scaled apart, the softmax NaN-guarded)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ort = pytest.importorskip("onnxruntime")
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128, vocab_size=100, attn_implementation=impl)
    torch.manual_seed(0)
    bert = transformers.BertModel(cfg).eval()

    class Last(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: object, mask: object) -> object:
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    path = f"{tmp_path}/bert.onnx"
    axes = {0: "batch", 1: "seq"}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Last(), (torch.zeros((2, 5), dtype=torch.int64), torch.ones((2, 5), dtype=torch.int64)), path, input_names=["ids", "mask"],
                          output_names=["out"], dynamic_axes={"ids": axes, "mask": axes, "out": axes}, opset_version=17, dynamo=False)
    cm = tw.compile(path, dim_bounds={"seq": (1, 64)})
    assert cm.module is not None and "attention" in _ops(cm.module)
    if impl == "sdpa":  # the graph torch.export gives: no transposes, the bias inside each linear, a bool mask a key
        ops = _ops(cm.module)
        assert "permute_dims" not in ops and "matmul" not in ops and "erf" not in ops and "gelu" in ops, ops
        calls = [b.value for b in bindings_of(cm.module["main"]) if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)]
        assert all(len(c.args) == 3 for c in calls if c.callee.name == "linear_io"), "a linear's bias is added after it"
        (att,) = [c for c in calls if c.callee.name == "attention"]
        mask = att.args[3].info
        assert mask.dtype == "bool" and [str(d) for d in mask.shape] == ["batch", "1", "1", "seq"], mask
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for b, s in ((1, 1), (2, 7), (3, 16)):
        ids = rng.integers(0, 100, (b, s)).astype(np.int64)
        mask = np.ones((b, s), np.int64)
        mask[0, max(1, s // 2):] = 0
        want = sess.run(None, {"ids": ids, "mask": mask})[0]
        np.testing.assert_allclose(cm(ids, mask), want, rtol=1e-4, atol=1e-4)


# transformers' SDPA mask: the padding mask [b, 1, 1, s] and-ed with "query index >= 0"
PADDED = SIGNATURE.format(extra=', pad: Tensor((b, 1, 1, s), "bool")') + """        r = arange(dtype="int64", end=s, start=0, step=1)
        r0 = add(r, const(0, "int64"))
        r1 = expand_dims(r0, axis=[0, 1, 3])
        ge = greater_equal(r1, const({bound}, "int64"))
        t = logical_and(const(True, "bool"), ge)
        m = logical_and(t, pad)
        o = attention(q, k, v, m, scale=0.35355339)
        output(o)
    return o
"""


@pytest.mark.parametrize("bound, dropped", [(0, True), (-3, True), (1, False)])
def test_a_mask_factor_that_is_all_true_is_dropped(bound: int, dropped: bool) -> None:
    """``attention(q, k, v, logical_and(arange(s)[None, None, :, None] >= c, pad))``: with ``c``
    at most 0 the first factor is all True and the attention takes ``pad`` itself (``[b, 1, 1,
    s]``: one bias a key for all the kernel's rows); with ``c = 1`` (query 0 sees nothing) the
    mask stays. The same values either way, at sequence lengths 0, 1 and odd ones."""
    mod = ir(PADDED.format(bound=bound))
    after = Pipeline([FuseAttention(), DeadCodeElimination()])(mod)
    (call,) = [b.value for b in bindings_of(after["main"]) if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef) and b.value.callee.name == "attention"]
    assert (call.args[3] is after["main"].params[3]) == dropped
    assert (_ops(after).count("logical_and") == 0) == dropped
    fused, plain = tw.VM(tw.build(mod))["main"], tw.VM(tw.build(mod, opt_level=0))["main"]
    rng = np.random.default_rng(bound + 5)
    for b, s in ((1, 1), (2, 0), (3, 7), (2, 33)):
        q, k, v = (rng.standard_normal((b, s, 4, 8)).astype(np.float32) for _ in range(3))
        pad = rng.random((b, 1, 1, s)) < 0.7
        if s:
            pad[..., 0] = True
        np.testing.assert_allclose(fused(q, k, v, pad), plain(q, k, v, pad), rtol=2e-5, atol=2e-5)


# ONNX's export of transformers' SDPA mask: the bool mask made a float one to add
FLOAT_MASK = SIGNATURE.format(extra=', pad: Tensor((b, 1, 1, s), "bool")') + """        f = where(pad, const([{keep}], "float32"), const([{hide}], "float32"))
        o = attention(q, k, v, f, scale=0.35355339)
        output(o)
    return o
"""


@pytest.mark.parametrize("keep, hide, as_bool", [("0.0", "-inf", True), ("-inf", "0.0", False), ("0.0", "-10000.0", False)])
def test_a_float_mask_of_zeros_and_minus_infinity_becomes_the_bool_mask(keep: str, hide: str, as_bool: bool) -> None:
    """``attention(q, k, v, where(pad, 0, -inf))`` takes ``pad`` itself; other fills stay a float
    mask. The same values either way, a batch whose keys are all hidden (zeros) included."""
    mod = ir(FLOAT_MASK.format(keep=keep, hide=hide))
    after = Pipeline([FuseAttention(), DeadCodeElimination()])(mod)
    (call,) = [b.value for b in bindings_of(after["main"]) if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef) and b.value.callee.name == "attention"]
    assert (call.args[3] is after["main"].params[3]) == as_bool
    assert ("where" not in _ops(after)) == as_bool
    fused, plain = tw.VM(tw.build(after))["main"], tw.VM(tw.build(mod, opt_level=0))["main"]
    rng = np.random.default_rng(len(hide))
    for b, s in ((1, 1), (2, 0), (3, 7), (2, 33)):
        q, k, v = (rng.standard_normal((b, s, 4, 8)).astype(np.float32) for _ in range(3))
        pad = rng.random((b, 1, 1, s)) < 0.7
        pad[0] = False  # batch 0 sees no key
        np.testing.assert_allclose(fused(q, k, v, pad), plain(q, k, v, pad), rtol=2e-5, atol=2e-5)
