"""fuse_attention: attention written out as graph ops becomes the fused ``attention`` op.

Exporters that do not know an attention op (ONNX's TorchScript exporter, torch.export of
"eager" attention) write it as

    s = matmul(q, kt)                 # q: [b, h, sq, d], kt: [b, h, d, skv]; each maybe
                                      # multiplied by a scalar constant first
    s = multiply(s, c) | divide(s, c) # optional; c a scalar constant
    s = add(s, mask) | add(mask, s)   # optional; mask broadcasts to [b, h, sq, skv]
    p = softmax(s, axis=-1)
    p = where(isnan(p), 0, p)         # optional: zeros for a query that sees no key
    o = matmul(p, v)                  # v: [b, h, skv, dv]

which materializes the ``[b, h, sq, skv]`` scores twice and runs two batched matmuls and a
softmax as separate kernels. The pass rewrites ``o`` to ``permute_dims(attention(q', k', v',
mask, scale), [0, 2, 1, 3])`` with ``q' = permute_dims(q, [0, 2, 1, 3])`` (likewise ``k'`` from
``kt`` and ``v'``): the online-softmax kernel of ``tilework.op.attention_kernel``, which never
stores the scores. Two more rules (``tilework.transform.layout_rules``) then fold a
``permute_dims`` of a ``permute_dims`` into one (or none, when they cancel) and drop a
``reshape`` to the shape its input has, so the transposes the exporter wrote around the heads
disappear (ONNX's export of ``scaled_dot_product_attention`` reshapes the heads' output to its
own shape between two of them).

The scale is the product of the constants (torch's ONNX export of ``scaled_dot_product_attention``
multiplies ``q`` and ``kt`` by ``scale ** 0.5`` each, and guards the softmax with ``where(isnan(p),
0, p)``: the kernel's rows that see no key are zeros already; a NaN the inputs carry into the
scores stays NaN in the kernel where the guard would have made its row zeros).

Only a closed match is rewritten (the scores, the scaled and masked scores and the probabilities
are read by nothing else); float32/float64 tensors of rank 4 with a static head count; the
mask float (added) or bool (keeps where True).

A float mask ``where(c, 0, -inf)`` (what ONNX exports of transformers' SDPA masks add) becomes
the bool mask ``c``: the same keys seen, the same zeros for a row that sees none. Another rule
drops a factor of an ``attention``'s bool mask that is provably all True:
``attention(q, k, v, logical_and(a, b))`` -> ``attention(q, k, v, b)`` where every element of ``a``
is True (the op broadcasts ``b`` itself). transformers builds its SDPA masks so: the padding mask
``[b, 1, 1, kv]`` and-ed with a "query index >= 0" term ``[1, 1, sq, 1]`` (``arange(sq) >= 0``),
giving ``[b, 1, sq, kv]``; without the term the kernel reads one bias per key for all its rows
(``tilework.op.attention_kernel``) instead of a byte a score gathered across the rows
(all-MiniLM-L6-v2 at (8, 256), 2 threads: 8.4 -> 6.1 ms an attention call in float32, with
``key_biases``). Proven all True: a
bool constant of True, ``logical_and`` of such, ``greater_equal(x, c)`` with ``c`` a constant
at most ``x``'s least value (an ``arange`` with a nonnegative step starts at its least value;
``expand_dims``, ``reshape``, ``broadcast_to`` keep it; ``add`` sums the bounds), and
``expand_dims``/``reshape``/``broadcast_to`` of such.

Requires a well-formed module; guarantees a well-formed module computing the same values up to
floating-point reassociation (the kernel sums in another order).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tilework.ir.graph import Call, Constant, Expr, OpRef
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.op.manipulate import permute_dims
from tilework.op.nn import attention
from tilework.pattern.core import Match, is_const, is_op, op_call, wildcard
from tilework.pattern.graph import PatternMatch
from tilework.pattern.rewrite import rewrite_subgraphs
from tilework.transform.base import Pass
from tilework.transform.layout_rules import PERMUTE_OF_PERMUTE, RESHAPE_TO_OWN_SHAPE
from tilework.transform.rewrite_driver import Rule, apply_rules

_DTYPES = ("float32", "float64")
_TO_BSHD = (0, 2, 1, 3)  # [b, h, s, d] <-> [b, s, h, d]


def _pattern() -> object:
    q = is_op("multiply", wildcard("q"), is_const("qscale")) | wildcard("q")
    kt = is_op("multiply", wildcard("kt"), is_const("kscale")) | wildcard("kt")
    scores = is_op("matmul", q, kt)
    scaled = is_op("multiply", scores, is_const("scale")) | is_op("divide", scores, is_const("divisor")) | scores
    masked = is_op("add", scaled, wildcard("mask")) | is_op("add", wildcard("mask"), scaled)
    probs = is_op("softmax", masked | scaled).attr_where("axis", lambda a: a in (3, -1))
    guarded = is_op("where", is_op("isnan", probs.named("probs")), is_const("zero"), wildcard("probs"))
    return is_op("matmul", guarded | probs, wildcard("v"))


def _rank4(e: Expr | None) -> TensorInfo | None:
    info = None if e is None else e.info
    if isinstance(info, TensorInfo) and info.shape is not None and len(info.shape) == 4 and info.dtype in _DTYPES:
        return info
    return None


def _value(c: Expr | None) -> float | None:
    """The value of a one-element constant, else None."""
    if not isinstance(c, Constant) or np.asarray(c.data).size != 1:
        return None
    return float(np.asarray(c.data).reshape(()))


def _scalar(c: Expr | None) -> float | None:
    """A finite, nonzero one-element constant's value (a scale or divisor), else None."""
    v = _value(c)
    return v if v is not None and np.isfinite(v) and v != 0.0 else None


