"""annotate_op_pattern: every TensorFunc is labelled from its loops, blocks, loads and stores,
hand-written kernels and legalized ops alike."""

from __future__ import annotations

import textwrap

import pytest

from tests.transform.util import check_pass, ir
from tilework import op
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Expr, Var
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar
from tilework.ir.verify import verify
from tilework.op.base import OpPattern
from tilework.transform.annotate_op_pattern import AnnotateOpPattern, func_pattern, parse_pattern, pattern_name
from tilework.transform.legalize import Legalize

P = AnnotateOpPattern()

# Hand-written kernels, one per label; {attrs} is where the pass puts the label.
KERNELS = """
@tensor{add}
def add(a: Buffer((n, m), "float32"), b: Buffer((n, m), "float32"), c: Buffer((n, m), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for j in range(m):
            with block("add"):
                vi = spatial(n, i)
                vj = spatial(m, j)
                reads(a, b)
                writes(c)
                c[vi, vj] = a[vi, vj] + b[vi, vj]

@tensor{bias}
def bias(a: Buffer((n, m), "float32"), b: Buffer((m,), "float32"), c: Buffer((n, m), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for j in range(m):
            with block("bias"):
                vi = spatial(n, i)
                vj = spatial(m, j)
                reads(a, b)
                writes(c)
                c[vi, vj] = a[vi, vj] + b[vj]

@tensor{transpose}
def transpose(a: Buffer((m, n), "float32"), c: Buffer((n, m), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for j in range(m):
            with block("transpose"):
                vi = spatial(n, i)
                vj = spatial(m, j)
                reads(a)
                writes(c)
                c[vi, vj] = a[vj, vi]

@tensor{rowsum}
def rowsum(a: Buffer((n, m), "float32"), c: Buffer((n,), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for k in range(m):
            with block("rowsum"):
                vi = spatial(n, i)
                vk = reduce(m, k)
                reads(c, a)
                writes(c)
                with init():
                    c[vi] = float32(0.0)
                c[vi] = c[vi] + a[vi, vk]

@tensor{masked_max}
def masked_max(a: Buffer((n, n), "float32"), c: Buffer((n,), "float32")):
    n = sym()
    for i in range(n):
        for k in range(n):
            with block("masked_max"):
                vi = spatial(n, i)
                vk = reduce(n, k)
                reads(c, a)
                writes(c)
                with init():
                    c[vi] = float32(-inf)
                if vk <= vi:
                    c[vi] = max(c[vi], a[vi, vk])

@tensor{matmul_bias}
def matmul_bias(a: Buffer((n, k), "float32"), w: Buffer((k, m), "float32"), b: Buffer((m,), "float32"), c: Buffer((n, m), "float32")):
    n = sym()
    k = sym()
    m = sym()
    with allocate((n, m), "float32") as acc:
        for i in range(n):
            for j in range(m):
                for r in range(k):
                    with block("acc"):
                        vi = spatial(n, i)
                        vj = spatial(m, j)
                        vr = reduce(k, r)
                        reads(acc, a, w)
                        writes(acc)
                        with init():
                            acc[vi, vj] = float32(0.0)
                        acc[vi, vj] = acc[vi, vj] + a[vi, vr] * w[vr, vj]
        for i2 in range(n):
            for j2 in range(m):
                with block("out"):
                    vi2 = spatial(n, i2)
                    vj2 = spatial(m, j2)
                    reads(acc, b)
                    writes(c)
                    c[vi2, vj2] = acc[vi2, vj2] + b[vj2]

@tensor{two_matmuls}
def two_matmuls(a: Buffer((n, n), "float32"), c: Buffer((n, n), "float32")):
    n = sym()
    with allocate((n, n), "float32") as t:
        for i in range(n):
            for j in range(n):
                for r in range(n):
                    with block("t"):
                        vi = spatial(n, i)
                        vj = spatial(n, j)
                        vr = reduce(n, r)
                        reads(t, a)
                        writes(t)
                        with init():
                            t[vi, vj] = float32(0.0)
                        t[vi, vj] = t[vi, vj] + a[vi, vr] * a[vr, vj]
        for i2 in range(n):
            for j2 in range(n):
                for r2 in range(n):
                    with block("c"):
                        vi2 = spatial(n, i2)
                        vj2 = spatial(n, j2)
                        vr2 = reduce(n, r2)
                        reads(c, t, a)
                        writes(c)
                        with init():
                            c[vi2, vj2] = float32(0.0)
                        c[vi2, vj2] = c[vi2, vj2] + t[vi2, vr2] * a[vr2, vj2]

@tensor{loose_store}
def loose_store(a: Buffer((n,), "float32"), c: Buffer((n,), "float32")):
    n = sym()
    for i in range(n):
        c[i] = a[i]
"""

LABELS = {
    "add": "elementwise",
    "bias": "broadcast",
    "transpose": "injective",
    "rowsum": "reduction",
    "masked_max": "reduction",
    "matmul_bias": "out_ewise_fusable",
    "two_matmuls": "reduction",
    "loose_store": "opaque",
}


