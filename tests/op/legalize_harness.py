"""Run legalized ops as compiled C kernels against NumPy.

A ``Case`` is one op call on params with symbolic shapes, a NumPy reference and the values of
the sym vars to run it at. ``build(cases)`` puts every case in one module (a graph function per
case), runs ``Legalize``, verifies the result, and compiles every kernel of the module as the
default scheduler makes it, with one ``build_library`` call. A kernel the schedule changed also
runs as legalize made it, on the reference interpreter (``tilework.codegen.interp``): the
legalization is checked apart from its schedule without compiling a second copy that no
pipeline builds (the C compiler's time is most of the suite's). ``run`` then calls a case's
kernel on NumPy inputs exactly as the graph does: the call's arguments are the function's
params, its sym args are the caller's dims evaluated at the case's values.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import ml_dtypes
import numpy as np

from tests.long import LONG, long_param
from tilework.codegen import build_library, interp
from tilework.ir.dtype import np_dtype
from tilework.codegen.c.module import CKernelModule
from tilework.ir import sym_walk
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Binding, Call, Expr, GlobalVar, GraphFunc, OpRef, ShapeExpr, Tuple, Var, bindings_of
from tilework.ir.info import StructInfo, TensorInfo, TupleInfo
from tilework.ir.loop import TensorFunc
from tilework.ir.module import IRModule
from tilework.ir.structural import structural_equal
from tilework.ir.sym import SymVar
from tilework.op.base import DimCheck
from tilework.transform.legalize import Legalize

Env = dict[SymVar, int]
BF16 = ml_dtypes.bfloat16
TOL = {"float64": 1e-9, "float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@dataclass
class Case:
    """``make(*params)`` on params of ``infos``; ``ref(*inputs)`` gives the expected result
    (an array, or a tuple of arrays for a tuple result). ``inputs`` overrides the default random
    inputs; ``tol`` the dtype's default tolerance (relative and absolute)."""

    name: str
    make: Callable[..., Expr]
    infos: Sequence[TensorInfo]
    ref: Callable[..., Any]
    envs: Sequence[Env]
    inputs: Callable[[Env, np.random.Generator], list[np.ndarray]] | None = None
    tol: float | None = None


@dataclass
class Built:
    module: IRModule
    lib: CKernelModule
    cases: dict[str, Case] = field(default_factory=dict)
    plain: dict[str, TensorFunc] = field(default_factory=dict)  # kernels as legalized, where the schedule changed them


