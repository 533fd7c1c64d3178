"""tilework.nn: write models PyTorch-style, export them with symbolic shapes, compile them once.

    import tilework as tw
    from tilework import nn

    class MLP(nn.Module):
        def __init__(self, d, h):
            self.up = nn.Linear(d, h)
            self.down = nn.Linear(h, d)

        def forward(self, x):
            return self.down(nn.silu(self.up(x)))

    m = MLP(64, 256)
    mod, names = m.export({"forward": {"x": nn.spec.Tensor(["batch", "seq", 64], "float32")}},
                          dim_bounds={"seq": 4096})
    # mod["forward"](x, up_weight, up_bias, down_weight, down_bias), attrs num_inputs=1;
    # names == ["up.weight", "up.bias", "down.weight", "down.bias"]

    m.load_state_dict({name: array, ...})      # or m.init_random(seed=0)
    cm = m.compile({"x": nn.spec.Tensor(["batch", "seq", 64])}, dim_bounds={"seq": 4096})
    y = cm(x)                                   # NumPy or torch in; the weights are passed for you
    cm = tw.compile(m, {"x": nn.spec.Tensor(["n", 64])})   # the same through tilework.compile

- ``Module`` (``core``): parameters and sub-modules are found through attributes, named by
  their path (``layers.0.self_attn.q_proj.weight``); ``ModuleList`` and lists of modules are
  numbered. ``load_state_dict``, ``state_dict``, ``init_random``, ``named_parameters``,
  ``export``, ``compile``.
- ``Parameter(shape, dtype, init)``: a weight; ``.data`` is its NumPy value or None. Using a
  parameter without a value is an error at compile time (``ParameterError``).
- ``Tensor``: inside ``forward``, a symbolic proxy of a graph value: ``.shape`` (symbolic dims),
  ``.dtype``, ``+ - * / ** @``, ``x[..., :n, 0]``, ``.reshape``, ``.permute``, ``.astype``.
- ``spec``: ``spec.Tensor(shape, dtype)``; string dims name sym vars shared by a method's inputs;
  ``dim_bounds`` bounds them (``{"seq": 4096}`` or ``{"seq": (1, 4096)}``).
- Layers (``modules``): ``Linear``, ``Embedding``, ``LayerNorm``, ``RMSNorm``, ``MLP``,
  ``SwiGLU``, ``Attention`` (grouped KV heads, rotary embedding, a KV-cache hook), and
  ``TransformerBlock``; functional ops (``ops``): ``silu``, ``gelu``, ``softmax``,
  ``attention``, ``rotary_embedding``, ``arange``, ``concat``, ``take``, ...

Errors: a malformed spec is a ``SpecError``; a shape mistake inside ``forward`` is a
``ShapeError`` (or ``InferenceError``) whose message starts with the module's class, path and
argument shapes: ``in Linear 'mlp.up'.forward(x: (batch, seq, 32) float32): ...``.
"""

from __future__ import annotations

from tilework.nn import spec
from tilework.nn.core import Parameter, Tensor
from tilework.nn.module import Module, ModuleList
from tilework.nn.module import export
from tilework.nn.modules import MLP, Attention, Embedding, LayerNorm, Linear, RMSNorm, SwiGLU, TransformerBlock
from tilework.nn.ops import (
    arange, argmax, astype, attention, broadcast_to, concat, exp, expand_dims, gelu, layer_norm,
    linear, log, log_softmax, matmul, maximum, mean, minimum, permute_dims, relu, reshape,
    rms_norm, rotary_embedding, rsqrt, sigmoid, silu, softmax, sqrt, squeeze, sum, take, tanh,
    where,
)  # fmt: skip

__all__ = [
    "spec", "Module", "ModuleList", "Parameter", "Tensor", "export",
    "Linear", "Embedding", "LayerNorm", "RMSNorm", "MLP", "SwiGLU", "Attention", "TransformerBlock",
    "arange", "argmax", "astype", "attention", "broadcast_to", "concat", "exp", "expand_dims",
    "gelu", "layer_norm", "linear", "log", "log_softmax", "matmul", "maximum", "mean", "minimum",
    "permute_dims", "relu", "reshape", "rms_norm", "rotary_embedding", "rsqrt", "sigmoid", "silu",
    "softmax", "sqrt", "squeeze", "sum", "take", "tanh", "where",
]  # fmt: skip
