"""Structural equality modulo names, the path of the first difference, and hashing that agrees
with equality and is stable across processes."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable

import numpy as np
import pytest

from tests.text.modules import f32, graph_module, kernel
from tilework import op
from tilework.ir import sym
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Attrs, Constant, GraphFunc, PrimValue, Var
from tilework.ir.info import AnyInfo, PrimInfo, ShapeInfo, TensorInfo, TupleInfo
from tilework.ir.loop import Block, Buffer, Const, For, IterVar, Store, TensorFunc
from tilework.ir.module import IRModule
from tilework.ir.structural import assert_structural_equal, structural_equal, structural_hash
from tilework.ir.sym import SymVar


def _chain(names: tuple[str, str, str], n: SymVar, ops: tuple[str, str] = ("exp", "add"), dtype: str = "float32", const: float = 1.0, attr: str = "float16") -> IRModule:
    x = Var(names[0], TensorInfo((n, 4), dtype))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.make_call(ops[0], [x]), name=names[1])
            z = bb.emit(op.make_call(ops[1], [y, Constant.of(np.full((4,), const, dtype))]), name=names[2])
            w = bb.emit_output(op.astype(z, attr))
        bb.emit_func_output(w)
    return bb.get()


def test_equal_modulo_names_of_vars_and_sym_vars() -> None:
    a = _chain(("x", "y", "z"), SymVar("n", 1, 64))
    b = _chain(("p", "q", "r"), SymVar("batch", 1, 64))
    assert structural_equal(a, b)
    assert_structural_equal(a, b)
    assert structural_hash(a) == structural_hash(b)


@pytest.mark.parametrize(
    "change, path",
    [
        (lambda: _chain(("x", "y", "z"), SymVar("n", 1, 32)), "main.params[0].info.shape[0]: sym var bounds differ"),
        (lambda: _chain(("x", "y", "z"), SymVar("n", 1, 64), dtype="float64"), "main.params[0].info.dtype"),
        (lambda: _chain(("x", "y", "z"), SymVar("n", 1, 64), ops=("log", "add")), "main.body.blocks[0].bindings[0].value.callee.name: 'exp' vs 'log'"),
        (lambda: _chain(("x", "y", "z"), SymVar("n", 1, 64), attr="bfloat16"), "main.ret_info.dtype: 'float16' vs 'bfloat16'"),
        (lambda: _chain(("x", "y", "z"), SymVar("n", 1, 64), const=2.0), "main.body.blocks[0].bindings[1].value.args[1].data: constant data differs"),
        (lambda: _chain(("x", "y", "z"), SymVar("n", 1, 64), ops=("exp", "multiply")), "main.body.blocks[0].bindings[1].value.callee.name"),
    ],
    ids=["sym-bounds", "dtype", "op-name", "attr", "constant-data", "second-op"],
)
def test_each_kind_of_difference(change: Callable[[], IRModule], path: str) -> None:
    a = _chain(("x", "y", "z"), SymVar("n", 1, 64))
    b = change()
    assert not structural_equal(a, b)
    with pytest.raises(AssertionError) as err:
        assert_structural_equal(a, b)
    assert path in str(err.value)
    assert structural_hash(a) != structural_hash(b)


def test_attr_value_difference_has_its_path() -> None:
    x = Var("x", f32(4))
    with pytest.raises(AssertionError, match=r"^not structurally equal: \.attrs\['dtype'\]: 'float16' vs 'bfloat16'$"):
        assert_structural_equal(op.astype(x, "float16"), op.astype(x, "bfloat16"))


def test_path_of_a_differing_argument() -> None:
    x, y = Var("x", f32(4)), Var("y", f32(4))
    bb = BlockBuilder()
    with bb.function("main", [x, y]):
        bb.emit(op.exp(x))
        bb.emit(op.exp(y))
        bb.emit_func_output(bb.emit(op.add(x, x)))
    a = bb.get()
    bb = BlockBuilder()
    with bb.function("main", [x, y]):
        bb.emit(op.exp(x))
        bb.emit(op.exp(y))
        bb.emit_func_output(bb.emit(op.add(x, y)))
    b = bb.get()
    with pytest.raises(AssertionError) as err:
        assert_structural_equal(a, b)
    assert str(err.value) == "not structurally equal: main.body.blocks[0].bindings[2].value.args[1]: %x vs %y"


def test_binding_order_matters() -> None:
    x = Var("x", f32(4))

    def build(first: str, second: str) -> IRModule:
        bb = BlockBuilder()
        with bb.function("main", [x]):
            a = bb.emit(op.make_call(first, [x]))
            b = bb.emit(op.make_call(second, [x]))
            bb.emit_func_output(bb.emit(op.add(a, b)))
        return bb.get()

    assert structural_equal(build("exp", "log"), build("exp", "log"))
    assert not structural_equal(build("exp", "log"), build("log", "exp"))


def test_dataflow_var_is_not_a_var() -> None:
    x = Var("x", f32(4))

    def build(in_dataflow: bool) -> IRModule:
        bb = BlockBuilder()
        with bb.function("main", [x]):
            if in_dataflow:
                with bb.dataflow():
                    y = bb.emit_output(op.exp(x))
            else:
                y = bb.emit(op.exp(x))
            bb.emit_func_output(y)
        return bb.get()

    assert not structural_equal(build(True), build(False))


def test_free_vars_need_identity_unless_mapped() -> None:
    n = SymVar("n")
    x, y = Var("x", f32(n)), Var("y", f32(n))
    assert structural_equal(op.exp(x), op.exp(x))
    assert not structural_equal(op.exp(x), op.exp(y))
    assert structural_equal(op.exp(x), op.exp(y), map_free_vars=True)
    assert not structural_equal(op.add(x, x), op.add(x, y), map_free_vars=True)
    m = SymVar("m")
    assert not structural_equal(f32(n), f32(m))
    assert structural_equal(f32(n), f32(m), map_free_vars=True)
    assert not structural_equal(f32(n), f32(SymVar("m", 1)), map_free_vars=True)
    assert structural_hash(f32(n)) == structural_hash(f32(m))


def test_dims_compare_in_canonical_form() -> None:
    n, m = SymVar("n"), SymVar("m")
    assert structural_equal(ShapeInfo((n * 2 + m,)), ShapeInfo((m + n + n,)))
    p, q = SymVar("p"), SymVar("q")
    assert structural_equal(TensorInfo((n * 2 + m,), "float32"), TensorInfo((q * 2 + p,), "float32"), map_free_vars=True)
    assert not structural_equal(TensorInfo((n * 2 + m, n), "float32"), TensorInfo((q * 2 + p, p), "float32"), map_free_vars=True)
    assert structural_equal(TensorInfo((n * 2 + m, n), "float32"), TensorInfo((q * 2 + p, q), "float32"), map_free_vars=True)


def test_sym_vars_first_met_inside_a_compound_dim() -> None:
    """A TensorFunc whose buffer shape is ``n * m`` with ``n``, ``m`` as later sym params."""

    def build(a: str, b: str, swap: bool) -> TensorFunc:
        n, m = SymVar(a), SymVar(b)
        A = Buffer("A", (n * 2 + m,), "float32")
        params = (A, m, n) if swap else (A, n, m)
        return TensorFunc(params, Store(A, (0,), Const(1.0, "float32")))

    assert structural_equal(build("n", "m", False), build("u", "v", False))
    assert not structural_equal(build("n", "m", False), build("n", "m", True))
    assert structural_hash(build("n", "m", False)) == structural_hash(build("u", "v", False))


def test_one_shared_sym_var_equals_two_distinct() -> None:
    def build(shared: bool) -> IRModule:
        n = SymVar("n", 1)
        bb = BlockBuilder()
        for name in ("f", "g"):
            v = n if shared else SymVar("n", 1)
            x = Var("x", f32(v))
            with bb.function(name, [x]):
                bb.emit_func_output(bb.emit(op.exp(x)))
        return bb.get()

    assert structural_equal(build(True), build(False))
    assert structural_hash(build(True)) == structural_hash(build(False))


def test_loop_level_differences() -> None:
    def build(kind: str = "serial", name: str = "b", extent: int = 4, value: float = 1.0, buf: str = "A") -> TensorFunc:
        A = Buffer(buf, (extent,), "float32")
        i, vi = SymVar("i"), SymVar("vi")
        blk = Block(name, (IterVar(vi, extent, "spatial", i),), (), (A,), Store(A, (vi,), Const(value, "float32")))
        return TensorFunc((A,), For(i, extent, blk, kind))

    base = build()
    assert structural_equal(base, build(buf="Out"))
    for other, path in [
        (build(kind="parallel"), ".body.kind"),
        (build(name="c"), ".body.body.name"),
        (build(extent=8), ".params[0].shape[0]"),
        (build(value=2.0), ".body.body.body.value.value"),
    ]:
        with pytest.raises(AssertionError, match=path.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
            assert_structural_equal(base, other)
        assert structural_hash(base) != structural_hash(other)


def test_literal_kinds_are_distinguished() -> None:
    assert not structural_equal(Const(1, "float32"), Const(1.0, "float32"))
    assert not structural_equal(Const(0.0, "float32"), Const(-0.0, "float32"))
    assert structural_equal(Const(float("nan"), "float32"), Const(float("nan"), "float32"))
    assert not structural_equal(PrimValue.of(True), PrimValue(1, PrimInfo("bool")))
    assert not structural_equal(Attrs(a=1), Attrs(a=True))
    assert structural_equal(Attrs(a=(1, 2.5, "s", None)), Attrs(a=[1, 2.5, "s", None]))
    assert structural_equal(Attrs(a=np.int64(3)), Attrs(a=3))
    assert not structural_equal(TupleInfo((AnyInfo(),)), TupleInfo((AnyInfo(), AnyInfo())))


def test_module_function_sets_and_order() -> None:
    a, b = graph_module(), graph_module()
    assert structural_equal(a, b)
    reordered = IRModule({name: a[name] for name in reversed(list(a))}, a.attrs)
    assert structural_equal(a, reordered) and structural_hash(a) == structural_hash(reordered)
    assert not structural_equal(a, a.without("helper"))
    assert not structural_equal(a, a.with_attrs(target="gpu"))
    assert structural_hash(a) != structural_hash(a.with_attrs(target="gpu"))


def test_hash_is_stable_across_processes() -> None:
    """The hash keys persistent caches: it must not depend on PYTHONHASHSEED or object ids."""
    code = "from tests.text.modules import graph_module; from tilework.ir.structural import structural_hash; print(structural_hash(graph_module()))"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=root)
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True).stdout.strip())
    assert outs == {str(structural_hash(graph_module()))}


def test_hash_of_every_level() -> None:
    n = SymVar("n")
    hashes = {
        structural_hash(graph_module()),
        structural_hash(kernel()),
        structural_hash(f32(n, 4)),
        structural_hash(op.exp(Var("x", f32(n)))),
        structural_hash(n + 1),
        structural_hash(sym.min_(n, 3)),
        structural_hash(Attrs(k=1)),
    }
    assert len(hashes) == 7
    assert all(0 <= h < 2**64 for h in hashes)
    assert structural_hash(n + 1) == structural_hash(SymVar("m") + 1)
    assert structural_hash(sym.min_(n, 3)) == structural_hash(sym.min_(SymVar("z"), 3))


def test_graph_func_and_var_info() -> None:
    a = graph_module()["main"]
    assert isinstance(a, GraphFunc)
    changed = a.replace(params=(Var("x", f32(SymVar("n", 1, 4096), 5)),) + a.params[1:])
    with pytest.raises(AssertionError, match=r"params\[0\]\.info\.shape\[1\]: 4 vs 5"):
        assert_structural_equal(a, changed)
