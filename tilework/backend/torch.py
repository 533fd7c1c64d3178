"""The ``torch`` backend: ATen kernels on zero-copy views of the VM's buffers.

Every extern wraps its NumPy arguments with ``torch.from_numpy`` (a view: no copy) and writes
the result into the destination buffer, with ``out=`` where ATen has it (``mm``/``addmm``,
``matmul``, ``softmax``, activations, binary arithmetic) and with one ``copy_`` otherwise
(``layer_norm``, ``rms_norm``, ``conv2d``, attention). torch is imported on the first call,
not when the backend is registered.

Attention: tilework's layout is ``[batch, seq, heads, head_dim]``, torch's
``scaled_dot_product_attention`` wants ``[batch, heads, seq, head_dim]``: the inputs are passed
as transposed views and the result is copied back through a transposed view of the
destination. Grouped KV heads use ``enable_gqa``. tilework's causal mask is aligned at the end
(query ``i`` sees keys ``j <= i + seq_kv - seq_q``); torch's ``is_causal`` is used only when
``seq_q == seq_kv`` at run time, otherwise an explicit mask is built. A query that sees no key
gives zeros, as in tilework (torch would give NaN).

Capabilities: ``torch.linear``, ``torch.matmul``, ``torch.sdpa``, ``torch.conv2d`` (symmetric
padding), ``torch.layer_norm`` / ``torch.rms_norm`` (trailing axes), ``torch.softmax``,
``torch.unary`` (gelu, gelu_tanh, silu, relu, sigmoid, tanh, exp), ``torch.binary`` (add,
subtract, multiply, divide); float32 and float64.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import numpy as np

from tilework.backend.base import Backend, Capability, Region, lib_call, register_backend, same_dtype_in, shape_of
from tilework.ir.graph import Call, OpRef, PrimValue, ShapeExpr
from tilework.ir.info import TensorInfo
from tilework.pattern.core import is_op, op_call, wildcard
from tilework.pattern.graph import PatternMatch
from tilework.runtime.extern import register_extern

DTYPES = ("float32", "float64")
UNARY = ("gelu", "gelu_tanh", "silu", "relu", "sigmoid", "tanh", "exp")
BINARY = ("add", "subtract", "multiply", "divide")

_torch: Any = None


def _t() -> Any:
    global _torch
    if _torch is None:
        import torch

        # the externs wrap read-only inputs (weights, constants) with torch.from_numpy, which
        # warns that writing them would be undefined; they are only read. Ignored for calls
        # from this module alone, with no copy and no per-call cost.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning, module=__name__)
        _torch = torch
    return _torch


def _available() -> tuple[bool, str]:
    if importlib.util.find_spec("torch") is None:
        return False, "torch is not installed (pip install torch)"
    torch = _t()
    return True, f"torch {torch.__version__} ATen kernels on zero-copy views"


# -- externs (torch is imported by the first one that runs) ---------------------------------------


def _linear(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    torch = _torch or _t()
    k = x.shape[-1]
    torch.mm(torch.from_numpy(x).view(-1, k), torch.from_numpy(w).t(), out=torch.from_numpy(out).view(-1, w.shape[0]))


def _linear_bias(x: np.ndarray, w: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    torch = _torch or _t()
    k = x.shape[-1]
    torch.addmm(torch.from_numpy(b), torch.from_numpy(x).view(-1, k), torch.from_numpy(w).t(), out=torch.from_numpy(out).view(-1, w.shape[0]))


def _matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    torch = _torch or _t()
    torch.matmul(torch.from_numpy(a), torch.from_numpy(b), out=torch.from_numpy(out))


def _softmax(x: np.ndarray, axis: int, out: np.ndarray) -> None:
    torch = _torch or _t()
    torch.softmax(torch.from_numpy(x), axis, out=torch.from_numpy(out))


def _log_softmax(x: np.ndarray, axis: int, out: np.ndarray) -> None:
    torch = _torch or _t()
    torch.from_numpy(out).copy_(torch.log_softmax(torch.from_numpy(x), axis))


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, first_axis: int, eps: float, out: np.ndarray) -> None:
    torch = _torch or _t()
    res = torch.nn.functional.layer_norm(torch.from_numpy(x), x.shape[first_axis:], torch.from_numpy(g), torch.from_numpy(b), eps)
    torch.from_numpy(out).copy_(res)


def _rms_norm(x: np.ndarray, w: np.ndarray, first_axis: int, eps: float, out: np.ndarray) -> None:
    torch = _torch or _t()
    res = torch.nn.functional.rms_norm(torch.from_numpy(x), x.shape[first_axis:], torch.from_numpy(w), eps)
    torch.from_numpy(out).copy_(res)


def _unary(name: str) -> Any:
    def call(x: np.ndarray, out: np.ndarray) -> None:
        torch = _torch or _t()
        X, O = torch.from_numpy(x), torch.from_numpy(out)
        if name == "gelu":
            torch._C._nn.gelu(X, out=O)
        elif name == "gelu_tanh":
            torch._C._nn.gelu(X, approximate="tanh", out=O)
        elif name == "silu":
            torch._C._nn.silu(X, out=O)
        elif name == "relu":
            torch.clamp_min(X, 0, out=O)
        else:
            getattr(torch, name)(X, out=O)

    call.__name__ = f"torch_{name}"
    return call


def _binary(name: str) -> Any:
    torch_name = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div"}[name]

    def call(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        torch = _torch or _t()
        getattr(torch, torch_name)(torch.from_numpy(a), torch.from_numpy(b), out=torch.from_numpy(out))

    call.__name__ = f"torch_{name}"
    return call


def _conv2d(x: np.ndarray, w: np.ndarray, *rest: Any) -> None:
    torch = _torch or _t()
    *bias, strides, padding, dilation, groups, out = rest
    b = torch.from_numpy(bias[0]) if bias else None
    res = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), b, tuple(strides), tuple(padding[:2]), tuple(dilation), groups)
    torch.from_numpy(out).copy_(res)


def _sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, *rest: Any) -> None:
    """``rest``: ``[mask,] causal, scale, out``; ``scale <= 0`` means ``1 / sqrt(head_dim)``."""
    torch = _torch or _t()
    *mask_arg, causal, scale, out = rest
    sq, skv = q.shape[1], k.shape[1]
    Q, K, V = (torch.from_numpy(a).transpose(1, 2) for a in (q, k, v))
    mask = torch.from_numpy(mask_arg[0]) if mask_arg else None
    empty_rows = mask is not None and mask.dtype == torch.bool
    if causal and (mask is not None or sq != skv):
        keep = torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq)
        empty_rows = empty_rows or sq > skv
        if mask is None or mask.dtype == torch.bool:
            mask = keep if mask is None else mask & keep
        else:
            mask = mask.masked_fill(~keep, float("-inf"))
        causal = False
    res = torch.nn.functional.scaled_dot_product_attention(
        Q, K, V, attn_mask=mask, is_causal=bool(causal), scale=None if scale <= 0 else float(scale), enable_gqa=q.shape[2] != k.shape[2]
    )
    O = torch.from_numpy(out)
    O.copy_(res.transpose(1, 2))
    if empty_rows:
        O.nan_to_num_(0.0)


_EXTERNS: dict[str, Any] = {
    "torch.linear": _linear,
    "torch.linear_bias": _linear_bias,
    "torch.matmul": _matmul,
    "torch.softmax": _softmax,
    "torch.log_softmax": _log_softmax,
    "torch.layer_norm": _layer_norm,
    "torch.rms_norm": _rms_norm,
    "torch.conv2d": _conv2d,
    "torch.sdpa": _sdpa,
    **{f"torch.{n}": _unary(n) for n in UNARY},
    **{f"torch.{n}": _binary(n) for n in BINARY},
}
for _sym, _fn in _EXTERNS.items():
    register_extern(_sym, _fn, override=True)


# -- predicates ----------------------------------------------------------------------------------


def _root(m: PatternMatch) -> Call:
    call = m.root_call
    assert call is not None
    return call


def _rank(e: Any) -> int:
    info = e.info
    return info.ndim if isinstance(info, TensorInfo) else -1


def _trailing_axes(call: Call) -> int | None:
    """The first axis when ``call.attrs["axes"]`` are the trailing axes of its input."""
    nd = _rank(call.args[0])
    axes = sorted(a + nd if a < 0 else a for a in call.attrs["axes"])
    if not axes or axes != list(range(axes[0], nd)):
        return None
    return axes[0]


def _plain(m: PatternMatch) -> bool:
    return same_dtype_in(m, DTYPES)


def _linear_ok(m: PatternMatch) -> bool:
    args = _root(m).args
    return _plain(m) and _rank(args[0]) >= 1 and _rank(args[1]) == 2


def _matmul_ok(m: PatternMatch) -> bool:
    return _plain(m) and _root(m).attrs["out_dtype"] is None


def _norm_ok(m: PatternMatch) -> bool:
    return _plain(m) and _trailing_axes(_root(m)) is not None


def _conv_ok(m: PatternMatch) -> bool:
    call = _root(m)
    pad = call.attrs["padding"]
    geometry_known = all(isinstance(call.attrs[k], tuple) for k in ("strides", "padding", "dilation"))
    return _plain(m) and geometry_known and _rank(call.args[0]) == 4 and tuple(pad[:2]) == tuple(pad[2:])


def _sdpa_ok(m: PatternMatch) -> bool:
    args = _root(m).args
    if len(args) == 4:
        mask = args[3].info
        if not isinstance(mask, TensorInfo) or mask.dtype not in (*DTYPES, "bool"):
            return False
        qkv = [a.info for a in args[:3]] + [_root(m).info]
        dtypes = {i.dtype if isinstance(i, TensorInfo) and i.shape is not None else None for i in qkv}
        return len(dtypes) == 1 and dtypes <= set(DTYPES)
    return _plain(m)


# -- lowering ------------------------------------------------------------------------------------


def _lower(region: Region) -> Call:
    call = region.calls[-1]
    assert isinstance(call.callee, OpRef)
    name = call.callee.name
    args = list(call.args)
    if name == "linear":
        return lib_call("torch.linear_bias" if len(args) == 3 else "torch.linear", args, region)
    if name in ("softmax", "log_softmax"):
        nd = len(shape_of(args[0]))
        axis = call.attrs["axis"]
        return lib_call(f"torch.{name}", [args[0], PrimValue.of(axis + nd if axis < 0 else axis)], region)
    if name in ("layer_norm", "rms_norm"):
        first = _trailing_axes(call)
        assert first is not None
        return lib_call(f"torch.{name}", [*args, PrimValue.of(first), PrimValue.of(float(call.attrs["eps"]), "float64")], region)
    if name == "conv2d":
        a = call.attrs
        geometry = [ShapeExpr.of(tuple(a["strides"])), ShapeExpr.of(tuple(a["padding"])), ShapeExpr.of(tuple(a["dilation"])), PrimValue.of(int(a["groups"]))]
        return lib_call("torch.conv2d", [*args, *geometry], region)
    if name == "attention":
        scale = call.attrs["scale"]
        flags = [PrimValue.of(bool(call.attrs["causal"])), PrimValue.of(-1.0 if scale is None else float(scale), "float64")]
        return lib_call("torch.sdpa", [*args, *flags], region)
    return lib_call(f"torch.{name}", args, region)


TORCH = register_backend(
    Backend(
        "torch",
        "library",
        _available,
        (
            Capability("torch.linear", op_call("linear"), _linear_ok),
            Capability("torch.matmul", op_call("matmul"), _matmul_ok),
            Capability("torch.sdpa", op_call("attention"), _sdpa_ok),
            Capability("torch.conv2d", op_call("conv2d"), _conv_ok),
            Capability("torch.layer_norm", op_call("layer_norm"), _norm_ok),
            Capability("torch.rms_norm", op_call("rms_norm"), _norm_ok),
            Capability("torch.softmax", op_call(("softmax", "log_softmax")), _plain),
            Capability("torch.unary", is_op(UNARY, wildcard()), _plain),
            Capability("torch.binary", is_op(BINARY, wildcard(), wildcard()), _plain),
        ),
        lower=_lower,
        description="ATen kernels through torch.from_numpy views, writing into tilework's buffers",
    )
)

__all__ = ["TORCH", "DTYPES", "UNARY", "BINARY"]
