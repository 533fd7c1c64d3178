"""bf16_weights: float32 linear weights stored as bfloat16, products accumulated in float32.

A ``linear(x, w[, b])`` (torch's ``[out, in]`` weight) whose ``x``, ``w`` and result are
float32 and whose weight is a constant becomes ``quant_linear(x, wq, "bf16", in)`` (``+ b``),
``wq`` the weight rounded to bfloat16 (to nearest, ties to even: ``bf16_rows``) as
``uint8[out, 2 * in]``; so does a ``matmul(x, w)`` with a constant ``[in, out]`` weight (ONNX's
MatMul with an initializer), its weight transposed as it is converted. The ``quant`` backend
runs that op: products and sums in float32, the weights decoded exactly; the rounding added is
that of the weights, each by less than a relative ``2**-8`` (``BF16_UNIT``), and where the CPU
has AVX-512 BF16 that of ``x`` too, at every row count (rounded to bf16 for the
``vdpbf16ps`` dot products, twice the float32 rate: ``tilework.backend.quant``). So per output
``|y - y32| <= (2 * 2**-8 + 2**-16) * sum_k |x_k w_k|`` plus float32 rounding
(``BF16_BOUND``); ``2**-8`` where ``x`` is not rounded.

With ``groups=True`` a weight of whole groups of 16 rows (``out``) and an even ``in`` is
stored as ``bf16x16`` instead (the same values, rows interleaved by pairs in groups of 16:
``tilework.op.quant``), which the ``quant`` backend multiplies with AVX-512 BF16 without
packing; ``tilework.compile`` asks for it where the quant library has those instructions.

With ``attention=True`` every float32 ``attention`` multiplies in bfloat16 too (its attr
``bf16``: queries, keys, values and probabilities rounded, float32 sums; ``tilework.op.nn``):
``tilework.compile`` asks for it where the CPU has AVX-512 BF16, where its products run at
twice the float32 rate (elsewhere they would only round).

With ``params=True`` the same holds for trailing weight params of ``main`` (after
``num_inputs``) that are read only as such linear weights: they become ``uint8[out, 2 * in]``
and their indices are recorded in ``main``'s attr ``bf16_weights`` (``bf16_weights_t``: read
as ``matmul`` weights, transposed when converted; ``bf16_weights_x16`` set: those of whole
groups interleaved); whoever passes the weights
(``tilework.compile``) converts them once (``convert_weights``). Run before
``layout_weights``, which then leaves these linears alone.

Requires a well-formed module; guarantees a well-formed module computing the same values up to
the weights' rounding (given the converted weights).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tilework.ir.graph import Call, Constant, Expr, GraphFunc, OpRef, Var
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.op.base import make_call
from tilework.op.quant import bf16_rows, bf16_values, interleavable, interleave_rows, quant_linear
from tilework.pattern.core import Match, op_call
from tilework.transform.base import Pass
from tilework.transform.rewrite_driver import Rule, apply_rules
from tilework.transform.weight_params import retype_weight_params, weight_params

ATTR = "bf16_weights"
ATTR_T = "bf16_weights_t"  # weight params of matmuls: [in, out], transposed when converted
ATTR_X16 = "bf16_weights_x16"  # set: the converted weight params of whole groups are bf16x16
BF16_UNIT = 2.0**-8  # the unit roundoff of bfloat16 (8 significant bits), round to nearest
BF16_BOUND = 2 * BF16_UNIT + BF16_UNIT**2  # per output, relative to sum |x_k w_k|: w and x both rounded


def _weight_ok(e: Expr) -> bool:
    info = e.info
    return isinstance(info, TensorInfo) and info.dtype == "float32" and info.shape is not None and len(info.shape) == 2 and all(isinstance(d, int) for d in info.shape)


def _is_linear(e: Expr) -> bool:
    return isinstance(e, Call) and isinstance(e.callee, OpRef) and e.callee.name == "linear" and len(e.args) in (2, 3)


def _is_matmul(e: Expr) -> bool:
    """A ``matmul(x, w)`` whose ``x`` has a known rank of at least 1 (``w`` 2-D: as a linear)."""
    if not (isinstance(e, Call) and isinstance(e.callee, OpRef) and e.callee.name == "matmul" and len(e.args) == 2):
        return False
    x = e.args[0].info
    return isinstance(x, TensorInfo) and x.ndim >= 1


def _rewritable(call: Call) -> bool:
    x, out = call.args[0].info, call.info
    return _weight_ok(call.args[1]) and isinstance(x, TensorInfo) and x.dtype == "float32" and isinstance(out, TensorInfo) and out.dtype == "float32"


def _weight_params(f: GraphFunc) -> list[int]:
    """Indices of trailing params of ``f`` read only, once per use, as the weight of rewritable
    linears (never returned, never read otherwise)."""
    return weight_params(f, _weight_ok, lambda c: _is_linear(c) and _rewritable(c))


def _matmul_params(f: GraphFunc) -> list[int]:
    """The same for the weights of rewritable matmuls."""
    return weight_params(f, _weight_ok, lambda c: _is_matmul(c) and _rewritable(c))


def _grouped(out_f: int, in_f: int, groups: bool) -> bool:
    """Whether an ``[out_f, in_f]`` weight is stored as ``bf16x16`` (``groups`` asked for)."""
    return groups and interleavable("bf16", out_f, in_f)


def _rows(w: np.ndarray, groups: bool) -> np.ndarray:
    """An ``[out, in]`` float32 weight as the bytes its ``quant_linear`` reads."""
    rows = bf16_rows(w)
    return interleave_rows(rows, "bf16") if _grouped(w.shape[0], w.shape[1], groups) else rows


class _Convert:
    """The rewrite of one module: each constant is converted once."""

    def __init__(self, params: dict[Var, Var], groups: bool) -> None:
        self.params = params  # old weight param -> the bf16 param (a matmul's: transposed)
        self.groups = groups
        self.constants: dict[tuple[int, bool], Constant] = {}
        self.count = 0

    def weight(self, w: Expr, m: Match, transposed: bool) -> Expr | None:
        """The bf16 rows of weight ``w`` (``[out, in]``; ``transposed``: ``w`` is ``[in, out]``)."""
        if isinstance(w, Var) and w in self.params:
            return self.params[w]
        c = m.ctx.resolve(w) if isinstance(w, Var) else w
        if not isinstance(c, Constant) or not _weight_ok(c):
            return None
        done = self.constants.get((id(c), transposed))
        if done is None:
            data = np.asarray(c.data)
            data = _rows(data.T if transposed else data, self.groups)
            done = Constant(data, TensorInfo(tuple(int(d) for d in data.shape), "uint8"), f"{c.name}.bf16" if c.name else "")
            self.constants[(id(c), transposed)] = done
        return done

    def rewrite(self, value: Expr, m: Match) -> Expr | None:
        assert isinstance(value, Call)
        matmul = _is_matmul(value)
        if not (matmul or _is_linear(value)) or not _rewritable(value):
            return None
        wq = self.weight(value.args[1], m, matmul)
        if wq is None:
            return None
        w = value.args[1].info
        assert isinstance(w, TensorInfo) and w.shape is not None and isinstance(w.shape[0], int) and isinstance(w.shape[1], int)
        self.count += 1
        out_f, in_f = (w.shape[1], w.shape[0]) if matmul else (w.shape[0], w.shape[1])
        y: Expr = quant_linear(value.args[0], wq, "bf16x16" if _grouped(out_f, in_f, self.groups) else "bf16", in_f)
        if len(value.args) == 3:
            y = make_call("add", [y, value.args[2]])
        return y


def bf16_params(f: GraphFunc, transposed: bool | None = None) -> tuple[int, ...]:
    """The param indices ``bf16_weights`` converted in ``f`` (its ``bf16_weights``; with
    ``transposed`` True only the matmul weights', False only the linear weights')."""
    attrs = (ATTR, ATTR_T) if transposed is None else (ATTR_T,) if transposed else (ATTR,)
    return tuple(sorted(int(i) for a in attrs for i in f.attrs.get(a, ())))


def convert_weights(mod: IRModule, weights: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``weights`` (the trailing params of ``mod``'s ``main``, in order) as the module's
    ``main`` takes them: the ones ``bf16_weights`` converted, through ``bf16_rows`` (and
    ``interleave_rows`` where it stored them as ``bf16x16``)."""
    main = mod.get("main")
    out = list(weights)
    if not isinstance(main, GraphFunc):
        return out
    first = int(main.attrs.get("num_inputs", len(main.params)))
    groups = bool(main.attrs.get(ATTR_X16, False))
    for i in bf16_params(main, transposed=False):
        out[i - first] = _rows(np.asarray(out[i - first], np.float32), groups)
    for i in bf16_params(main, transposed=True):
        out[i - first] = _rows(np.asarray(out[i - first], np.float32).T, groups)
    return out


