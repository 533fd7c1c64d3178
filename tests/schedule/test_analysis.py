"""Op-pattern and schedule-kind classification of tensor programs."""

from __future__ import annotations

import pytest

from tests.schedule import kernels
from tilework.ir.loop import Buffer, For, Load, Store, TensorFunc
from tilework.ir.sym import SymVar
from tilework.op.base import OpPattern
from tilework.schedule.analysis import FuncKind, classify, identity, main_block, matmul_parts, op_pattern


@pytest.mark.parametrize(
    ("name", "pattern", "kind"),
    [
        ("add", OpPattern.ELEMWISE, FuncKind.ELEMWISE),
        ("add_relu", OpPattern.ELEMWISE, FuncKind.ELEMWISE),
        ("broadcast_add", OpPattern.BROADCAST, FuncKind.BROADCAST),
        ("transpose", OpPattern.INJECTIVE, FuncKind.INJECTIVE),
        ("gather", OpPattern.INJECTIVE, FuncKind.INJECTIVE),
        ("row_sum", OpPattern.REDUCTION, FuncKind.REDUCTION),
        ("softmax", OpPattern.REDUCTION, FuncKind.REDUCTION),
        ("layer_norm", OpPattern.REDUCTION, FuncKind.REDUCTION),
        ("matmul", OpPattern.OUT_EWISE_FUSABLE, FuncKind.MATMUL),
        ("gemv_dot", OpPattern.OUT_EWISE_FUSABLE, FuncKind.GEMV),
        ("gemv_axpy", OpPattern.OUT_EWISE_FUSABLE, FuncKind.GEMV),
        ("cumsum", OpPattern.OPAQUE, FuncKind.OPAQUE),
    ],
)
def test_kernel_classification(name: str, pattern: OpPattern, kind: FuncKind) -> None:
    f = kernels.KERNELS[name][0]()
    assert op_pattern(f) == pattern
    assert classify(f) == kind


def test_matmul_with_one_row_is_gemv_and_batched_matmul_is_matmul() -> None:
    assert classify(kernels.matmul(m=1)) == FuncKind.GEMV
    assert classify(kernels.matmul(m=SymVar("M", 1))) == FuncKind.MATMUL
    assert classify(kernels.matmul(batch=SymVar("B", 1))) == FuncKind.MATMUL
    assert classify(kernels.matmul_bias_relu()) == FuncKind.MATMUL


def test_matmul_parts() -> None:
    f = kernels.matmul(batch=3)
    mb = main_block(f)
    assert mb is not None
    parts = matmul_parts(mb)
    assert parts is not None
    assert [iv.var.name for iv in parts.batch] == ["vq"]
    assert [iv.var.name for iv in parts.i] == ["vi"] and [iv.var.name for iv in parts.j] == ["vj"]
    assert parts.k.var.name == "vr"
    assert parts.a.buffer.name == "a" and parts.b.buffer.name == "b"


def test_a_store_outside_blocks_is_opaque() -> None:
    n, i = SymVar("n", 1), SymVar("i")
    a, b = Buffer("a", (n,), "float32"), Buffer("b", (n,), "float32")
    f = TensorFunc((a, b), For(i, n, Store(b, (i,), Load(a, (i,)))))
    assert op_pattern(f) == OpPattern.OPAQUE
    assert classify(f) == FuncKind.OPAQUE


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("float32", [0.0, 1.0, float("-inf"), float("inf")]),
        ("int8", [0, 1, -128, 127]),
        ("uint8", [0, 1, 0, 255]),
        ("bool", [False, True, False, True]),
    ],
)
def test_reducer_identities(dtype: str, expected: list) -> None:
    assert [identity(op, dtype).value for op in ("+", "*", "max", "min")] == expected