def _fuse(m: PatternMatch) -> Expr | None:
    if not m.is_closed():
        return None
    q, kt, v, mask = _rank4(m["q"]), _rank4(m["kt"]), _rank4(m["v"]), m.get("mask")
    if q is None or kt is None or v is None or not (q.dtype == kt.dtype == v.dtype):
        return None
    heads = q.shape[1]  # type: ignore[index]
    if not isinstance(heads, int) or kt.shape[1] != heads or v.shape[1] != heads:  # type: ignore[index]
        return None
    scale: float | None = 1.0
    if m.get("scale") is not None:
        scale = _scalar(m.get("scale"))
    elif m.get("divisor") is not None:
        divisor = _scalar(m.get("divisor"))
        scale = None if divisor is None else 1.0 / divisor
    for name in ("qscale", "kscale"):  # q and kt scaled before their product (by sqrt(scale) each)
        if scale is not None and m.get(name) is not None:
            factor = _scalar(m.get(name))
            scale = None if factor is None else scale * factor
    if scale is None:
        return None
    if m.get("zero") is not None and _value(m.get("zero")) != 0.0:  # the guard's fill must be 0
        return None
    if mask is not None:
        mi = mask.info
        if not (isinstance(mi, TensorInfo) and mi.shape is not None and len(mi.shape) <= 4 and mi.dtype in (q.dtype, "bool")):
            return None
    qb = permute_dims(m["q"], _TO_BSHD)
    kb = permute_dims(m["kt"], (0, 3, 1, 2))
    vb = permute_dims(m["v"], _TO_BSHD)
    return permute_dims(attention(qb, kb, vb, mask=mask, scale=scale), _TO_BSHD)


_SHAPE_ONLY = ("expand_dims", "reshape", "broadcast_to")  # ops that move or repeat values only
_DEPTH = 12  # how far back through the producers the proofs look


def _producer(e: Expr, m: Match) -> tuple[str, Call] | tuple[None, Expr]:
    """The op name and call that computes ``e`` (bindings followed), or (None, the value)."""
    c = m.ctx.resolve(e)
    if isinstance(c, Call) and isinstance(c.callee, OpRef):
        return c.callee.name, c
    return None, c


