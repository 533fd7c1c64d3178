"""fuse_tensor: each primitive group becomes one TensorFunc (sym vars matched, static callers
specialising symbolic kernels, intermediates inlined or scratch); models keep their numerics
and lose at least 40% of their kernel launches."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import tilework as tw
from tests.transform.test_fuse_ops import KERNELS
from tests.transform.util import check_pass
from tilework.ir.graph import Call, GraphFunc, OpRef, bindings_of
from tilework.ir.loop import Block, Intrin, Store, walk_scalars, walk_stmts
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar
from tilework.models.numpy_ref import encoder_ref, transformer_block_ref
from tilework.models.reference import EncoderConfig, TransformerConfig, encoder, random_weights, transformer_block
from tilework.transform.fuse_ops import FuseOps
from tilework.transform.fuse_tensor import FuseTensor, _CannotFuse, fusion_passes, match_syms
from tilework.schedule.tree import walk
from tilework.transform.legalize import Legalize
from tilework.transform.pipeline import Pipeline

P = FuseTensor()
BOTH = Pipeline([FuseOps(), FuseTensor()], name="fuse_ops+fuse_tensor")

EXTRA = '''
@tensor
def flat_add(a: Buffer((n, m), "float32"), b: Buffer((n * m,), "float32"), c: Buffer((n * m,), "float32")):
    n = sym()
    m = sym()
    for i in range(n * m):
        with block("flat_add"):
            vi = spatial(n * m, i)
            reads(a, b)
            writes(c)
            c[vi] = a[vi // m, vi % m] + b[vi]

@tensor
def rep(a: Buffer((n,), "float32"), m: int64, c: Buffer((m * n,), "float32")):
    n = sym()
    m = sym()
    for i in range(m * n):
        with block("rep"):
            vi = spatial(m * n, i)
            reads(a)
            writes(c)
            c[vi] = a[vi % n]
'''


def kernels(*names: str) -> str:
    """The texts of the named kernels of ``KERNELS`` and ``EXTRA``."""
    parts = (textwrap.dedent(KERNELS) + textwrap.dedent(EXTRA)).split("@tensor\n")
    by_name = {p.split("(", 1)[0].removeprefix("def "): "@tensor\n" + p for p in parts if p.strip()}
    return "\n".join(by_name[n] for n in names)


def src(kernel_names: tuple[str, ...], *texts: str) -> str:
    return "\n".join([kernels(*kernel_names), *(textwrap.dedent(t) for t in texts)])


# -- matching sym vars ------------------------------------------------------------------------


def test_match_syms_binds_bare_vars_then_checks_compound_dims() -> None:
    n, m, k = SymVar("n"), SymVar("m"), SymVar("k", 1)
    assert match_syms([((n, m, n * m), (16, 16, 256))], {}) == {n: 16, m: 16}
    assert match_syms([((n * m, n, m), (k * 2, k, 2))], {}) == {n: k, m: 2}
    assert match_syms([((2 * n,), (8,))], {}) == {n: 4}
    assert match_syms([((2 * n + 1,), (2 * k + 3,))], {}) == {n: k + 1}
    assert match_syms([((n,), (k,))], {m: 3}) == {n: k, m: 3}


_N = SymVar("n")


@pytest.mark.parametrize(
    "pattern, actual",
    [
        ((_N, _N), (3, 4)),  # a var bound twice to different values
        ((SymVar("n") * SymVar("m"),), (12,)),  # two unknowns in one dim
        ((2 * SymVar("n"),), (7,)),  # no integer solution
        ((SymVar("n"),), (SymVar("a"), 1)),  # rank mismatch
        ((SymVar("n", 2),), (SymVar("a"),)),  # a may be below the kernel's declared range
    ],
)
def test_match_syms_refuses_what_it_cannot_prove(pattern: tuple, actual: tuple) -> None:
    with pytest.raises(_CannotFuse):
        match_syms([(pattern, actual)], {})


# -- before / after ---------------------------------------------------------------------------


def test_matmul_epilogue_merges_into_one_kernel_with_the_epilogue_inlined() -> None:
    before = """
    @graph
    def main(x: Tensor((n, k), "float32"), w: Tensor((k, m), "float32"), b: Tensor((m,), "float32"), r: Tensor((n, m), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        k = sym()
        m = sym()
        with dataflow():
            gv: Tensor((n, m), "float32") = @fused_matmul_bias_exp_add(x, w, b, r)
            output(gv)
        return gv

    @graph(attrs={"primitive": True})
    def fused_matmul_bias_exp_add(x: Tensor((n, k), "float32"), w: Tensor((k, m), "float32"), b: Tensor((m,), "float32"), r: Tensor((n, m), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        k = sym()
        m = sym()
        with dataflow():
            mm: Tensor((n, m), "float32") = call_tensor(@matmul, (x, w), out=Tensor((n, m), "float32"))
            bi: Tensor((n, m), "float32") = call_tensor(@bias, (mm, b), out=Tensor((n, m), "float32"))
            e: Tensor((n, m), "float32") = call_tensor(@exp, (bi,), out=Tensor((n, m), "float32"))
            gv: Tensor((n, m), "float32") = call_tensor(@add, (e, r), out=Tensor((n, m), "float32"))
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n, k), "float32"), w: Tensor((k, m), "float32"), b: Tensor((m,), "float32"), r: Tensor((n, m), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        k = sym()
        m = sym()
        with dataflow():
            gv: Tensor((n, m), "float32") = call_tensor(@fused_matmul_bias_exp_add, (x, w, b, r), out=Tensor((n, m), "float32"))
            output(gv)
        return gv

    @tensor(attrs={"op_pattern": "out_ewise_fusable"})
    def fused_matmul_bias_exp_add(x: Buffer((n, k), "float32"), w: Buffer((k, m), "float32"), b: Buffer((m,), "float32"), r: Buffer((n, m), "float32"), gv: Buffer((n, m), "float32")):
        n = sym()
        k = sym()
        m = sym()
        with allocate((n, m), "float32") as mm:
            for i in range(n):
                for j in range(m):
                    for r_1 in range(k):
                        with block("matmul"):
                            vi = spatial(n, i)
                            vj = spatial(m, j)
                            vr = reduce(k, r_1)
                            reads(mm, x, w)
                            writes(mm)
                            with init():
                                mm[vi, vj] = float32(0.0)
                            mm[vi, vj] = mm[vi, vj] + x[vi, vr] * w[vr, vj]
            for i_3 in range(n):
                for j_3 in range(m):
                    with block("add"):
                        vi_3 = spatial(n, i_3)
                        vj_3 = spatial(m, j_3)
                        reads(r, mm, b)
                        writes(gv)
                        gv[vi_3, vj_3] = exp(mm[vi_3, vj_3] + b[vj_3]) + r[vi_3, vj_3]
    """
    check_pass(P, src(("matmul", "bias", "exp", "add"), before), textwrap.dedent(expected))


def test_static_caller_specialises_a_symbolic_kernel() -> None:
    # flat_add takes [n, m] and [n * m]: called with [16, 16] and [256] it binds n = m = 16
    # and becomes a static loop; called with [a, b] and [a * b] it stays symbolic.
    before = """
    @graph
    def main(x: Tensor((16, 16), "float32"), y: Tensor((256,), "float32"), p: Tensor((a, b), "float32"), q: Tensor((a * b,), "float32")) -> Tuple(Tensor((256,), "float32"), Tensor((a * b,), "float32")):
        a = sym()
        b = sym()
        with dataflow():
            e: Tensor((16, 16), "float32") = call_tensor(@exp, (x,), out=Tensor((16, 16), "float32"))
            gv: Tensor((256,), "float32") = call_tensor(@flat_add, (e, y), out=Tensor((256,), "float32"))
            e2: Tensor((a, b), "float32") = call_tensor(@exp, (p,), out=Tensor((a, b), "float32"))
            gv2: Tensor((a * b,), "float32") = call_tensor(@flat_add, (e2, q), out=Tensor((a * b,), "float32"))
            output(gv, gv2)
        return (gv, gv2)
    """
    expected = """
    @graph
    def main(x: Tensor((16, 16), "float32"), y: Tensor((256,), "float32"), p: Tensor((a, b), "float32"), q: Tensor((a * b,), "float32")) -> Tuple(Tensor((256,), "float32"), Tensor((a * b,), "float32")):
        a = sym()
        b = sym()
        with dataflow():
            gv: Tensor((256,), "float32") = call_tensor(@fused_exp_flat_add, (x, y), out=Tensor((256,), "float32"))
            gv2: Tensor((a * b,), "float32") = call_tensor(@fused_exp_flat_add_1, (p, q), out=Tensor((a * b,), "float32"))
            output(gv, gv2)
        return (gv, gv2)

    @tensor(attrs={"op_pattern": "injective"})
    def fused_exp_flat_add(x: Buffer((16, 16), "float32"), y: Buffer((256,), "float32"), gv: Buffer((256,), "float32")):
        i_1 = sym(hi=255)
        vi_1 = sym(hi=255)
        for i_1 in range(256):
            with block("flat_add"):
                vi_1 = spatial(256, i_1)
                reads(y, x)
                writes(gv)
                gv[vi_1] = exp(x[vi_1 // 16, vi_1 % 16]) + y[vi_1]

    @tensor(attrs={"op_pattern": "injective"})
    def fused_exp_flat_add_1(p: Buffer((a, b), "float32"), q: Buffer((a * b,), "float32"), gv2: Buffer((a * b,), "float32")):
        a = sym()
        b = sym()
        for i_1 in range(a * b):
            with block("flat_add"):
                vi_1 = spatial(a * b, i_1)
                reads(q, p)
                writes(gv2)
                gv2[vi_1] = exp(p[vi_1 // b, vi_1 % b]) + q[vi_1]
    """
    check_pass(BOTH, src(("exp", "flat_add"), before), textwrap.dedent(expected))


def test_reduction_output_stays_scratch_or_output_and_groups_may_have_two_outputs() -> None:
    # the add is inlined into the rowsum; the rowsum's result is both an output and the
    # input of the exp; p comes from the output buffer's shape, so no sym arg is needed. The
    # exp the tile repeats along p stays a block of its own (inlined, it would run p times).
    before = """
    @graph
    def main(y: Tensor((n, m), "float32"), r: Tensor((n, m), "float32"), x: Tensor((n,), "float32"), z: Tensor(ndim=1, dtype="float32")) -> Tuple(Tensor((n,), "float32"), Tensor((n,), "float32"), Tensor(ndim=2, dtype="float32")):
        n = sym()
        m = sym()
        p = sym()
        with dataflow():
            a: Tensor((n, m), "float32") = call_tensor(@add, (y, r), out=Tensor((n, m), "float32"))
            gv1: Tensor((n,), "float32") = call_tensor(@rowsum, (a,), out=Tensor((n,), "float32"))
            gv2: Tensor((n,), "float32") = call_tensor(@vexp, (gv1,), out=Tensor((n,), "float32"))
            e: Tensor((n,), "float32") = call_tensor(@vexp, (x,), out=Tensor((n,), "float32"))
            z1: Tensor((p,), "float32") = match_cast(z, Tensor((p,), "float32"))
            gv3: Tensor((p, n), "float32") = call_tensor(@tile, (e,), shape(p), out=Tensor((p, n), "float32"))
            output(gv1, gv2, gv3)
        return (gv1, gv2, gv3)
    """
    expected = """
    @graph
    def main(y: Tensor((n, m), "float32"), r: Tensor((n, m), "float32"), x: Tensor((n,), "float32"), z: Tensor(ndim=1, dtype="float32")) -> Tuple(Tensor((n,), "float32"), Tensor((n,), "float32"), Tensor(ndim=2, dtype="float32")):
        n = sym()
        m = sym()
        p = sym()
        with dataflow():
            res: Tuple(Tensor((n,), "float32"), Tensor((n,), "float32")) = call_tensor(@fused_add_rowsum_vexp, (y, r), out=Tuple(Tensor((n,), "float32"), Tensor((n,), "float32")))
            gv1: Tensor((n,), "float32") = res[0]
            gv2: Tensor((n,), "float32") = res[1]
            z1: Tensor((p,), "float32") = match_cast(z, Tensor((p,), "float32"))
            gv3: Tensor((p, n), "float32") = call_tensor(@fused_vexp_tile, (x,), out=Tensor((p, n), "float32"))
            output(gv1, gv2, gv3)
        return (gv1, gv2, gv3)

    @tensor(num_outputs=2, attrs={"op_pattern": "reduction"})
    def fused_add_rowsum_vexp(y: Buffer((n, m), "float32"), r: Buffer((n, m), "float32"), gv1: Buffer((n,), "float32"), gv2: Buffer((n,), "float32")):
        n = sym()
        m = sym()
        for i_1 in range(n):
            for k in range(m):
                with block("rowsum"):
                    vi_1 = spatial(n, i_1)
                    vk = reduce(m, k)
                    reads(gv1, y, r)
                    writes(gv1)
                    with init():
                        gv1[vi_1] = float32(0.0)
                    gv1[vi_1] = gv1[vi_1] + (y[vi_1, vk] + r[vi_1, vk])
        for i_2 in range(n):
            with block("vexp"):
                vi_2 = spatial(n, i_2)
                reads(gv1)
                writes(gv2)
                gv2[vi_2] = exp(gv1[vi_2])

    @tensor(attrs={"op_pattern": "broadcast"})
    def fused_vexp_tile(x: Buffer((n,), "float32"), gv3: Buffer((p, n), "float32")):
        n = sym()
        p = sym()
        with allocate((n,), "float32") as e:
            for i in range(n):
                with block("vexp"):
                    vi = spatial(n, i)
                    reads(x)
                    writes(e)
                    e[vi] = exp(x[vi])
            for i_1 in range(p):
                for j in range(n):
                    with block("tile"):
                        vi_1 = spatial(p, i_1)
                        vj = spatial(n, j)
                        reads(e)
                        writes(gv3)
                        gv3[vi_1, vj] = e[vj]
    """
    check_pass(BOTH, src(("add", "rowsum", "vexp", "tile"), before), textwrap.dedent(expected))


def test_a_sym_var_no_buffer_supplies_is_passed_as_a_sym_arg() -> None:
    before = """
    @graph
    def main(x: Tensor((n,), "float32"), z: Tensor(ndim=1, dtype="float32")) -> Tensor(ndim=1, dtype="float32"):
        n = sym()
        p = sym()
        with dataflow():
            e: Tensor((n,), "float32") = call_tensor(@vexp, (x,), out=Tensor((n,), "float32"))
            z1: Tensor((p,), "float32") = match_cast(z, Tensor((p,), "float32"))
            gv: Tensor((p * n,), "float32") = call_tensor(@rep, (e,), shape(p), out=Tensor((p * n,), "float32"))
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n,), "float32"), z: Tensor(ndim=1, dtype="float32")) -> Tensor(ndim=1, dtype="float32"):
        n = sym()
        p = sym()
        with dataflow():
            z1: Tensor((p,), "float32") = match_cast(z, Tensor((p,), "float32"))
            gv: Tensor((n * p,), "float32") = call_tensor(@fused_vexp_rep, (x,), shape(p), out=Tensor((n * p,), "float32"))
            output(gv)
        return gv

    @tensor(attrs={"op_pattern": "injective"})
    def fused_vexp_rep(x: Buffer((n,), "float32"), gv: Buffer((n * p,), "float32"), p: int64):
        n = sym()
        p = sym()
        for i_1 in range(n * p):
            with block("rep"):
                vi_1 = spatial(n * p, i_1)
                reads(x)
                writes(gv)
                gv[vi_1] = exp(x[vi_1 % n])
    """
    after = check_pass(BOTH, src(("vexp", "rep"), before), textwrap.dedent(expected))
    x = np.linspace(-1, 1, 4).astype("float32")
    z = np.zeros(3, "float32")
    got = tw.VM(tw.build(after))["main"](x, z)
    np.testing.assert_allclose(got, np.tile(np.exp(x), 3), rtol=1e-6)


def test_a_group_whose_shapes_cannot_be_proved_stays_a_plain_function() -> None:
    # add's two inputs must have one shape, but (n, m) = (p, q) cannot be proved here: the
    # group keeps its call boundary (and its run-time check) and loses the primitive mark.
    before = """
    @graph
    def main(x: Tensor((n, m), "float32"), y: Tensor((p, q), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        m = sym()
        p = sym()
        q = sym()
        with dataflow():
            gv: Tensor((n, m), "float32") = @group(x, y)
            output(gv)
        return gv

    @graph(attrs={"primitive": True})
    def group(x: Tensor((n, m), "float32"), y: Tensor((p, q), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        m = sym()
        p = sym()
        q = sym()
        with dataflow():
            e: Tensor((n, m), "float32") = call_tensor(@exp, (x,), out=Tensor((n, m), "float32"))
            gv: Tensor((n, m), "float32") = call_tensor(@add, (e, y), out=Tensor((n, m), "float32"))
            output(gv)
        return gv
    """
    expected = before.replace('@graph(attrs={"primitive": True})', "@graph")
    check_pass(P, src(("exp", "add"), before), src(("exp", "add"), expected))


# -- models -----------------------------------------------------------------------------------


def main_of(mod: IRModule) -> GraphFunc:
    f = mod["main"]
    assert isinstance(f, GraphFunc)
    return f


def kernel_calls(mod: IRModule) -> int:
    """Kernel launches per run of ``main`` (it has no control flow)."""
    calls = [b.value for b in bindings_of(main_of(mod)) if isinstance(b.value, Call)]
    return len([c for c in calls if isinstance(c.callee, OpRef) and c.callee.name == "call_tensor"])


def fused(mod: IRModule) -> tuple[IRModule, IRModule]:
    legal = Legalize()(mod)
    return legal, Pipeline(fusion_passes(), verify=True)(legal)


def test_transformer_block_keeps_its_numerics_with_40_percent_fewer_launches() -> None:
    cfg = TransformerConfig(layers=2, hidden=32, heads=4, ffn=64)
    mod = transformer_block(cfg)
    legal, fmod = fused(mod)
    assert not any(f.attrs.get("primitive") for _, f in fmod.graph_funcs())
    before, after = kernel_calls(legal), kernel_calls(fmod)
    assert after <= 0.6 * before, (before, after)
    vm = tw.VM(tw.build(fmod))
    weights = random_weights(list(main_of(mod).params[1:]))
    rng = np.random.default_rng(0)
    for batch, seq in [(1, 1), (1, 7), (2, 33)]:
        x = rng.standard_normal((batch, seq, cfg.hidden)).astype(np.float32)
        out = vm["main"](x, *weights)
        np.testing.assert_allclose(out, transformer_block_ref(x, weights, cfg), rtol=1e-4, atol=1e-4)


def test_encoder_keeps_its_numerics_through_the_post_legalize_hook() -> None:
    cfg = EncoderConfig(layers=2, hidden=32, heads=4, ffn=64)
    mod = encoder(cfg)
    vm = tw.VM(tw.build(mod, post_legalize_passes=fusion_passes()))
    weights = random_weights(list(main_of(mod).params[2:]))
    rng = np.random.default_rng(1)
    for batch, seq in [(1, 5), (2, 16)]:
        x = rng.standard_normal((batch, seq, cfg.hidden)).astype(np.float32)
        mask = np.zeros((batch, 1, 1, seq), np.float32)
        mask[0, ..., seq - 2 :] = -1e9  # padding at the end of the first sequence
        out = vm["main"](x, mask, *weights)
        np.testing.assert_allclose(out, encoder_ref(x, mask, weights, cfg), rtol=1e-4, atol=1e-4)


def test_minilm_shaped_encoder_loses_at_least_40_percent_of_its_launches() -> None:
    legal, fmod = fused(encoder(EncoderConfig()))
    before, after = kernel_calls(legal), kernel_calls(fmod)
    assert after <= 0.6 * before, (before, after)
    assert len(list(fmod.tensor_funcs())) <= len(list(legal.tensor_funcs()))  # shared across layers


def test_llama_graph_gives_the_same_results_fused_and_fused_kernels_keep_their_schedule_rules() -> None:
    from tilework.models.reference import LlamaConfig, llama_graph
    from tilework.transform.default_schedule import DefaultSchedule

    cfg = LlamaConfig(layers=2, hidden=32, heads=4, kv_heads=2, ffn=64)
    mod = llama_graph(cfg)
    legal, fmod = fused(mod)
    assert kernel_calls(fmod) <= 0.6 * kernel_calls(legal)
    rules = {n: f.attrs["schedule_rule"] for n, f in DefaultSchedule()(fmod).tensor_funcs()}
    # a matmul with its epilogue is still a matmul; attention with its reshapes keeps the
    # attention kernel's schedule
    assert {r for n, r in rules.items() if n.startswith("fused_linear")} == {"matmul"}, rules
    assert [r for n, r in rules.items() if "attention" in n] == ["attention"], rules
    weights = random_weights(list(main_of(mod).params[1:]))
    x = np.random.default_rng(2).standard_normal((1, 9, cfg.hidden)).astype(np.float32)
    want = tw.VM(tw.build(mod))["main"](x, *weights)
    got = tw.VM(tw.build(fmod))["main"](x, *weights)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_squeeze_excite_scale_is_computed_once_per_channel() -> None:
    """A squeeze-excite's ``x * sigmoid(fc(mean(x)))`` (the sigmoid of ``[N, 1, C]`` scaling
    ``[N, HW, C]``): the group keeps the sigmoid a block of its own, computed once per channel
    instead of once per pixel inside the multiply, and matches torch at 1 and odd sizes."""
    torch = pytest.importorskip("torch")

    class SE(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dw, self.fc1, self.fc2 = torch.nn.Conv2d(7, 7, 3, padding=1, groups=7), torch.nn.Conv2d(7, 3, 1), torch.nn.Conv2d(3, 7, 1)

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            y = torch.nn.functional.silu(self.dw(x))
            s = self.fc2(torch.relu(self.fc1(torch.nn.functional.adaptive_avg_pool2d(y, 1))))
            return y * torch.sigmoid(s)

    torch.manual_seed(0)
    m = SE().eval()
    n = torch.export.Dim("n", min=1, max=8)
    cm = tw.compile(m, (torch.randn(2, 7, 9, 5),), ({0: n},))
    for batch in (1, 3):
        x = torch.randn(batch, 7, 9, 5)
        with torch.no_grad():
            want = m(x).numpy()
        np.testing.assert_allclose(np.asarray(cm(x)), want, rtol=1e-5, atol=1e-6)
    def sigmoids(block: Block) -> int:
        return sum(isinstance(e, Intrin) and e.name == "sigmoid" for st in walk_stmts(block.body) if isinstance(st, Store) for e in walk_scalars(st.value))

    funcs = cm.executable.kernel_funcs
    (scale,) = [f for name, f in funcs.items() if "multiply" in name]
    blocks = [b for _, b in walk(scale.body) if isinstance(b, Block)]
    mult = [b for b in blocks if b.name.startswith("multiply")]
    assert mult and all(sigmoids(b) == 0 for b in mult)
    assert any(sigmoids(b) == 1 for b in blocks)
