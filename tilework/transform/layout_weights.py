"""layout_weights: weights are laid out once, at compile time, the way their kernels read them.

A ``linear(x, w, b)`` (``x @ w.T + b`` with torch's ``[out, in]`` weight) whose weight is a
constant becomes ``linear_io(x, wt, b, out_features=out)`` with ``wt = w.T`` stored contiguous
``[in, columns]``: the matmul kernels' register tiles then load contiguous columns of ``wt``
for every ``k``, and no call copies or transposes a weight (the ``[out, in]`` layout made the
many-rows kernel copy the weight transposed on every call, and the few-rows kernel run dot
products). ``columns`` (``padded_columns``) pads a row to an odd number of cache lines, so
that the rows of a column panel spread over the cache sets instead of piling into a few of
them (a 16 KiB stride maps every row of a panel to the same sets of L1 and L2).

With ``params=True`` the same holds for trailing weight params of ``main`` (after
``num_inputs``) that are read only as linear weights: such a param becomes ``[in, out]`` and
its index among the params is recorded in ``main``'s attr ``transposed_weights``; whoever
passes the weights (``tilework.compile``) transposes them once (``transpose_weights``).

Only float32 and float64 linears are rewritten (the narrow types keep their own kernels).
Requires a well-formed module;
guarantees a well-formed module computing the same values (given the transposed weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tilework.ir.graph import Binding, Call, Constant, Expr, GraphFunc, OpRef, Var, bindings_of, used_vars
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.op.linalg import linear_io
from tilework.pattern.core import Match, op_call
from tilework.transform.base import Pass
from tilework.transform.rewrite_driver import Rule, apply_rules

ATTR = "transposed_weights"
_DTYPES = ("float32", "float64")
_LINE_BYTES = 64


def padded_columns(out_features: int, itemsize: int) -> int:
    """The row length of a laid-out weight: ``out_features`` rounded up to whole cache lines,
    plus one line when that count is even."""
    per_line = max(1, _LINE_BYTES // itemsize)
    lines = -(-out_features // per_line)
    return (lines + (lines % 2 == 0)) * per_line


def lay_out(w: np.ndarray) -> np.ndarray:
    """A ``[out, in]`` weight as ``linear_io`` takes it: ``[in, padded_columns(out)]``,
    transposed, zero-padded, contiguous."""
    out_f, in_f = w.shape
    wt = np.zeros((in_f, padded_columns(out_f, w.dtype.itemsize)), w.dtype)
    wt[:, :out_f] = w.T
    return wt


def _weight_info(e: Expr) -> TensorInfo | None:
    """The info of a linear weight this pass can lay out: a static or symbolic 2-D float32 or
    float64 tensor."""
    info = e.info
    if not isinstance(info, TensorInfo) or info.dtype not in _DTYPES or info.shape is None or len(info.shape) != 2:
        return None
    return info


def _is_linear(e: Expr) -> bool:
    return isinstance(e, Call) and isinstance(e.callee, OpRef) and e.callee.name == "linear" and len(e.args) in (2, 3)


def _rewritable(call: Call) -> bool:
    """A linear whose input, weight and result share a float32/float64 dtype and whose
    weight has a static out_features."""
    out, w = call.info, _weight_info(call.args[1])
    if w is None or w.shape is None or not isinstance(w.shape[0], int):
        return False
    x = call.args[0].info
    return (
        w is not None
        and isinstance(out, TensorInfo) and out.dtype == w.dtype
        and isinstance(x, TensorInfo) and x.dtype == w.dtype
    )  # fmt: skip


def _weight_params(f: GraphFunc) -> list[int]:
    """Indices of the trailing weight params of ``f`` read only as the weight of rewritable
    linears."""
    first = int(f.attrs.get("num_inputs", len(f.params)))
    return [i for i, p in enumerate(f.params) if i >= first and _weight_info(p) is not None and _used(f, p) and _only_as_weight(f, p)]


def _used(f: GraphFunc, p: Var) -> bool:
    return any(p in used_vars(b.value) for b in bindings_of(f))


def _only_as_weight(f: GraphFunc, p: Var) -> bool:
    for b in bindings_of(f):
        uses = sum(v is p for v in used_vars(b.value))
        if not uses:
            continue
        v = b.value
        if not (isinstance(b, Binding) and _is_linear(v) and isinstance(v, Call) and _rewritable(v)):
            return False
        if v.args[1] is not p or uses != 1:
            return False
    body_uses = [v for v in used_vars(f.body.body) if v is p]
    return not body_uses


class _Layout:
    """The rewrite of one module: transposed constants are made once per constant."""

    def __init__(self, params: dict[Var, Var]) -> None:
        self.params = params  # old weight param -> the transposed param
        self.constants: dict[int, Constant] = {}

    def transposed(self, w: Expr, m: Match) -> Expr | None:
        if isinstance(w, Var) and w in self.params:
            return self.params[w]
        c = m.ctx.resolve(w) if isinstance(w, Var) else w
        if not isinstance(c, Constant) or _weight_info(c) is None:
            return None
        done = self.constants.get(id(c))
        if done is None:
            data = lay_out(c.data)
            done = Constant(data, TensorInfo(tuple(int(d) for d in data.shape), str(data.dtype)), f"{c.name}.T" if c.name else "")
            self.constants[id(c)] = done
        return done

    def rewrite(self, value: Expr, m: Match) -> Expr | None:
        assert isinstance(value, Call)
        if not _rewritable(value) and value.args[1] not in self.params:
            return None
        wt = self.transposed(value.args[1], m)
        if wt is None:
            return None
        w = value.args[1].info
        assert isinstance(w, TensorInfo) and w.shape is not None and isinstance(w.shape[0], int)
        return linear_io(value.args[0], wt, value.args[2] if len(value.args) == 3 else None, w.shape[0])


def transposed_params(f: GraphFunc) -> tuple[int, ...]:
    """The param indices ``layout_weights`` transposed in ``f`` (its ``transposed_weights``)."""
    return tuple(int(i) for i in f.attrs.get(ATTR, ()))


def transpose_weights(mod: IRModule, weights: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``weights`` (the trailing params of ``mod``'s ``main``, in order) laid out as the
    module's ``main`` takes them: the ones ``layout_weights`` laid out, through ``lay_out``."""
    main = mod.get("main")
    out = list(weights)
    if not isinstance(main, GraphFunc):
        return out
    first = int(main.attrs.get("num_inputs", len(main.params)))
    for i in transposed_params(main):
        out[i - first] = lay_out(np.asarray(out[i - first]))
    return out


