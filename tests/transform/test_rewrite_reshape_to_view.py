"""rewrite_reshape_to_view: row-major copy kernels become zero-copy views, recognized by their
structure, with symbolic shapes; the result shares memory with the input at run time."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tests.transform.util import check_pass, ir
from tilework.ir.loop import TensorFunc
from tilework.transform.legalize import Legalize
from tilework.transform.rewrite_reshape_to_view import RewriteReshapeToView, is_reshape_kernel

P = RewriteReshapeToView()

SHAPE_OPS = """
@graph
def main(x: Tensor((n, m), "float32")):
    n = sym(lo=1)
    m = sym(lo=1)
    with dataflow():
        a = reshape(x, shape(n * m))
        b = expand_dims(x, axis=(0, 2))
        c = squeeze(b, axis=(0,))
        d = flatten(c, start_dim=0, end_dim=-1)
        e = permute_dims(x, axes=(1, 0))
        f = exp(x)
        g = reshape(f, shape(m, n))
        gv = (a, c, d, e, g)
        output(gv)
    return gv
"""


def test_reshape_like_kernels_become_views_and_their_kernels_go() -> None:
    legalized = Legalize()(ir(SHAPE_OPS))
    expected = """
    @graph
    def main(x: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym(lo=1)
        with dataflow():
            a = vm_view(x, shape(n * m))
            b = vm_view(x, shape(1, n, 1, m))
            c = vm_view(b, shape(n, 1, m))
            d = vm_view(c, shape(n * m))
            e = call_tensor(@permute_dims, (x,), out=Tensor((m, n), "float32"))
            f = call_tensor(@exp, (x,), out=Tensor((n, m), "float32"))
            g = vm_view(f, shape(m, n))
            gv = (a, c, d, e, g)
            output(gv)
        return gv

    @tensor
    def permute_dims(x: Buffer((n, m), "float32"), permute_dims: Buffer((m, n), "float32")):
        n = sym(lo=1)
        m = sym(lo=1)
        for i0 in range(m):
            for i1 in range(n):
                with block("permute_dims"):
                    vi0 = spatial(m, i0)
                    vi1 = spatial(n, i1)
                    reads(x)
                    writes(permute_dims)
                    permute_dims[vi0, vi1] = x[vi1, vi0]

    @tensor
    def exp(x: Buffer((n, m), "float32"), exp_1: Buffer((n, m), "float32")):
        n = sym(lo=1)
        m = sym(lo=1)
        for i0 in range(n):
            for i1 in range(m):
                with block("exp"):
                    vi0 = spatial(n, i0)
                    vi1 = spatial(m, i1)
                    reads(x)
                    writes(exp_1)
                    exp_1[vi0, vi1] = exp(x[vi0, vi1])
    """
    check_pass(P, legalized, expected)


def _kernel(body: str, params: str = 'A: Buffer((n, m), "float32"), B: Buffer((n * m,), "float32")') -> TensorFunc:
    text = f"""
@tensor
def k({params}):
    n = sym(lo=1)
    m = sym(lo=1)
    i = sym()
    vi = sym()
{body}
"""
    f = tw.parse(text)["k"]
    assert isinstance(f, TensorFunc)
    return f


FLAT = """    for i in range(n * m):
        with block("B"):
            vi = spatial(n * m, i)
            reads(A)
            writes(B)
            B[vi] = A[{idx}]
"""


@pytest.mark.parametrize(
    "idx, expected",
    [
        ("vi // m, vi % m", True),  # row-major: a view
        ("vi % n, vi // n", False),  # column-major: a transpose, not a view
        ("vi // m, 0", False),  # reads only column 0
    ],
)
def test_hand_written_kernels_are_recognized_by_structure(idx: str, expected: bool) -> None:
    assert is_reshape_kernel(_kernel(FLAT.format(idx=idx))) is expected


def test_kernels_that_are_not_plain_copies_are_kept() -> None:
    slice_ = _kernel(FLAT.replace("n * m", "n").format(idx="vi, 0"), 'A: Buffer((n, m), "float32"), B: Buffer((n,), "float32")')
    assert not is_reshape_kernel(slice_)  # fewer elements: a slice, whatever the index
    cast = _kernel(FLAT.format(idx="vi // m, vi % m"), 'A: Buffer((n, m), "float32"), B: Buffer((n * m,), "float16")')
    assert not is_reshape_kernel(cast)
    scaled = _kernel(FLAT.format(idx="vi // m, vi % m").replace("A[vi // m, vi % m]", "A[vi // m, vi % m] * float32(2.0)"))
    assert not is_reshape_kernel(scaled)
    split_loop = """    for io in range(n * m // 2):
        for ii in range(2):
            with block("B"):
                vi = spatial(n * m, io * 2 + ii)
                reads(A)
                writes(B)
                B[vi] = A[vi // m, vi % m]
"""
    assert not is_reshape_kernel(_kernel(split_loop))  # scheduled: not the plain loop nest


def test_end_to_end_views_share_memory_and_numerics_hold() -> None:
    mod = ir(SHAPE_OPS)
    exe = tw.build(mod, post_legalize_passes=[P])
    vm = tw.VM(exe)
    plain = tw.VM(tw.build(mod))
    for n, m in ((1, 1), (3, 5), (4, 2)):
        x = np.random.default_rng(n * 10 + m).standard_normal((n, m)).astype("float32")
        a, c, d, e, g = vm["main"](x)
        np.testing.assert_array_equal(a, x.reshape(n * m))
        np.testing.assert_array_equal(c, x.reshape(n, 1, m))
        np.testing.assert_array_equal(d, x.reshape(n * m))
        np.testing.assert_array_equal(e, x.T)
        np.testing.assert_allclose(g, np.exp(x).reshape(m, n), rtol=1e-6)
        for view in (a, c, d):
            assert np.shares_memory(view, x)
        assert not np.shares_memory(e, x)
        for got, want in zip((a, c, d, e, g), plain["main"](x)):
            np.testing.assert_array_equal(got, want)


def test_lowering_keeps_views_and_makes_their_shapes_concrete() -> None:
    from tilework.ir.graph import Binding, Call, GraphFunc, OpRef, ShapeExpr, Var, bindings_of
    from tilework.transform.pipeline import Pipeline, flatten, stages

    seen: dict[str, list[Call]] = {}

    def views(name: str, mod: tw.IRModule) -> None:
        main = mod["main"]
        assert isinstance(main, GraphFunc)
        seen[name] = [b.value for b in bindings_of(main) if isinstance(b.value, Call) and isinstance(b.value.callee, OpRef) and b.value.callee.name == "vm_view"]

    passes = flatten(stages(graph=[], kernel=[P]), start="legalize")
    lowered = Pipeline(passes, on_pass=views)(ir(SHAPE_OPS))
    assert [len(seen[p.name]) for p in passes] == [0] + [5] * (len(passes) - 1)  # a, b, c, d, g
    assert all(isinstance(v.args[1], ShapeExpr) for v in seen["lower_calls"])  # kept as they are
    main = lowered["main"]
    assert isinstance(main, GraphFunc)
    made = {b.var: b.value for b in bindings_of(main) if isinstance(b, Binding) and isinstance(b.value, Call)}
    for view in seen[passes[-1].name]:
        shape = view.args[1]
        assert isinstance(shape, Var) and made[shape].callee.name == "vm_make_shape"  # type: ignore[attr-defined]