def _least(e: Expr, m: Match, depth: int = _DEPTH) -> float | None:
    """A lower bound of every element of ``e``, where one is plain (see the module docstring)."""
    name, c = _producer(e, m)
    if isinstance(c, Constant):
        data = np.asarray(c.data)
        return float(data.min()) if data.size and data.dtype.kind in "iuf" else None
    if name is None or depth == 0 or not isinstance(c, Call):
        return None
    if name == "arange":
        start, step = c.attrs.get("start"), c.attrs.get("step")
        return float(start) if isinstance(start, (int, float)) and isinstance(step, (int, float)) and step >= 0 else None
    if name in _SHAPE_ONLY:
        return _least(c.args[0], m, depth - 1)
    if name == "add" and len(c.args) == 2:
        a, b = _least(c.args[0], m, depth - 1), _least(c.args[1], m, depth - 1)
        return None if a is None or b is None else a + b
    return None


def _all_true(e: Expr, m: Match, depth: int = _DEPTH) -> bool:
    """Every element of bool tensor ``e`` is provably True (see the module docstring)."""
    name, c = _producer(e, m)
    if isinstance(c, Constant):
        data = np.asarray(c.data)
        return data.dtype == np.bool_ and bool(data.all())
    if name is None or depth == 0 or not isinstance(c, Call):
        return False
    if name == "logical_and":
        return all(_all_true(a, m, depth - 1) for a in c.args)
    if name in _SHAPE_ONLY:
        return _all_true(c.args[0], m, depth - 1)
    if name == "greater_equal" and len(c.args) == 2:
        _, bound = _producer(c.args[1], m)
        least = _least(c.args[0], m, depth - 1)
        if isinstance(bound, Constant) and least is not None and np.asarray(bound.data).size:
            return least >= float(np.asarray(bound.data).max())
    return False


def _mask_call(value: Expr, m: Match, op: str, arity: int) -> Call | None:
    """The call of ``op`` (with ``arity`` operands) that computes the mask of the attention
    ``value``, else None."""
    assert isinstance(value, Call)
    if len(value.args) != 4:
        return None
    name, mask = _producer(value.args[3], m)
    return mask if name == op and isinstance(mask, Call) and len(mask.args) == arity else None


def _with_bool_mask(value: Expr, mask: Expr | None) -> Expr | None:
    """The attention ``value`` with ``mask`` for its mask, where that is a bool tensor of rank
    at most 4 (the op broadcasts it)."""
    assert isinstance(value, Call)
    if mask is None:
        return None
    info = mask.info
    if not (isinstance(info, TensorInfo) and info.dtype == "bool" and info.shape is not None and len(info.shape) <= 4):
        return None
    return dataclasses.replace(value, args=(*value.args[:3], mask))


def _bool_mask(value: Expr, m: Match) -> Expr | None:
    """``attention(q, k, v, where(c, 0, -inf))`` -> ``attention(q, k, v, c)``: the float mask
    adds 0 where ``c`` is True and hides the key where it is not, which is what a bool mask
    does (a row that sees no key is zeros either way)."""
    mask = _mask_call(value, m, "where", 3)
    if mask is None:
        return None
    cond, keep, hide = mask.args
    if _value(_producer(keep, m)[1]) != 0.0 or _value(_producer(hide, m)[1]) != -np.inf:
        return None
    return _with_bool_mask(value, cond)


def _drop_true_mask_factor(value: Expr, m: Match) -> Expr | None:
    """``attention(q, k, v, logical_and(a, b))`` -> ``attention(q, k, v, b)`` where ``a`` is all
    True (or the same with ``b``)."""
    mask = _mask_call(value, m, "logical_and", 2)
    if mask is None:
        return None
    a, b = mask.args
    return _with_bool_mask(value, b if _all_true(a, m) else a if _all_true(b, m) else None)


@dataclass(frozen=True)
class FuseAttention(Pass):
    """See the module docstring."""

    name: str = "fuse_attention"

    def run(self, mod: IRModule) -> IRModule:
        fused = rewrite_subgraphs(mod, [(_pattern(), _fuse)])  # type: ignore[list-item]
        rules = [
            Rule("attention_mask_as_bool", op_call("attention"), _bool_mask),
            Rule("attention_mask_all_true_factor", op_call("attention"), _drop_true_mask_factor),
        ]
        if fused is not mod:
            rules += [PERMUTE_OF_PERMUTE, RESHAPE_TO_OWN_SHAPE]
        return apply_rules(fused, rules)


__all__ = ["FuseAttention"]
