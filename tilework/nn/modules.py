"""Standard layers written with ``tilework.nn``: ``Linear``, ``Embedding``, ``LayerNorm``,
``RMSNorm``, ``MLP``, ``SwiGLU``, ``Attention`` and a pre-norm ``TransformerBlock``.

Weight layouts and attribute names follow PyTorch and the Hugging Face Llama family
(``weight`` ``[out_features, in_features]``; ``q_proj`` ... ``o_proj``; ``gate_proj``,
``up_proj``, ``down_proj``; ``input_layernorm``, ``post_attention_layernorm``), so their state
dicts load without renaming. Each layer checks what it can about its input shape and says which
dim is wrong; the error gains the module's path and argument shapes on its way out.
"""

from __future__ import annotations

from tilework.errors import InferenceError, ShapeError
from tilework.ir.graph import Constant
from tilework.nn import ops
from tilework.nn.core import Parameter, Tensor, require_dim
from tilework.nn.module import Module
from tilework.ir.dtype import is_int_dtype, np_dtype

import numpy as np

_ACTIVATIONS = {"silu": ops.silu, "gelu": ops.gelu, "relu": ops.relu, "gelu_tanh": lambda x: ops.gelu(x, "tanh")}


def _last_dim(x: Tensor, want: int, what: str) -> None:
    if x.ndim < 1:
        raise ShapeError(f"{what} needs at least one dim, got a 0-d tensor")
    require_dim(x.shape[-1], want, f"the last dim of {what}")


class Linear(Module):
    """``y = x @ weight.T + bias`` over the last dim of ``x``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: str = "float32") -> None:
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter((out_features, in_features), dtype)
        self.bias = Parameter((out_features,), dtype, init="zeros") if bias else None

    def forward(self, x: Tensor) -> Tensor:
        _last_dim(x, self.in_features, "the input (in_features)")
        return ops.linear(x, self.weight, self.bias)


class Embedding(Module):
    """Rows of ``weight`` ``[num_embeddings, dim]`` picked by an integer tensor of ids: the
    result has the ids' shape plus ``dim``."""

    def __init__(self, num_embeddings: int, dim: int, dtype: str = "float32") -> None:
        self.num_embeddings, self.dim = num_embeddings, dim
        self.weight = Parameter((num_embeddings, dim), dtype)

    def forward(self, ids: Tensor) -> Tensor:
        if not is_int_dtype(ids.dtype):
            raise InferenceError(f"embedding ids must be an integer tensor, got {ids.dtype}")
        return ops.take(self.weight, ids, axis=0)


class LayerNorm(Module):
    """Normalization over the last dim to zero mean and unit variance, then ``* weight + bias``
    (no bias: ``bias=False``)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, dtype: str = "float32") -> None:
        self.dim, self.eps = dim, eps
        self.weight = Parameter((dim,), dtype, init="ones")
        self.bias = Parameter((dim,), dtype, init="zeros") if bias else None

    def forward(self, x: Tensor) -> Tensor:
        _last_dim(x, self.dim, "the input")
        bias = self.bias if self.bias is not None else Tensor(Constant.of(np.zeros(self.dim, np_dtype(self.weight.dtype))))
        return ops.layer_norm(x, self.weight, bias, self.eps)


class RMSNorm(Module):
    """``x / sqrt(mean(x * x) + eps) * weight`` over the last dim."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype: str = "float32") -> None:
        self.dim, self.eps = dim, eps
        self.weight = Parameter((dim,), dtype, init="ones")

    def forward(self, x: Tensor) -> Tensor:
        _last_dim(x, self.dim, "the input")
        return ops.rms_norm(x, self.weight, self.eps)