def weight_error(w: np.ndarray) -> float:
    """The largest relative error of ``w``'s entries after rounding to bfloat16 (measured)."""
    w = np.asarray(w, np.float32)
    nz = w != 0
    if not nz.any():
        return 0.0
    return float(np.max(np.abs(bf16_values(bf16_rows(w)) - w)[nz] / np.abs(w[nz])))


def _bf16_info(info: TensorInfo) -> TensorInfo:
    """A float32 [out, in] weight as bf16 rows: uint8 [out, 2 * in]."""
    assert info.shape is not None
    out_f, in_f = info.shape
    assert isinstance(out_f, int) and isinstance(in_f, int)
    return TensorInfo((out_f, 2 * in_f), "uint8")


def _bf16_info_t(info: TensorInfo) -> TensorInfo:
    """A float32 [in, out] (matmul) weight as bf16 rows of its transpose: uint8 [out, 2 * in]."""
    assert info.shape is not None
    return _bf16_info(TensorInfo(tuple(reversed(info.shape)), "float32"))


@dataclass(frozen=True)
class Bf16Weights(Pass):
    """See the module docstring. ``params``: convert ``main``'s trailing weight params too;
    ``groups``: weights of whole groups of 16 rows as ``bf16x16``; ``attention``: float32
    attention with bfloat16 products."""

    params: bool = False
    groups: bool = False
    attention: bool = False
    name: str = "bf16_weights"

    def run(self, mod: IRModule) -> IRModule:
        mapping: dict[Var, Var] = {}
        if self.params:
            mod, mapping = retype_weight_params(mod, ATTR, _weight_params, _bf16_info)
            mod, transposed = retype_weight_params(mod, ATTR_T, _matmul_params, _bf16_info_t)
            mapping.update(transposed)
            main = mod.get("main")
            if mapping and self.groups and isinstance(main, GraphFunc):
                mod = mod.with_func("main", main.replace(attrs=main.attrs.with_(**{ATTR_X16: 1})))
        convert = _Convert(mapping, self.groups)
        rules = [Rule("linear_bf16_weight", op_call("linear"), convert.rewrite), Rule("matmul_bf16_weight", op_call("matmul"), convert.rewrite)]
        if self.attention:
            rules.append(Rule("attention_bf16", op_call("attention"), _bf16_attention))
        return apply_rules(mod, rules)


def _bf16_attention(value: Expr, m: Match) -> Expr | None:
    """A float32 ``attention`` (q, k, v and result) with bfloat16 products, once."""
    assert isinstance(value, Call)
    infos = [a.info for a in value.args[:3]] + [value.info]
    if value.attrs.get("bf16") or not all(isinstance(i, TensorInfo) and i.dtype == "float32" for i in infos):
        return None
    return dataclasses.replace(value, attrs=value.attrs.with_(bf16=True))


__all__ = ["ATTR", "ATTR_T", "ATTR_X16", "BF16_BOUND", "BF16_UNIT", "Bf16Weights", "bf16_params", "convert_weights", "weight_error"]
