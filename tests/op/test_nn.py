"""nn ops: softmax, log_softmax, layer_norm, rms_norm and attention with grouped KV heads."""

from __future__ import annotations

import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import R, T, holds, infer, info_of
from tilework.errors import InferenceError, ShapeError
from tilework.ir.graph import Var
from tilework.ir.sym import SymVar

b, s, kv, n, m = tw.dim("b"), tw.dim("s"), tw.dim("kv"), tw.dim("n"), tw.dim("m")


@pytest.mark.parametrize("f", [op.softmax, op.log_softmax])
def test_softmax(f) -> None:  # type: ignore[no-untyped-def]
    name = f.__name__
    assert info_of(f, T(b, n, m + 1)) == T(b, n, m + 1)
    assert info_of(lambda x: f(x, axis=0), T(n * m, 3, dtype="bfloat16")) == T(n * m, 3, dtype="bfloat16")
    assert info_of(f, R()) == R()
    assert info_of(lambda x: f(x, 5), R(dtype=None)) == R(dtype=None)
    with pytest.raises(InferenceError, match=f"{name}: axis 2 is out of range for a tensor of rank 2"):
        infer(lambda x: f(x, 2), T(n, 3))
    with pytest.raises(InferenceError, match=f"{name}: input must be a floating-point tensor, got int64"):
        infer(f, T(n, dtype="int64"))


def test_layer_norm() -> None:
    assert info_of(op.layer_norm, T(b, s, 768), T(768), T(768)) == T(b, s, 768)
    assert info_of(lambda x, g, bb: op.layer_norm(x, g, bb, axes=(1, 2)), T(b, n, 4), T(n, 4), T(n, 4)) == T(b, n, 4)
    assert info_of(op.layer_norm, R(), T(768), T(768)) == R()
    assert info_of(op.layer_norm, T(b, 8, dtype=None), R(1, dtype=None), T(8, dtype="float16")) == T(b, 8, dtype="float16")
    assert dict(op.layer_norm(Var("x"), Var("g"), Var("b")).attrs) == {"axes": (-1,), "eps": 1e-5}


def test_layer_norm_checks_and_errors() -> None:
    h = SymVar("h", 1)
    info, checks = infer(op.layer_norm, T(b, n), T(h), T(n))
    assert info == T(b, n)
    assert [(c.kind, c.dims) for c in checks] == [("eq", (n, h))]
    assert holds(checks, {b: 1, n: 4, h: 4}) and not holds(checks, {b: 1, n: 4, h: 5})
    with pytest.raises(ShapeError, match=r"layer_norm: beta \(767,\) does not match axis 2 of input \(b, s, 768\): 768 != 767"):
        infer(op.layer_norm, T(b, s, 768), T(768), T(767))
    with pytest.raises(ShapeError, match=r"layer_norm: gamma must have rank 1 \(the normalized axes\), got shape \(1, 768\)"):
        infer(op.layer_norm, T(b, 768), T(1, 768), T(768))
    with pytest.raises(InferenceError, match="layer_norm: dtypes disagree"):
        infer(op.layer_norm, T(b, 8), T(8, dtype="float16"), T(8))
    with pytest.raises(InferenceError, match="layer_norm: attribute axes must name at least one axis"):
        infer(lambda x, g, bb: op.layer_norm(x, g, bb, axes=()), T(2), T(2), T(2))


def test_rms_norm() -> None:
    assert info_of(op.rms_norm, T(b, s, 4096, dtype="float16"), T(4096, dtype="float16")) == T(b, s, 4096, dtype="float16")
    assert info_of(lambda x, w: op.rms_norm(x, w, axes=0), T(n, 3), T(n)) == T(n, 3)
    assert info_of(op.rms_norm, R(3), R()) == R(3)
    with pytest.raises(ShapeError, match=r"rms_norm: weight \(n \+ 1,\) does not match axis 1 of input \(b, n\)"):
        infer(op.rms_norm, T(b, n), T(n + 1))
    with pytest.raises(InferenceError, match="rms_norm: input must be a floating-point tensor, got int8"):
        infer(op.rms_norm, T(b, 4, dtype="int8"), T(4, dtype="int8"))
    assert dict(op.rms_norm(Var("x"), Var("w")).attrs) == {"axes": (-1,), "eps": 1e-6}


def test_attention_shapes() -> None:
    q, k, v = T(b, s, 32, 128), T(b, kv, 8, 128), T(b, kv, 8, 64)
    assert info_of(op.attention, q, k, v) == T(b, s, 32, 64)
    assert info_of(lambda x, y, w: op.attention(x, y, w, causal=True, scale=0.1), q, k, v) == T(b, s, 32, 64)
    assert info_of(op.attention, T(1, 1, 8, 64), T(1, kv + 1, 8, 64), T(1, kv + 1, 8, 64)) == T(1, 1, 8, 64)
    assert info_of(op.attention, R(), k, v) == R(4)
    assert info_of(op.attention, q, R(), T(b, kv, 8, 64, dtype=None)) == T(b, s, 32, 64)
    attrs = dict(op.attention(Var("q"), Var("k"), Var("v")).attrs)
    assert attrs == {"causal": False, "scale": None, "bf16": False}
    with pytest.raises(InferenceError, match="attribute bf16 must be a bool"):
        info_of(lambda x, y, w: op.attention(x, y, w, bf16="yes"), q, k, v)  # type: ignore[arg-type]