def kernels(labels: dict[str, str] | None) -> str:
    attrs = {k: "" if labels is None else f'(attrs={{"op_pattern": "{v}"}})' for k, v in LABELS.items()}
    if labels is not None:
        attrs.update({k: f'(attrs={{"op_pattern": "{v}"}})' for k, v in labels.items()})
    return textwrap.dedent(KERNELS).format(**attrs)


def test_hand_written_kernels_are_labelled() -> None:
    check_pass(P, kernels(None), kernels(LABELS))


def test_a_valid_label_is_kept_and_a_number_becomes_its_name() -> None:
    before = kernels(None).replace("@tensor\ndef add(", '@tensor(attrs={"op_pattern": "opaque"})\ndef add(')
    before = before.replace("@tensor\ndef bias(", '@tensor(attrs={"op_pattern": 2})\ndef bias(')
    check_pass(P, before, kernels({**LABELS, "add": "opaque", "bias": "injective"}))


def test_pattern_names_round_trip() -> None:
    for p in (OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE, OpPattern.REDUCTION, OpPattern.OUT_EWISE_FUSABLE, OpPattern.OPAQUE):
        assert parse_pattern(pattern_name(p)) is p
    assert parse_pattern("fancy") is None and parse_pattern(None) is None and parse_pattern(99) is None


def _legalized(build: object) -> IRModule:
    n, m = SymVar("n", 1), SymVar("m", 1)
    x = Var("x", TensorInfo((n, m, 16), "float32"))
    w = Var("w", TensorInfo((8, 16), "float32"))
    b = Var("b", TensorInfo((16,), "float32"))
    idx = Var("idx", TensorInfo((m,), "int64"))
    bb = BlockBuilder()
    with bb.function("main", [x, w, b, idx]):
        with bb.dataflow():
            outs: list[Expr] = build(x, w, b, idx)  # type: ignore[operator]
            gvs = [bb.emit_output(o) for o in outs]
        bb.emit_func_output(gvs)
    return Legalize()(bb.get())


def test_legalized_ops_get_the_labels_fusion_expects() -> None:
    ops = {
        "add": lambda x, w, b, i: op.add(x, x),
        "bias": lambda x, w, b, i: op.add(x, b),
        "gelu": lambda x, w, b, i: op.gelu(x),
        "permute_dims": lambda x, w, b, i: op.permute_dims(x, (0, 2, 1)),
        "reshape": lambda x, w, b, i: op.reshape(x, (x.info.shape[0], x.info.shape[1] * 16)),  # type: ignore[attr-defined]
        "take": lambda x, w, b, i: op.take(x, i, axis=1),
        "sum": lambda x, w, b, i: op.sum(x, axis=(2,)),
        "softmax": lambda x, w, b, i: op.softmax(x),
        "layer_norm": lambda x, w, b, i: op.layer_norm(x, b, b),
        "linear": lambda x, w, b, i: op.linear(x, w),
        "attention": lambda x, w, b, i: op.attention(
            op.reshape(x, (x.info.shape[0], x.info.shape[1], 2, 8)),  # type: ignore[attr-defined]
            op.reshape(x, (x.info.shape[0], x.info.shape[1], 2, 8)),  # type: ignore[attr-defined]
            op.reshape(x, (x.info.shape[0], x.info.shape[1], 2, 8)),  # type: ignore[attr-defined]
            causal=True,
        ),
    }
    want = {
        "add": OpPattern.ELEMWISE,
        "bias": OpPattern.BROADCAST,
        "gelu": OpPattern.ELEMWISE,
        "permute_dims": OpPattern.INJECTIVE,
        "reshape": OpPattern.INJECTIVE,
        "take": OpPattern.INJECTIVE,
        "sum": OpPattern.REDUCTION,
        "softmax": OpPattern.REDUCTION,
        "layer_norm": OpPattern.REDUCTION,
        "linear": OpPattern.OUT_EWISE_FUSABLE,
        "attention": OpPattern.REDUCTION,
    }
    for name, build in ops.items():
        mod = AnnotateOpPattern()(_legalized(lambda x, w, b, i: [build(x, w, b, i)]))
        verify(mod)
        called = [f for f in mod.tensor_funcs() if not f[0].startswith("reshape") or name == "reshape"]
        kernel = called[-1][1]
        assert kernel.attrs["op_pattern"] == pattern_name(want[name]), name
        if name != "attention":  # a hand-built kernel carries its label; its blocks are opaque
            assert func_pattern(kernel) == want[name], name


@pytest.mark.parametrize("name", ["add", "rowsum", "matmul_bias"])
def test_func_pattern_agrees_with_the_pass(name: str) -> None:
    mod = ir(kernels(None))
    f = mod[name]
    assert pattern_name(func_pattern(f)) == LABELS[name]  # type: ignore[arg-type]
