"""layout_weights: weights are laid out once, at compile time, the way their kernels read them.

A ``linear(x, w, b)`` (``x @ w.T + b`` with torch's ``[out, in]`` weight) whose weight is a
constant becomes ``linear_io(x, wp, b, out_features=out)`` with ``wp`` the weight packed in
column panels, ``[ceil(out / PANEL), in, PANEL]`` (``wp[p, k, c] = w[p * PANEL + c, k]``, zero
past ``out``): a register tile of the matmul kernels reads ``PANEL`` columns for every ``k``,
and in this layout its whole ``K x PANEL`` block is one contiguous stream (no cache-set
conflicts between its rows, prefetched in order, reused from L2 by the next row tile). No call
copies or transposes a weight (the ``[out, in]`` layout made the many-rows kernel copy the
weight transposed on every call, and the few-rows kernel run dot products).

A ``matmul(x, w)`` whose right operand is such a weight in ``[in, out]`` layout (what ONNX
exporters write for a linear layer: ``MatMul`` by an initializer) is the same product; it is
first rewritten to ``linear(x, w.T)`` (the constant transposed once; a weight param retyped to
``[out, in]`` and listed in ``main``'s attr ``transposed_weights``) and then laid out the same way;
a ``matmul(x, permute_dims(w, (1, 0)))`` (ONNX's Gemm with ``transB``) is ``linear(x, w)``.
The ``Add`` of the bias that follows such a product becomes the linear's bias where nothing
else reads the product: ``add(linear(x, w), b)`` (either order) -> ``linear(x, w, b)`` with ``b``
a vector of the out features, so an ONNX file's linear layers get the kernels a torch.export of
the same model gets.

With ``params=True`` the same holds for trailing weight params of ``main`` (after
``num_inputs``) that are read only as linear weights: such a param becomes packed and
its index among the params is recorded in ``main``'s attr ``packed_weights``; whoever
passes the weights (``tilework.compile``) packs them once (``pack_weights``). The weight params
of other functions are laid out too: those a region built on its own lists in its attr
``weight_params`` (``tilework.collage`` measures a codegen region as the model runs it), and,
when ``main`` dispatches to a copy of itself per shape bucket (its attr ``placement_variants``,
``tilework.collage``: each copy offloads other linears), those of every copy. A weight that the
copies want in different layouts stays as it is in ``main``'s params, and each other layout
wanted is a copy of it appended to the params (``main``'s attr ``weight_copies``: ``(index,
transposed, packed)`` each), which ``pack_weights`` appends to the weights.

A placement runs this pass after offload (``tilework.build``'s ``layout_weights``): a region
offloaded to another backend reads its weights as given (``[out, in]``), and only the linears
left to tilework's kernels are laid out.

2-D convolutions are made linears first (``tilework.transform.conv_gemm``: im2col over
channel-last data; their weight params listed in ``conv_weights``, depthwise ones in
``depthwise_weights``, those of few input channels, run directly, in ``direct_conv_weights``),
so their weights are packed alike; a 3x3 conv that runs as Winograd
F(2, 3) gets its transformed weights packed by ``conv_gemm`` itself (``winograd_weights``).

Only float32 and float64 linears are rewritten (the narrow types keep their own kernels).
Requires a well-formed module;
guarantees a well-formed module computing the same values (given the packed weights).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tilework.ir.graph import Call, Constant, Expr, GlobalVar, GraphFunc, OpRef, Var, bindings_of, used_vars
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.op.linalg import linear, linear_io
from tilework.pattern.core import Match, op_call
from tilework.transform.base import Pass
from tilework.transform.conv_gemm import ATTR as CONV_WEIGHTS
from tilework.transform.conv_gemm import DEPTHWISE, DIRECT, WINOGRAD, ConvGemm, conv_weight_matrix, depthwise_weight_matrix, direct_weight_matrix, winograd_weight
from tilework.transform.dead_code_elimination import DeadCodeElimination
from tilework.transform.layout_rules import call_of, same_shape, shape_of
from tilework.transform.panels import PANEL, lay_out, packed_shape
from tilework.transform.rewrite_driver import Rule, apply_rules
from tilework.ir.visitor import ExprMutator
from tilework.transform.weight_params import WEIGHTS, retype_weight_params, weight_candidates, weight_params

ATTR = "packed_weights"
TRANSPOSED = "transposed_weights"  # params given as [in, out] (a matmul's weight), taken as [out, in]
VARIANTS = "placement_variants"  # main's attr when it dispatches to copies of itself
COPIES = "weight_copies"  # ((index, transposed, packed), ...): trailing params, copies of a weight laid out
_DTYPES = ("float32", "float64")


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


def _is_weight_matmul(e: Expr) -> bool:
    """``x @ w`` with ``x`` of rank >= 2 and ``w`` a 2-D weight of static out size, one float
    dtype throughout: the product ``linear(x, w.T)`` computes."""
    if not (isinstance(e, Call) and isinstance(e.callee, OpRef) and e.callee.name == "matmul" and len(e.args) == 2):
        return False
    w, x, out = _weight_info(e.args[1]), e.args[0].info, e.info
    return (
        w is not None and w.shape is not None and isinstance(w.shape[1], int)
        and isinstance(x, TensorInfo) and x.dtype == w.dtype and x.shape is not None and len(x.shape) >= 2
        and isinstance(out, TensorInfo) and out.dtype == w.dtype
    )  # fmt: skip


def _matmul_of_transpose(value: Expr, m: Match) -> Expr | None:
    """``matmul(x, permute_dims(w, (1, 0)))`` with ``w`` a 2-D ``[out, in]`` weight (ONNX's
    Gemm with ``transB``) -> ``linear(x, w)``: then laid out like any linear weight, instead of
    transposed on every call."""
    assert isinstance(value, Call)
    if len(value.args) != 2:
        return None
    t = m.ctx.resolve(value.args[1]) if isinstance(value.args[1], Var) else value.args[1]
    if not (isinstance(t, Call) and isinstance(t.callee, OpRef) and t.callee.name == "permute_dims"):
        return None
    if tuple(int(a) for a in t.attrs.get("axes") or ()) != (1, 0):
        return None
    w, x, out = _weight_info(t.args[0]), value.args[0].info, value.info
    ok = (
        w is not None and w.shape is not None and isinstance(w.shape[0], int)
        and isinstance(x, TensorInfo) and x.dtype == w.dtype and x.shape is not None and len(x.shape) >= 2
        and isinstance(out, TensorInfo) and out.dtype == w.dtype
    )  # fmt: skip
    return linear(value.args[0], t.args[0]) if ok else None


def _bias_adds(mod: IRModule) -> dict[Var, int]:
    """The vars of the bindings ``add(y, b)`` (or ``add(b, y)``) whose ``y`` is a linear without
    a bias that nothing else reads, each with the position of that ``y``."""
    found: dict[Var, int] = {}
    for _, f in mod.graph_funcs():
        bindings = list(bindings_of(f))
        reads = Counter(v for b in bindings for v in used_vars(b.value))
        reads.update(used_vars(f.body.body))
        linears = {b.var for b in bindings if isinstance(b.value, Call) and _is_linear(b.value) and len(b.value.args) == 2}
        for b in bindings:
            v = b.value
            if isinstance(v, Call) and isinstance(v.callee, OpRef) and v.callee.name == "add" and len(v.args) == 2:
                at = [i for i, a in enumerate(v.args) if isinstance(a, Var) and a in linears and reads[a] == 1]
                if at:
                    found[b.var] = at[0]
    return found


def _with_bias(adds: dict[Var, int]) -> Callable[[Expr, Match], Expr | None]:
    """The rule ``add(linear(x, w), b)`` (either order) -> ``linear(x, w, b)`` for the adds in
    ``adds`` (``_bias_adds``: the linear's place in each) where ``b`` is a vector of the
    linear's out features and dtype: ONNX writes a linear layer as ``MatMul`` then ``Add`` of
    its bias, torch.export as one ``linear``; both now reach the same kernel."""

    def rewrite(value: Expr, m: Match) -> Expr | None:
        at = adds.get(m.ctx.var) if m.ctx.var is not None else None
        if at is None:
            return None
        assert isinstance(value, Call)
        lin, b = call_of(value.args[at], m, "linear"), value.args[1 - at]
        if lin is None or len(lin.args) != 2 or not isinstance(lin.info, TensorInfo) or lin.info.shape is None:
            return None
        bias, out = b.info, lin.info.shape
        if (
            isinstance(bias, TensorInfo) and bias.dtype == lin.info.dtype and bias.shape is not None and len(bias.shape) == 1
            and len(out) >= 1 and same_shape(bias.shape, out[-1:]) and same_shape(shape_of(value), out)
        ):  # fmt: skip
            return linear(lin.args[0], lin.args[1], b)
        return None

    return rewrite


def _matmul_params(f: GraphFunc) -> list[int]:
    """Indices of the trailing weight params of ``f`` read only as the weight of such matmuls."""
    return weight_params(f, lambda p: _weight_info(p) is not None, _is_weight_matmul)


def _transposed_info(info: TensorInfo) -> TensorInfo:
    assert info.shape is not None and len(info.shape) == 2
    return TensorInfo((info.shape[1], info.shape[0]), info.dtype)


class _AsLinear:
    """The rewrite of weight matmuls into linears: each constant is transposed once."""

    def __init__(self, params: dict[Var, Var]) -> None:
        self.params = params  # old [in, out] weight param -> the [out, in] one
        self.constants: dict[int, Constant] = {}

    def rewrite(self, value: Expr, m: Match) -> Expr | None:
        if not _is_weight_matmul(value):
            return None
        assert isinstance(value, Call)
        x, w = value.args
        if isinstance(w, Var) and w in self.params:
            return linear(x, self.params[w])
        c = m.ctx.resolve(w) if isinstance(w, Var) else w
        if not isinstance(c, Constant) or _weight_info(c) is None:
            return None
        done = self.constants.get(id(c))
        if done is None:
            done = Constant.of(np.ascontiguousarray(c.data.T), name=f"{c.name}.T" if c.name else "")
            self.constants[id(c)] = done
        return linear(x, done)


def _weight_params(f: GraphFunc) -> list[int]:
    """Indices of the trailing weight params of ``f`` read only as the weight of rewritable
    linears."""
    return weight_params(f, lambda p: _weight_info(p) is not None, lambda c: _is_linear(c) and _rewritable(c))


class _Layout:
    """The rewrite of one module: each constant is packed once."""

    def __init__(self, params: dict[Var, Var]) -> None:
        self.params = params  # old weight param -> the packed param
        self.constants: dict[int, Constant] = {}

    def packed(self, w: Expr, m: Match) -> Expr | None:
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
        wt = self.packed(value.args[1], m)
        if wt is None:
            return None
        w = value.args[1].info
        assert isinstance(w, TensorInfo) and w.shape is not None and isinstance(w.shape[0], int)
        return linear_io(value.args[0], wt, value.args[2] if len(value.args) == 3 else None, w.shape[0])


def packed_params(f: GraphFunc) -> tuple[int, ...]:
    """The param indices ``layout_weights`` packed in ``f`` (its ``packed_weights``)."""
    return tuple(int(i) for i in f.attrs.get(ATTR, ()))


def weight_layout(f: GraphFunc) -> dict[str, Any]:
    """How ``f`` (a model's ``main``) takes its weights, as JSON data (``tilework.build`` keeps it
    in the executable's meta as ``weight_layout``): the param indices ``conv`` (conv weights
    taken as ``conv_gemm.conv_weight_matrix``), ``depthwise`` (as ``depthwise_weight_matrix``),
    ``direct`` (as ``direct_weight_matrix``),
    ``winograd`` (as ``winograd_weight``), ``transposed`` and ``packed``, the ``copies``
    appended, the ``panel`` width of the packed ones, and ``num_inputs``; empty when it takes
    them as given."""
    out: dict[str, Any] = {}
    if f.attrs.get(CONV_WEIGHTS):
        out["conv"] = [int(i) for i in f.attrs[CONV_WEIGHTS]]
    if f.attrs.get(DEPTHWISE):
        out["depthwise"] = [int(i) for i in f.attrs[DEPTHWISE]]
    if f.attrs.get(DIRECT):
        out["direct"] = [int(i) for i in f.attrs[DIRECT]]
    if f.attrs.get(WINOGRAD):
        out["winograd"] = [int(i) for i in f.attrs[WINOGRAD]]
    if f.attrs.get(TRANSPOSED):
        out["transposed"] = [int(i) for i in f.attrs[TRANSPOSED]]
    if f.attrs.get(ATTR):
        out["packed"] = [int(i) for i in f.attrs[ATTR]]
    if f.attrs.get(ATTR) or f.attrs.get(COPIES) or f.attrs.get(WINOGRAD):
        out["panel"] = PANEL  # the width the kernels were scheduled for (a saved layout keeps it)
    if f.attrs.get(COPIES):
        out["copies"] = [[int(i), bool(t), bool(p)] for i, t, p in f.attrs[COPIES]]
    if out:
        out["num_inputs"] = int(f.attrs.get("num_inputs", len(f.params)))
    return out


def lay_out_weights(layout: Mapping[str, Any], weights: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``weights`` (the trailing params, in order) as a function of ``weight_layout`` ``layout``
    takes them: transposed, packed through ``lay_out``, and the copies appended."""
    first = int(layout.get("num_inputs", 0))
    panel = int(layout.get("panel", PANEL))
    out = list(weights)
    for i in layout.get("conv", ()):
        out[i - first] = conv_weight_matrix(out[i - first])
    for i in layout.get("depthwise", ()):
        out[i - first] = depthwise_weight_matrix(out[i - first])
    for i in layout.get("direct", ()):
        out[i - first] = direct_weight_matrix(out[i - first])
    for i in layout.get("winograd", ()):
        out[i - first] = winograd_weight(out[i - first], panel)
    for i in layout.get("transposed", ()):
        out[i - first] = np.ascontiguousarray(np.asarray(out[i - first]).T)
    for i in layout.get("packed", ()):
        out[i - first] = lay_out(np.asarray(out[i - first]), panel)
    for i, transposed, packed in layout.get("copies", ()):
        w = np.asarray(weights[i - first])
        w = np.ascontiguousarray(w.T) if transposed else w
        out.append(lay_out(w, panel) if packed else w)
    return out


def pack_weights(mod: IRModule, weights: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``weights`` (the trailing params of ``mod``'s ``main``, in order) laid out as the
    module's ``main`` takes them (``lay_out_weights`` of its ``weight_layout``)."""
    main = mod.get("main")
    if not isinstance(main, GraphFunc):
        return list(weights)
    return lay_out_weights(weight_layout(main), weights)


def _param_funcs(mod: IRModule) -> list[str]:
    """The functions whose weight params are laid out: ``main`` or the copies it dispatches
    to, and the functions that list their weight params."""
    main = mod.get("main")
    names: list[str] = []
    if isinstance(main, GraphFunc):
        names = [str(n) for n in main.attrs.get(VARIANTS, ())] or ["main"]
    return names + [n for n, f in mod.graph_funcs() if WEIGHTS in f.attrs and n not in names]


class _VariantArgs(ExprMutator):
    """The calls of ``main``'s copies with each copy's own weight args."""

    def __init__(self, args: Mapping[str, Sequence[Var]]) -> None:
        super().__init__()
        self.args = args

    def mutate_call(self, e: Call) -> Expr:
        if isinstance(e.callee, GlobalVar) and e.callee.name in self.args:
            return Call(e.callee, tuple(self.args[e.callee.name]), e.attrs, e.sinfo_args, e.info)
        return super().mutate_call(e)


def _reconcile(mod: IRModule) -> IRModule:
    """A dispatching ``main`` whose params pass each copy its weights as the copy takes them
    (see the module docstring)."""
    main = mod.get("main")
    if not isinstance(main, GraphFunc) or not main.attrs.get(VARIANTS):
        return mod
    names = [str(n) for n in main.attrs[VARIANTS]]
    variants = [mod[n] for n in names]
    assert all(isinstance(v, GraphFunc) and len(v.params) == len(main.params) for v in variants)
    params = list(main.params)
    args = {n: list(main.params) for n in names}
    transposed: list[int] = []
    packed: list[int] = []
    copies: list[tuple[int, bool, bool]] = []
    for i in weight_candidates(main):
        by_form: dict[tuple[bool, bool], list[GraphFunc]] = {}
        for v in variants:
            assert isinstance(v, GraphFunc)
            by_form.setdefault((i in v.attrs.get(TRANSPOSED, ()), i in packed_params(v)), []).append(v)
        if list(by_form) == [(False, False)]:
            continue
        for (t, p), users in by_form.items():
            if (t, p) == (False, False):
                continue
            new = Var(params[i].name if len(by_form) == 1 else f"{params[i].name}.{'packed' if p else 'T'}", users[0].params[i].info)
            if len(by_form) == 1:
                params[i] = new
                transposed += [i] if t else []
                packed += [i] if p else []
            else:
                params.append(new)
                copies.append((i, t, p))
            for v in users:
                args[names[variants.index(v)]][i] = new
    if params == list(main.params) and not copies:
        return mod
    body = _VariantArgs(args).mutate_seq_expr(main.body)
    retyped = {p for p, q in zip(main.params, params) if p is not q}
    reads = [body.body, *(b.value for b in bindings_of(body))]
    assert not any(v in retyped for e in reads for v in used_vars(e)), "main reads a laid-out weight outside its copies' calls"
    attrs = {k: tuple(v) for k, v in ((TRANSPOSED, transposed), (ATTR, packed), (COPIES, copies)) if v}
    return mod.with_func("main", main.replace(params=tuple(params), body=body, attrs=main.attrs.with_(**attrs)))


def _packed_info(info: TensorInfo) -> TensorInfo:
    assert info.shape is not None and isinstance(info.shape[0], int)
    return TensorInfo(packed_shape(info.shape[0], info.shape[1]), info.dtype)


@dataclass(frozen=True)
class LayoutWeights(Pass):
    """See the module docstring. ``params``: lay out ``main``'s trailing weight params too."""

    params: bool = False
    name: str = "layout_weights"

    def run(self, mod: IRModule) -> IRModule:
        mod = ConvGemm(params=self.params)(mod)  # conv weights become linear weights first
        found: list[Expr] = []

        def as_linear(value: Expr, m: Match) -> Expr | None:
            y = _matmul_of_transpose(value, m)
            found.extend([] if y is None else [y])
            return y

        linears = apply_rules(mod, [Rule("matmul_of_transposed_weight", op_call("matmul"), as_linear)])
        mod = DeadCodeElimination()(linears) if found else mod  # the transposes left unused
        funcs = _param_funcs(mod) if self.params else []
        main = mod.get("main")
        dispatcher = self.params and isinstance(main, GraphFunc) and bool(main.attrs.get(VARIANTS))
        rest = [n for n, _ in mod.graph_funcs() if not (dispatcher and n == "main")]  # main is rebuilt last (_reconcile)
        transposed: dict[Var, Var] = {}
        for name in funcs:
            mod, more = retype_weight_params(mod, TRANSPOSED, _matmul_params, _transposed_info, name)
            transposed.update(more)
        mod = apply_rules(mod, [Rule("matmul_weight_as_linear", op_call("matmul"), _AsLinear(transposed).rewrite)], funcs=rest)
        adds = _bias_adds(mod)
        if adds:
            mod = apply_rules(mod, [Rule("bias_add_into_linear", op_call("add"), _with_bias(adds))], funcs=rest)
            mod = DeadCodeElimination()(mod)  # the linears without their bias
        mapping: dict[Var, Var] = {}
        for name in funcs:
            mod, more = retype_weight_params(mod, ATTR, _weight_params, _packed_info, name)
            mapping.update(more)
        layout = _Layout(mapping)
        mod = apply_rules(mod, [Rule("linear_weight_layout", op_call("linear"), layout.rewrite)], funcs=rest)
        return _reconcile(mod) if dispatcher else mod


__all__ = ["ATTR", "COPIES", "PANEL", "TRANSPOSED", "VARIANTS", "LayoutWeights", "lay_out", "lay_out_weights", "pack_weights", "packed_params", "weight_layout"]