def test_attention_mask() -> None:
    q, k = T(b, s, 32, 128), T(b, kv, 8, 128)
    assert info_of(op.attention, q, k, k, T(b, 1, s, kv, dtype="bool")) == T(b, s, 32, 128)
    assert info_of(op.attention, q, k, k, T(s, kv)) == T(b, s, 32, 128)
    info, checks = infer(op.attention, q, k, k, T(1, 1, n, kv))
    assert info == T(b, s, 32, 128)
    assert [(c.kind, c.dims) for c in checks] == [("expands", (n, s))]
    assert holds(checks, {n: 1, s: 7}) and not holds(checks, {n: 2, s: 7})
    with pytest.raises(ShapeError, match=r"attention: cannot broadcast mask \(b, 3, s, kv\) to \(b, 32, s, kv\)"):
        infer(op.attention, q, k, k, T(b, 3, s, kv))
    with pytest.raises(ShapeError, match="attention: mask must broadcast to"):
        infer(op.attention, q, k, k, R(5))
    with pytest.raises(InferenceError, match="attention: mask must be bool or floating-point, got int32"):
        infer(op.attention, q, k, k, T(s, kv, dtype="int32"))


def test_attention_grouped_heads() -> None:
    h, hkv = tw.dim("h"), tw.dim("hkv")
    assert infer(op.attention, T(b, s, 4 * hkv, 64), T(b, kv, hkv, 64), T(b, kv, hkv, 64))[1] == []
    info, checks = infer(op.attention, T(b, s, h, 64), T(b, kv, hkv, 64), T(b, kv, hkv, 64))
    assert info == T(b, s, h, 64)
    assert [(c.kind, c.dims) for c in checks] == [("divides", (h, hkv))]
    assert "num_heads h must be a multiple of num_kv_heads hkv" in checks[0].message
    assert holds(checks, {h: 32, hkv: 8, b: 1, s: 1, kv: 1}) and not holds(checks, {h: 32, hkv: 5, b: 1, s: 1, kv: 1})
    with pytest.raises(ShapeError, match="attention: num_heads 32 must be a multiple of num_kv_heads 6"):
        infer(op.attention, T(b, s, 32, 64), T(b, kv, 6, 64), T(b, kv, 6, 64))


def test_attention_errors() -> None:
    q, k = T(b, s, 8, 64), T(b, kv, 8, 64)
    with pytest.raises(ShapeError, match=r"attention: q must be 4-D \[batch, seq, heads, head_dim\], got shape \(s, 8, 64\)"):
        infer(op.attention, T(s, 8, 64), k, k)
    with pytest.raises(ShapeError, match=r"attention: head_dim of q \(b, s, 8, 64\) and k \(b, kv, 8, 32\) differ: 64 != 32"):
        infer(op.attention, q, T(b, kv, 8, 32), T(b, kv, 8, 32))
    with pytest.raises(ShapeError, match=r"attention: seq_kv of k \(b, kv, 8, 64\) and v \(b, kv \+ 1, 8, 64\) differ"):
        infer(op.attention, q, k, T(b, kv + 1, 8, 64))
    with pytest.raises(ShapeError, match=r"attention: batch of q \(2, s, 8, 64\) and k \(3, kv, 8, 64\) differ"):
        infer(op.attention, T(2, s, 8, 64), T(3, kv, 8, 64), T(3, kv, 8, 64))
    with pytest.raises(InferenceError, match="attention: q, k and v must be floating-point tensors, got int32"):
        infer(op.attention, T(1, 1, 1, 1, dtype="int32"), T(1, 1, 1, 1, dtype="int32"), T(1, 1, 1, 1, dtype="int32"))
    with pytest.raises(InferenceError, match="attention: takes .* got 2 argument"):
        infer(lambda x, y: op.make_call("attention", [x, y]), q, k)
    with pytest.raises(InferenceError, match="attention: attribute scale must be a number"):
        infer(lambda *a: op.make_call("attention", list(a), scale="x"), q, k, k)
    unknown_batch = SymVar("ub", 1)
    info, checks = infer(op.attention, T(unknown_batch, s, 8, 64), k, k)
    assert info == T(unknown_batch, s, 8, 64)
    assert [(c.kind, c.dims) for c in checks] == [("eq", (unknown_batch, b))]
    info, checks = infer(op.attention, T(unknown_batch, s, 8, 64), R(), k)
    assert info == T(unknown_batch, s, 8, 64)
    assert [(c.kind, c.dims) for c in checks] == [("eq", (unknown_batch, b))]
    assert "batch of q (ub, s, 8, 64) and v (b, kv, 8, 64)" in checks[0].message