def random_array(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Standard-normal floats, small signed ints (never 0, so they can divide), fair bools."""
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.startswith(("int", "uint")):
        lo = 0 if dtype == "uint8" else -9
        v = rng.integers(lo, 10, size=shape)
        v[v == 0] = 3
        return v.astype(np_dtype(dtype))
    return np.asarray(rng.standard_normal(shape)).astype(np_dtype(dtype))


def shape_at(shape: Sequence[Any], env: Env) -> tuple[int, ...]:
    return tuple(sym_walk.evaluate(d, env) for d in shape)


def default_inputs(case: Case, env: Env, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for info in case.infos:
        assert info.shape is not None and info.dtype is not None
        out.append(random_array(shape_at(info.shape, env), info.dtype, rng))
    return out


def _schedule() -> Callable[[TensorFunc], TensorFunc] | None:
    try:
        mod = importlib.import_module("tilework.schedule")
    except ImportError:
        return None
    fn = getattr(mod, "default_schedule", None)
    return fn if callable(fn) else None


def build(cases: Sequence[Case]) -> Built:
    bb = BlockBuilder()
    for case in cases:
        params = [Var(f"p{i}", info) for i, info in enumerate(case.infos)]
        with bb.function(case.name, params):
            with bb.dataflow():
                out = bb.emit_output(case.make(*params))
            bb.emit_func_output(out)
    mod = Legalize()(bb.get())
    from tilework.ir.verify import verify

    verify(mod)
    funcs = dict(mod.tensor_funcs())
    schedule = _schedule()
    plain: dict[str, TensorFunc] = {}
    if schedule is not None:
        for name, f in list(funcs.items()):
            scheduled = schedule(f)
            if not structural_equal(scheduled.replace(attrs=f.attrs), f):  # the same code but its schedule's marks
                funcs[name], plain[name] = scheduled, f
    return Built(mod, build_library(funcs), {c.name: c for c in cases}, plain)


def kernel_call(func: GraphFunc) -> tuple[Call, list[Call]]:
    """The one call_tensor of a legalized case function and the assert_dims before it."""
    calls = [b.value for b in bindings_of(func) if isinstance(b, Binding) and isinstance(b.value, Call)]
    kernels = [c for c in calls if isinstance(c.callee, OpRef) and c.callee.name == "call_tensor"]
    asserts = [c for c in calls if isinstance(c.callee, OpRef) and c.callee.name == "assert_dims"]
    others = [c for c in calls if c not in kernels and c not in asserts]
    assert len(kernels) == 1 and not others, f"expected one kernel call, got {calls}"
    return kernels[0], asserts


def _checks(assert_call: Call) -> list[DimCheck]:
    dims = assert_call.args[0]
    assert isinstance(dims, ShapeExpr)
    return [DimCheck(kind, (dims.values[i], dims.values[j]), msg) for kind, i, j, msg in assert_call.attrs["checks"]]


def _outputs(info: StructInfo, env: Env) -> list[np.ndarray]:
    fields = info.fields if isinstance(info, TupleInfo) else (info,)
    out = []
    for f in fields:
        assert isinstance(f, TensorInfo) and f.shape is not None and f.dtype is not None
        dt = np_dtype(f.dtype)
        out.append(np.full(shape_at(f.shape, env), 77, dtype=dt) if dt != np.bool_ else np.zeros(shape_at(f.shape, env), dt))
    return out


def run(built: Built, name: str, env: Env, seed: int = 0, scheduled: bool = True) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Inputs and outputs of case ``name``'s kernel run at ``env``: the compiled kernel, or
    (``scheduled=False``, where the schedule changed it) the kernel as legalized, interpreted."""
    case = built.cases[name]
    func = built.module[name]
    assert isinstance(func, GraphFunc)
    call, asserts = kernel_call(func)
    for a in asserts:
        for check in _checks(a):
            assert check.holds(env), f"test values {env} break the op's run-time check: {check.message}"
    rng = np.random.default_rng(seed)
    inputs = case.inputs(env, rng) if case.inputs is not None else default_inputs(case, env, rng)
    by_param = {p: x for p, x in zip(func.params, inputs)}
    gv, args = call.args[0], call.args[1]
    assert isinstance(gv, GlobalVar) and isinstance(args, Tuple)
    arrays = [np.array(by_param[a], order="C") for a in args.fields if isinstance(a, Var)]
    assert len(arrays) == len(args.fields), "kernel arguments must be the function's params"
    sym_args = call.args[2].values if len(call.args) == 3 else ()  # type: ignore[attr-defined]
    outs = _outputs(call.sinfo_args[0], env)
    syms = [sym_walk.evaluate(d, env) for d in sym_args]
    if not scheduled and gv.name in built.plain:
        interp.run(built.plain[gv.name], arrays + outs, syms)
    else:
        built.lib[gv.name].run(arrays + outs, syms)
    return inputs, outs


def check(built: Built, name: str) -> None:
    """Run case ``name`` at each of its sym values against its reference: compiled as scheduled,
    and interpreted as legalized where the schedule changed the kernel."""
    case = built.cases[name]
    func = built.module[name]
    assert isinstance(func, GraphFunc)
    gv = kernel_call(func)[0].args[0]
    assert isinstance(gv, GlobalVar)
    for k, env in enumerate(case.envs):
        for scheduled in (False, True) if gv.name in built.plain else (True,):
            inputs, outs = run(built, name, env, seed=k, scheduled=scheduled)
            expected = case.ref(*inputs)
            expected = list(expected) if isinstance(expected, tuple) else [expected]
            assert len(expected) == len(outs)
            where = f"{name} at {({v.name: x for v, x in env.items()})}{'' if scheduled else ' as legalized (interpreted)'}"
            for got, want in zip(outs, expected):
                compare(got, np.asarray(want), where, case.tol)


def compare(got: np.ndarray, want: np.ndarray, where: str, tol: float | None = None) -> None:
    assert got.shape == want.shape, f"{where}: shape {got.shape}, expected {want.shape}"
    dtype = str(got.dtype)
    if dtype in TOL:
        t = TOL[dtype] if tol is None else tol
        g, w = got.astype(np.float64), want.astype(np.float64)
        np.testing.assert_allclose(g, w, rtol=t, atol=t, equal_nan=True, err_msg=where)
    else:
        assert want.dtype == got.dtype or want.dtype.kind == got.dtype.kind, f"{where}: dtype {got.dtype}, reference {want.dtype}"
        np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=where)


def assert_round_trips(built: Built) -> None:
    """The legalized module (graph functions and kernels) prints and parses back unchanged."""
    from tilework.ir.structural import assert_structural_equal
    from tilework.text import parse, print_module

    assert_structural_equal(built.module, parse(print_module(built.module)))


def envs(*values: Mapping[SymVar, int]) -> list[Env]:
    return [dict(v) for v in values]


def tiered(cases: Sequence[Case], long_cases: Mapping[str, str]) -> tuple[list[Case], list[Any]]:
    """The cases a module builds (those of ``long_cases``, name -> why, only in the long tier)
    and the test params of every case's name (the long ones skipped, saying why, outside it)."""
    names = {c.name for c in cases}
    assert set(long_cases) <= names, f"long cases that are not cases: {sorted(set(long_cases) - names)}"
    built = [c for c in cases if LONG or c.name not in long_cases]
    params = [long_param(c.name, why=long_cases[c.name]) if c.name in long_cases else c.name for c in cases]
    return built, params


__all__ = ["BF16", "Case", "Built", "build", "check", "run", "compare", "envs", "tiered", "random_array", "shape_at", "assert_round_trips", "kernel_call"]
