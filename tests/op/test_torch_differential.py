"""Differential tests against torch: each op on symbolic shapes goes through the whole pipeline
(legalize, fusion, default schedules, memory planning, C kernels, the VM) in one executable
compiled once, then runs at dims that include 0 and 1 and at random ones, against the same
computation in torch eager.

``n``, ``m`` and ``k`` may be 0; ``k`` is an axis an op reduces or normalizes over. Where
torch refuses an empty one (``max``, ``argmax``), tilework must raise a ``RuntimeCheckError``
(docs/semantics.md, "Empty reductions").

The whole pipeline compiles some forty kernels (a minute on a busy 2-core machine), so this
file runs with ``TILEWORK_LONG_TESTS=1`` only.
The NumPy-reference tests beside this file check each legalization's kernel alone; this file
checks what a user gets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tilework.errors import RuntimeCheckError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Expr, Var
from tilework.ir.info import TensorInfo
from tests.long import long_only

torch = pytest.importorskip("torch", reason="the differential tests compare with torch (an optional extra)")

pytestmark = long_only("compiles the whole op table")
n, m, k = tw.dim("n", min=0), tw.dim("m", min=0), tw.dim("k", min=0)
EDGE_DIMS = [{"n": a, "m": b, "k": c} for a in (0, 1) for b in (0, 1) for c in (0, 1)]


def T(*shape: Any, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(tuple(shape), dtype)


@dataclass
class Diff:
    """``make(*params)`` in tilework against ``ref(*tensors)`` in torch on inputs of ``infos``."""

    name: str
    make: Callable[..., Expr]
    ref: Callable[..., Any]
    infos: tuple[TensorInfo, ...]
    positive: bool = False  # inputs in (0.5, 2.5) (log, sqrt, power)
    tol: float = 2e-5


F = torch.nn.functional
CASES = [
    *(Diff(name, getattr(op, name), getattr(torch, name), (T(n, m),)) for name in ("exp", "tanh", "sigmoid", "relu", "sin", "cos", "floor", "ceil", "abs", "neg", "erf")),
    *(Diff(name, getattr(op, name), getattr(torch, name), (T(n, m),), positive=True) for name in ("log", "sqrt", "rsqrt")),
    Diff("gelu", op.gelu, F.gelu, (T(n, m),)),
    Diff("silu", op.silu, F.silu, (T(n, m),)),
    *(Diff(name, getattr(op, name), getattr(torch, name), (T(n, m), T(m))) for name in ("add", "subtract", "multiply", "maximum", "minimum")),
    Diff("divide", op.divide, torch.divide, (T(n, 1), T(m)), positive=True),
    Diff("power", op.power, torch.pow, (T(n, m), T(1, m)), positive=True),
    Diff("less", op.less, torch.lt, (T(n, m), T(n, 1))),
    Diff("equal_int", op.equal, torch.eq, (T(n, m, dtype="int64"), T(m, dtype="int64"))),
    Diff("where", lambda c, a, b: op.where(op.greater(c, a), a, b), lambda c, a, b: torch.where(c > a, a, b), (T(n, m), T(n, m), T(m))),
    Diff("astype_int", lambda x: op.astype(op.multiply(x, x), "int32"), lambda x: (x * x).to(torch.int32), (T(n, m),)),
    Diff("sum", lambda x: op.sum(x, axis=1), lambda x: x.sum(1), (T(n, k),)),
    Diff("mean_keepdims", lambda x: op.mean(x, axis=2, keepdims=True), lambda x: x.mean(2, keepdim=True), (T(n, m, k),)),
    Diff("max", lambda x: op.max(x, axis=-1), lambda x: x.amax(-1), (T(n, k),)),
    Diff("min", lambda x: op.min(x, axis=0), lambda x: x.amin(0), (T(k, m),)),
    Diff("prod", lambda x: op.prod(x, axis=0), lambda x: x.prod(0), (T(k, m),), positive=True, tol=1e-4),
    Diff("argmax", lambda x: op.argmax(x, axis=1), lambda x: x.argmax(1), (T(n, k),)),
    Diff("softmax", lambda x: op.softmax(x, axis=-1), lambda x: torch.softmax(x, -1), (T(n, m, k),)),
    Diff("log_softmax", lambda x: op.log_softmax(x, axis=1), lambda x: torch.log_softmax(x, 1), (T(n, k),)),
    Diff("cumsum", lambda x: op.cumsum(x, axis=1), lambda x: torch.cumsum(x, 1), (T(n, m),), tol=1e-4),
    Diff("matmul", op.matmul, torch.matmul, (T(n, k, m), T(m, k)), tol=1e-4),
    Diff("matmul_batched", op.matmul, torch.matmul, (T(2, n, m), T(1, m, k)), tol=1e-4),
    Diff("linear", op.linear, F.linear, (T(n, m), T(k, m), T(k)), tol=1e-4),
    Diff("permute_dims", lambda x: op.permute_dims(x, (2, 0, 1)), lambda x: x.permute(2, 0, 1), (T(n, m, k),)),
    Diff("reshape", lambda x: op.reshape(x, (m, n * k)), lambda x: x.reshape(x.shape[1], x.shape[0] * x.shape[2]), (T(n, m, k),)),
    Diff("concat", lambda a, b: op.concat([a, b, a], axis=1), lambda a, b: torch.cat([a, b, a], 1), (T(n, m), T(n, k))),
    Diff("expand_dims", lambda x: op.expand_dims(x, 1), lambda x: x.unsqueeze(1), (T(n, m),)),
    Diff("broadcast_to", lambda x, y: op.broadcast_to(x, (n, m)), lambda x, y: x.expand(-1, y.shape[0]), (T(n, 1), T(m))),
    Diff("flatten", lambda x: op.flatten(x, 1), lambda x: x.flatten(1), (T(n, m, k),)),
    Diff("strided_slice", lambda x: op.strided_slice(x, [1], [1], [None], [2]), lambda x: x[:, 1::2], (T(n, m),)),
    Diff("tril", lambda x: op.tril(x, 1), lambda x: torch.tril(x, 1), (T(n, m),)),
    Diff("layer_norm", lambda x, g, b: op.layer_norm(x, g, b), lambda x, g, b: F.layer_norm(x, (x.shape[-1],), g, b), (T(n, m, k), T(k), T(k)), tol=1e-4),
    Diff("rms_norm", lambda x, w: op.rms_norm(x, w, eps=1e-6), lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6), (T(n, k), T(k)), tol=1e-4),
]
@pytest.fixture(scope="module")
def vm() -> Any:
    bb = BlockBuilder()
    for case in CASES:
        params = [Var(f"p{i}", info) for i, info in enumerate(case.infos)]
        with bb.function(case.name, params):
            with bb.dataflow():
                out = bb.emit_output(case.make(*params))
            bb.emit_func_output(out)
    return tw.VM(tw.build(bb.get(), target="cpu"))


def _inputs(case: Diff, dims: dict[str, int], rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for info in case.infos:
        assert info.shape is not None and info.dtype is not None
        shape = tuple(int(d) if isinstance(d, int) else dims[str(d)] for d in info.shape)
        if info.dtype == "int64":
            out.append(rng.integers(-3, 4, shape).astype(np.int64))
        elif case.positive:
            out.append(rng.uniform(0.5, 2.5, shape).astype(np.float32))
        else:
            out.append((rng.standard_normal(shape) * 2).astype(np.float32))
    return out


def _random_dims(rng: np.random.Generator, count: int) -> list[dict[str, int]]:
    sizes = [0, 1, 2, 3, 5, 8, 13, 31, 64]
    return [{"n": int(rng.choice(sizes)), "m": int(rng.choice(sizes)), "k": int(rng.choice(sizes))} for _ in range(count)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_torch(vm: Any, case: Diff) -> None:
    rng = np.random.default_rng(sum(map(ord, case.name)))
    for dims in EDGE_DIMS + _random_dims(rng, 40):
        inputs = _inputs(case, dims, rng)
        where = f"{case.name} at {dims}"
        try:
            want = case.ref(*[torch.from_numpy(x) for x in inputs]).numpy()
        except (IndexError, RuntimeError):  # torch refuses (an empty reduced axis)
            with pytest.raises(RuntimeCheckError):
                vm[case.name](*inputs)
            continue
        got = np.asarray(vm[case.name](*inputs))
        assert got.shape == want.shape, f"{where}: shape {got.shape}, torch {want.shape}"
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=case.tol, atol=case.tol, err_msg=where)
        else:
            assert got.dtype.kind == want.dtype.kind, f"{where}: dtype {got.dtype}, torch {want.dtype}"
            np.testing.assert_array_equal(got, want, err_msg=where)