@dataclass(frozen=True)
class LayoutWeights(Pass):
    """See the module docstring. ``params``: lay out ``main``'s trailing weight params too."""

    params: bool = False
    name: str = "layout_weights"

    def run(self, mod: IRModule) -> IRModule:
        mapping: dict[Var, Var] = {}
        main = mod.get("main")
        if self.params and isinstance(main, GraphFunc) and "num_inputs" in main.attrs and ATTR not in main.attrs:
            idx = _weight_params(main)
            if idx:
                params = list(main.params)
                for i in idx:
                    p = params[i]
                    info = p.info
                    assert isinstance(info, TensorInfo) and info.shape is not None
                    assert isinstance(info.shape[0], int) and info.dtype is not None
                    cols = padded_columns(info.shape[0], np.dtype(info.dtype).itemsize)
                    params[i] = Var(p.name, TensorInfo((info.shape[1], cols), info.dtype))
                    mapping[p] = params[i]
                mod = mod.with_func("main", main.replace(params=tuple(params), attrs=main.attrs.with_(**{ATTR: tuple(idx)})))
        layout = _Layout(mapping)
        return apply_rules(mod, [Rule("linear_weight_layout", op_call("linear"), layout.rewrite)])


__all__ = ["ATTR", "LayoutWeights", "lay_out", "padded_columns", "transpose_weights", "transposed_params"]
