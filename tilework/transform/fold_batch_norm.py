"""fold_batch_norm: an inference batch norm after a convolution is folded into its weights.

``batch_norm(conv(x, w, b?), mean, var, gamma, beta, axis=1, eps)`` (``conv1d`` or ``conv2d``,
any strides, padding, dilation and groups) computes ``conv(x, w * s, (b - mean) * s + beta)``
per output channel with ``s = gamma / sqrt(var + eps)``: the normalization becomes the conv's
bias and one elementwise kernel less runs per call (in a ResNet or MobileNet, every conv is
followed by one). The conv's result must be read by the batch norm only, and ``w``, ``b``,
``mean``, ``var``, ``gamma`` and ``beta`` must all be known at compile time: constants (also
behind var bindings), or trailing weight params of ``main`` whose values are given.

**Where the values come from.** The ``FoldBatchNorm`` pass folds constants only (a module built
with its weights as constants: ONNX initializers, ``weights="constants"``). ``tilework.compile``
passes weights as trailing params of ``main`` by default, so it calls ``fold_batch_norm(mod,
weights)`` with the arrays before the graph passes: each fold computes the folded weight and
bias from the arrays (in float64, stored in the conv's dtype) and passes them as two new
trailing params appended to ``main``; trailing params that nothing reads any more (the original
weights and statistics of the folded convs) are dropped, with their arrays. The function
returns the new module and the weight list ``main`` now takes, so a caller that passes weights
must use that list from then on (a compiled model saves it). Folding changes the rounding of the
result by a few float32 ulps, like any reassociation.

Only float32 and float64 convs are folded; anything else (another axis, a statistic computed
at run time, a conv result read twice) is left as it is.
Requires a well-formed module; guarantees a well-formed module computing the same values (given
the returned weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tilework.ir.graph import Binding, Call, Constant, Expr, GraphFunc, OpRef, Var, bindings_of, used_vars
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.op.base import make_call
from tilework.pattern.core import Match, op_call
from tilework.transform.base import Pass
from tilework.transform.dead_code_elimination import eliminate_in_func
from tilework.transform.rewrite_driver import Rule, apply_rules

_CONVS = ("conv1d", "conv2d")
_DTYPES = ("float32", "float64")


def _op(e: Expr, names: Sequence[str]) -> bool:
    return isinstance(e, Call) and isinstance(e.callee, OpRef) and e.callee.name in names


@dataclass
class _Fold:
    """One batch norm to fold: the conv it reads and the folded weight and bias (as exprs)."""

    conv: Call
    weight: Expr
    bias: Expr


class _Planner:
    """Finds the batch norms of one function that fold, and makes their folded weights."""

    def __init__(self, f: GraphFunc, arrays: dict[Var, np.ndarray], as_params: bool) -> None:
        self.values = {b.var: b.value for b in bindings_of(f) if isinstance(b, Binding)}
        self.arrays = arrays  # trailing params with known values
        self.as_params = as_params
        self.new_params: list[Var] = []
        self.new_arrays: list[np.ndarray] = []
        uses: dict[Var, int] = {}
        for b in bindings_of(f):
            for v in used_vars(b.value):
                uses[v] = uses.get(v, 0) + 1
        for v in used_vars(f.body.body):
            uses[v] = uses.get(v, 0) + 1
        self.uses = uses

    def resolve(self, e: Expr) -> Expr:
        seen = 0
        while isinstance(e, Var) and e in self.values and seen < 64:
            e = self.values[e]
            seen += 1
        return e

    def array(self, e: Expr) -> np.ndarray | None:
        """The compile-time value of ``e``: a constant's data or a given weight param's array."""
        r = self.resolve(e)
        if isinstance(r, Constant):
            return np.asarray(r.data)
        if isinstance(r, Var) and r in self.arrays:
            return np.asarray(self.arrays[r])
        return None

    def plan(self, bn: Call) -> _Fold | None:
        x = bn.args[0]
        out = bn.info
        if not (isinstance(x, Var) and self.uses.get(x, 0) == 1 and isinstance(out, TensorInfo) and out.dtype in _DTYPES):
            return None
        conv = self.resolve(x)
        if not _op(conv, _CONVS) or not isinstance(conv.info, TensorInfo) or conv.info.dtype != out.dtype:
            return None
        assert isinstance(conv, Call)
        if int(bn.attrs.get("axis", 1)) not in (1, 1 - conv.info.ndim):
            return None
        arrays = [self.array(a) for a in (conv.args[1], *bn.args[1:])]
        bias = self.array(conv.args[2]) if len(conv.args) == 3 else np.zeros(0)
        if any(a is None for a in arrays) or bias is None:
            return None
        w, mean, var, gamma, beta = (np.asarray(a, np.float64) for a in arrays)
        channels = w.shape[0]
        if w.ndim < 3 or any(a.shape != (channels,) for a in (mean, var, gamma, beta)) or bias.shape not in ((0,), (channels,)):
            return None
        scale = gamma / np.sqrt(var + float(bn.attrs["eps"]))
        wf = (w * scale.reshape((channels,) + (1,) * (w.ndim - 1))).astype(out.dtype)
        bf = ((np.asarray(bias, np.float64) if bias.size else 0.0) - mean) * scale + beta
        base = conv.args[1].name if isinstance(conv.args[1], Var) else "conv"
        return _Fold(conv, self.expr(wf, f"{base}_bn"), self.expr(np.asarray(bf, out.dtype), f"{base}_bn_bias"))

    def expr(self, data: np.ndarray, name: str) -> Expr:
        data = np.ascontiguousarray(data)
        info = TensorInfo(tuple(int(d) for d in data.shape), str(data.dtype))
        if not self.as_params:
            return Constant(data, info, name)
        p = Var(name, info)
        self.new_params.append(p)
        self.new_arrays.append(data)
        return p


def _plans(f: GraphFunc, planner: _Planner) -> dict[Var, _Fold]:
    plans = {}
    for b in bindings_of(f):
        if isinstance(b, Binding) and _op(b.value, ("batch_norm",)):
            assert isinstance(b.value, Call)
            fold = planner.plan(b.value)
            if fold is not None:
                plans[b.var] = fold
    return plans


def _rewrite(mod: IRModule, name: str, plans: dict[Var, _Fold]) -> IRModule:
    def rewrite(value: Expr, m: Match) -> Expr | None:
        fold = plans.get(m.ctx.var)
        if fold is None or not isinstance(value, Call):
            return None
        conv = m.ctx.resolve(value.args[0])  # the conv as re-emitted (its input remapped)
        if not _op(conv, _CONVS):
            return None
        assert isinstance(conv, Call) and isinstance(conv.callee, OpRef)
        return make_call(conv.callee.name, [conv.args[0], fold.weight, fold.bias], **dict(conv.attrs.items()))

    mod = apply_rules(mod, [Rule("fold_batch_norm", op_call("batch_norm"), rewrite)], funcs=[name])
    f = mod.get(name)
    assert isinstance(f, GraphFunc)
    return mod.with_func(name, eliminate_in_func(f, mod))  # the folded convs' old bindings


def _drop_unused_params(mod: IRModule, weights: list[np.ndarray]) -> tuple[IRModule, list[np.ndarray]]:
    main = mod.get("main")
    assert isinstance(main, GraphFunc)
    first = int(main.attrs.get("num_inputs", len(main.params)))
    read = {v for b in bindings_of(main) for v in used_vars(b.value)} | set(used_vars(main.body.body))
    keep = [i for i, p in enumerate(main.params) if i < first or p in read]
    if len(keep) == len(main.params):
        return mod, weights
    params = tuple(main.params[i] for i in keep)
    return mod.with_func("main", main.replace(params=params)), [weights[i - first] for i in keep if i >= first]


def fold_batch_norm(mod: IRModule, weights: Sequence[np.ndarray] = ()) -> tuple[IRModule, list[np.ndarray]]:
    """``mod`` with its foldable batch norms folded, and the weights its ``main`` takes (see the
    module docstring). ``weights``: the values of ``main``'s trailing params (after
    ``num_inputs``), in order; without them only constants fold."""
    out = list(weights)
    for name, f in list(mod.graph_funcs()):
        arrays: dict[Var, np.ndarray] = {}
        params = name == "main" and "num_inputs" in f.attrs and len(weights) > 0
        if params:
            first = int(f.attrs["num_inputs"])
            if len(f.params) - first != len(weights):
                params = False
            else:
                arrays = {p: np.asarray(weights[i - first]) for i, p in enumerate(f.params) if i >= first}
        planner = _Planner(f, arrays, params)
        plans = _plans(f, planner)
        if not plans:
            continue
        if planner.new_params:
            f = f.replace(params=(*f.params, *planner.new_params))
            mod = mod.with_func(name, f)
            out += planner.new_arrays
        mod = _rewrite(mod, name, plans)
        if params:
            mod, out = _drop_unused_params(mod, out)
    return mod, out


@dataclass(frozen=True)
class FoldBatchNorm(Pass):
    """See the module docstring: folds batch norms whose weights and statistics are constants."""

    name: str = "fold_batch_norm"

    def run(self, mod: IRModule) -> IRModule:
        return fold_batch_norm(mod)[0]


__all__ = ["FoldBatchNorm", "fold_batch_norm"]