class MLP(Module):
    """``down_proj(act(up_proj(x)))``; ``activation`` is silu, gelu, gelu_tanh or relu."""

    def __init__(self, hidden: int, ffn: int, activation: str = "gelu", bias: bool = True, dtype: str = "float32") -> None:
        if activation not in _ACTIVATIONS:
            raise InferenceError(f"unknown activation {activation!r}; expected one of {', '.join(_ACTIVATIONS)}")
        self.activation = activation
        self.up_proj = Linear(hidden, ffn, bias, dtype)
        self.down_proj = Linear(ffn, hidden, bias, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(_ACTIVATIONS[self.activation](self.up_proj(x)))


class SwiGLU(Module):
    """The gated MLP of Llama: ``down_proj(silu(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, hidden: int, ffn: int, bias: bool = False, dtype: str = "float32") -> None:
        self.gate_proj = Linear(hidden, ffn, bias, dtype)
        self.up_proj = Linear(hidden, ffn, bias, dtype)
        self.down_proj = Linear(ffn, hidden, bias, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(ops.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(Module):
    """Multi-head self-attention with grouped KV heads and rotary position embedding.

    ``forward(x [batch, seq, hidden], positions=None)``: ``q_proj``/``k_proj``/``v_proj`` project
    to ``heads``/``kv_heads``/``kv_heads`` heads of ``head_dim``; when ``rope_theta`` is set, q
    and k are rotated by ``positions`` (an integer ``[seq]`` or ``[batch, seq]`` tensor;
    default ``arange(0, seq)``; the angles divided by ``rope_factor``: linear rotary scaling);
    ``attend`` combines them; ``o_proj`` projects back.

    ``attend(q, k, v)`` is where a KV cache hooks in: a cached attention overrides it to append
    this step's k and v to the cache and attend over the whole history, passing positions that
    start at the cache length (the causal mask of ``attention`` already aligns the queries with
    the end of a longer key sequence).
    """

    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        rope_theta: float | None = 10000.0,
        bias: bool = False,
        out_bias: bool = False,
        causal: bool = True,
        dtype: str = "float32",
        rope_factor: float = 1.0,
    ) -> None:
        kv_heads = heads if kv_heads is None else kv_heads
        if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
            raise ShapeError(f"heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})")
        if head_dim is None:
            if hidden % heads:
                raise ShapeError(f"hidden ({hidden}) is not divisible by heads ({heads}); give head_dim")
            head_dim = hidden // heads
        self.hidden, self.heads, self.kv_heads, self.head_dim = hidden, heads, kv_heads, head_dim
        self.rope_theta, self.rope_factor, self.causal = rope_theta, rope_factor, causal
        self.q_proj = Linear(hidden, heads * head_dim, bias, dtype)
        self.k_proj = Linear(hidden, kv_heads * head_dim, bias, dtype)
        self.v_proj = Linear(hidden, kv_heads * head_dim, bias, dtype)
        self.o_proj = Linear(heads * head_dim, hidden, out_bias, dtype)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        if x.ndim != 3:
            raise ShapeError(f"attention input must be [batch, seq, hidden], got rank {x.ndim}")
        _last_dim(x, self.hidden, "the input (hidden)")
        batch, seq, _ = x.shape
        q = self.q_proj(x).reshape(batch, seq, self.heads, self.head_dim)
        k = self.k_proj(x).reshape(batch, seq, self.kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(batch, seq, self.kv_heads, self.head_dim)
        if self.rope_theta is not None:
            pos = positions if positions is not None else ops.arange(0, seq)
            q = ops.rotary_embedding(q, pos, self.rope_theta, factor=self.rope_factor)
            k = ops.rotary_embedding(k, pos, self.rope_theta, factor=self.rope_factor)
        out = self.attend(q, k, v)
        return self.o_proj(out.reshape(batch, seq, self.heads * self.head_dim))

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention of ``q`` over ``k``/``v`` (``[batch, seq, heads, head_dim]``); see the class
        docstring for the KV-cache hook."""
        return ops.attention(q, k, v, causal=self.causal)


class TransformerBlock(Module):
    """A pre-norm decoder block: ``h = x + self_attn(input_layernorm(x))``, then
    ``h + mlp(post_attention_layernorm(h))``. ``norm`` is ``rms`` or ``layer``; ``mlp`` is
    ``swiglu`` or an activation name for a plain ``MLP``; ``rope_factor``: the attention's."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        ffn: int,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        norm: str = "rms",
        eps: float = 1e-6,
        mlp: str = "swiglu",
        rope_theta: float | None = 10000.0,
        attention_bias: bool = False,
        mlp_bias: bool = False,
        dtype: str = "float32",
        rope_factor: float = 1.0,
    ) -> None:
        if norm not in ("rms", "layer"):
            raise InferenceError(f"norm must be 'rms' or 'layer', got {norm!r}")

        def make_norm() -> Module:
            return RMSNorm(hidden, eps, dtype) if norm == "rms" else LayerNorm(hidden, eps, dtype=dtype)

        # attribute (so parameter) order as in Hugging Face's decoder layers
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, rope_theta, attention_bias, attention_bias, dtype=dtype, rope_factor=rope_factor)
        self.mlp: Module = SwiGLU(hidden, ffn, mlp_bias, dtype) if mlp == "swiglu" else MLP(hidden, ffn, mlp, mlp_bias, dtype)
        self.input_layernorm = make_norm()
        self.post_attention_layernorm = make_norm()

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        h = x + self.self_attn(self.input_layernorm(x), positions)
        out: Tensor = h + self.mlp(self.post_attention_layernorm(h))
        return out


__all__ = ["Linear", "Embedding", "LayerNorm", "RMSNorm", "MLP", "SwiGLU", "Attention", "TransformerBlock"]
