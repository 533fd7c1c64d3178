"""Shared test helpers: run an op constructor through the BlockBuilder and collect its checks."""

from __future__ import annotations

from typing import Callable, Mapping

from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Call, Var
from tilework.ir.info import StructInfo, TensorInfo
from tilework.ir.sym import Dim, SymVar
from tilework.op import DimCheck, infer_with_checks


def T(*shape: Dim, dtype: str | None = "float32") -> TensorInfo:
    """A tensor info with a known shape."""
    return TensorInfo(tuple(shape), dtype)


def R(ndim: int = -1, dtype: str | None = "float32") -> TensorInfo:
    """A tensor info that knows only its rank (-1: unknown rank)."""
    return TensorInfo(None, dtype, ndim)


def infer(make: Callable[..., Call], *infos: StructInfo) -> tuple[StructInfo, list[DimCheck]]:
    """Emit ``make(*params)`` inside a function whose params carry ``infos``; return the bound
    var's struct info and the dim checks the op's rule recorded (they must agree)."""
    params = [Var(f"p{i}", info) for i, info in enumerate(infos)]
    bb = BlockBuilder()
    with bb.function("f", params):
        call = make(*params)
        normalized = bb.normalize(call)
        assert isinstance(normalized, Call)
        info, checks = infer_with_checks(normalized)
        v = bb.emit(call)
        assert v.info == info
        bb.emit_func_output(v)
    return info, checks


def info_of(make: Callable[..., Call], *infos: StructInfo) -> StructInfo:
    """The struct info, asserting that no run-time check was needed."""
    info, checks = infer(make, *infos)
    assert checks == [], checks
    return info


def holds(checks: list[DimCheck], env: Mapping[SymVar, int]) -> bool:
    return all(c.holds(env) for c in checks)
