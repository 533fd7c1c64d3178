"""The pattern language, the block matcher and the subgraph rewriter: one test per construct,
on modules written as text with symbolic dims."""

from __future__ import annotations

import pytest

from tests.transform.util import check_pass, ir
from typing import Callable

from tilework.errors import WellFormedError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Expr, Tuple
from tilework.ir.verify import verify
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar
from tilework.op import make_call
from tilework.pattern import (
    PatternMatch,
    Replacement,
    find_matches,
    graphs_of,
    is_const,
    is_item,
    is_op,
    is_tuple,
    is_var,
    match_at,
    op_call,
    rewrite_blocks,
    rewrite_subgraphs,
    wildcard,
)
from tilework.transform.pipeline import FunctionPass
from tilework.transform.rewrite_driver import Rule, apply_rules

MLP = """
@graph
def main(x: Tensor((n, 16), "float32"), w: Tensor((16, 8), "float32"), b: Tensor((8,), "float32")):
    n = sym(lo=1, hi=4096)
    with dataflow():
        mm = matmul(x, w)
        y = add(mm, b)
        r = relu(y)
        gv = multiply(r, mm)
        output(gv)
    return gv
"""


def roots(pattern: object, mod: IRModule) -> list[str]:
    return [m.root_binding.var.name for m in find_matches(pattern, mod)]  # type: ignore[arg-type]


def only(pattern: object, mod: IRModule) -> PatternMatch:
    ms = find_matches(pattern, mod)  # type: ignore[arg-type]
    assert len(ms) == 1, [m.root_binding.var.name for m in ms]
    return ms[0]


# -- leaves and op patterns ------------------------------------------------------------------


def test_op_pattern_looks_through_bindings_and_reports_bindings_inputs_outputs() -> None:
    mod = ir(MLP)
    m = only(is_op("add", is_op("matmul", wildcard("a"), wildcard("w")), wildcard("b")), mod)
    assert [b.var.name for b in m.bindings] == ["mm", "y"]
    assert [e.name for e in m.inputs] == ["x", "w", "b"]  # type: ignore[attr-defined]
    # mm is also read by the multiply outside the match, so it is an output too
    assert [v.name for v in m.outputs] == ["mm", "y"]
    assert not m.is_closed()
    assert m["a"].name == "x" and m.info("w").shape == (16, 8)  # type: ignore[attr-defined]


def test_argument_counts_and_op_sets() -> None:
    mod = ir(MLP)
    assert roots(is_op("relu", wildcard()), mod) == ["r"]
    assert roots(is_op("relu", wildcard(), wildcard()), mod) == []
    assert roots(op_call(("relu", "multiply")), mod) == ["r", "gv"]
    assert roots(op_call(None), mod) == ["mm", "y", "r", "gv"]


def test_var_and_const_leaves() -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n,), "float32")):
            n = sym()
            with dataflow():
                a = add(x, const(2.0, "float32"))
                b = add(a, x)
                output(b)
            return b
        """
    )
    assert roots(is_op("add", wildcard(), is_const("c")), mod) == ["a"]
    # is_var does not look through: `a` is bound in the block, `x` is a parameter
    assert roots(is_op("add", is_var(), is_var()), mod) == []
    assert roots(is_op("add", wildcard(), is_var(var_name="x")), mod) == ["b"]


def test_tuples_and_items() -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n, 4), "float32")):
            n = sym()
            with dataflow():
                parts = split(x, indices_or_sections=2, axis=1)
                first = parts[0]
                y = relu(first)
                output(y)
            return y
        """
    )
    m = only(is_op("relu", is_item(op_call("split"), index=0)), mod)
    assert [b.var.name for b in m.bindings] == ["parts", "first", "y"]
    assert roots(is_op("relu", is_item(index=1)), mod) == []
    assert roots(is_tuple(any_fields=True), mod) == []


def test_a_var_of_another_block_is_a_leaf() -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n,), "float32")):
            n = sym()
            with dataflow():
                e = exp(x)
                output(e)
            with dataflow():
                r = relu(e)
                output(r)
            return r
        """
    )
    assert roots(is_op("relu", is_op("exp", wildcard())), mod) == []
    assert roots(is_op("relu", is_var("v")), mod) == ["r"]
    assert len(graphs_of("main", mod["main"])) == 2  # type: ignore[arg-type]


# -- predicates ----------------------------------------------------------------------------------

SHAPES = """
@graph
def main(a: Tensor((n, 12), "float32"), b: Tensor((n, 4 * n), "float16"), c: Tensor((2, 3), "float32")):
    n = sym(lo=1, hi=64)
    with dataflow():
        ra = relu(a)
        rb = relu(b)
        rc = relu(c)
        sm = softmax(a, axis=0)
        output(ra, rb, rc, sm)
    return (ra, rb, rc, sm)
"""


def test_dtype_rank_and_shape_predicates() -> None:
    mod = ir(SHAPES)
    relu = op_call("relu")
    assert roots(relu.has_dtype("float32"), mod) == ["ra", "rc"]
    assert roots(relu.has_dtype("float16", "float64"), mod) == ["rb"]
    assert roots(relu.has_rank(2), mod) == ["ra", "rb", "rc"]
    assert roots(relu.has_rank(3), mod) == []
    n = SymVar("n")  # a different var object with the same name does not prove equal
    assert roots(relu.has_shape((None, 12)), mod) == ["ra"]
    assert roots(relu.has_shape((2, 3)), mod) == ["rc"]
    assert roots(relu.has_shape((n, 12)), mod) == []


def test_symbolic_dim_predicates_hold_for_every_value() -> None:
    mod = ir(SHAPES)
    relu = op_call("relu")
    assert roots(relu.static_shape(), mod) == ["rc"]
    assert roots(relu.dim(-1, static=True, divisible_by=4), mod) == ["ra"]
    # 4 * n is divisible by 4 for every n, but not static
    assert roots(relu.dim(-1, divisible_by=4), mod) == ["ra", "rb"]
    assert roots(relu.dim(-1, divisible_by=8), mod) == []
    assert roots(relu.dim(0, static=False, at_most=64), mod) == ["ra", "rb"]
    assert roots(relu.dim(0, at_most=32), mod) == ["rc"]
    assert roots(relu.dim(1, at_least=3), mod) == ["ra", "rb", "rc"]
    assert roots(relu.dim(5), mod) == []  # no such axis


def test_attribute_predicates() -> None:
    mod = ir(SHAPES)
    assert roots(op_call("softmax").has_attr(axis=0), mod) == ["sm"]
    assert roots(op_call("softmax").has_attr(axis=-1), mod) == []
    assert roots(op_call("softmax").attr_where("axis", lambda a: a >= 0), mod) == ["sm"]
    assert roots(op_call("relu").has_attr(axis=0), mod) == []


def test_where_sees_the_call() -> None:
    mod = ir(SHAPES)
    p = op_call(None).where(lambda call, m: call.args[0].name == "c")  # type: ignore[attr-defined]
    assert roots(p, mod) == ["rc"]


# -- combinators -------------------------------------------------------------------------------


def test_alternation_takes_the_first_that_matches_with_its_captures() -> None:
    mod = ir(MLP)
    mm = is_op("matmul", wildcard("x"), wildcard("w"))
    either = is_op("add", mm, wildcard("bias")) | is_op("add", wildcard("bias"), mm)
    m = only(either, mod)
    assert m["bias"].name == "b" and m["x"].name == "x"  # type: ignore[attr-defined]
    # a failed alternative leaves no captures and no bindings behind
    p = is_op("multiply", is_op("relu", is_op("exp", wildcard("z"))), wildcard()) | is_op("multiply", wildcard("r"), wildcard())
    m = only(p, mod)
    assert set(m.captures) == {"r"} and [b.var.name for b in m.bindings] == ["gv"]


def test_conjunction_and_negation() -> None:
    mod = ir(SHAPES)
    relu = op_call("relu")
    assert roots(relu.has_dtype("float32") & relu.has_rank(2) & ~relu.static_shape(), mod) == ["ra"]
    assert roots(~op_call("relu"), mod) == ["sm"]


def test_a_name_captured_twice_must_see_the_same_node() -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n,), "float32"), y: Tensor((n,), "float32")):
            n = sym()
            with dataflow():
                a = multiply(x, x)
                b = multiply(x, y)
                output(a, b)
            return (a, b)
        """
    )
    assert roots(is_op("multiply", wildcard("v"), wildcard("v")), mod) == ["a"]


# -- use constraints ----------------------------------------------------------------------------


def test_single_use_and_only_used_by() -> None:
    mod = ir(MLP)
    # mm is read by the add and by the multiply
    assert roots(is_op("add", is_op("matmul", wildcard(), wildcard()).single_use(), wildcard()), mod) == []
    assert roots(is_op("relu", op_call("add").single_use()), mod) == ["r"]
    assert roots(op_call("matmul").only_used_by(op_call(("add", "multiply"))), mod) == ["mm"]
    assert roots(op_call("matmul").only_used_by(op_call("add")), mod) == []
    assert roots(op_call("matmul").used_by(op_call("add")), mod) == ["mm"]
    assert roots(op_call("matmul").used_by(op_call("add"), index=1), mod) == []
    assert roots(op_call("matmul").used_by(op_call("add"), index=0), mod) == ["mm"]


def test_an_escaping_var_is_never_only_used_inside() -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n,), "float32")):
            n = sym()
            with dataflow():
                e = exp(x)
                r = relu(e)
                output(e, r)
            return (e, r)
        """
    )
    assert roots(op_call("exp").only_used_by(op_call("relu")), mod) == []
    assert roots(op_call("exp").single_use(), mod) == []
    assert roots(op_call("exp").used_by(op_call("relu")), mod) == ["e"]


def test_use_constraints_never_hold_under_the_streaming_driver() -> None:
    mod = ir(MLP)
    hits: list[str] = []

    def note(value: Expr, m: object) -> None:
        hits.append("x")
        return None

    apply_rules(mod, [Rule("u", op_call("matmul").used_by(op_call("add")), note)])  # type: ignore[arg-type]
    apply_rules(mod, [Rule("p", op_call("matmul").has_rank(2), note)])  # type: ignore[arg-type]
    assert hits == ["x"]


# -- rewriting ----------------------------------------------------------------------------------


def test_patterns_serve_the_rewrite_driver() -> None:
    before = """
    @graph
    def main(x: Tensor((n,), "float32")):
        n = sym()
        with dataflow():
            a = exp(x)
            b = log(a)
            gv = add(b, x)
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n,), "float32")):
        n = sym()
        with dataflow():
            a = exp(x)
            gv = add(x, x)
            output(gv)
        return gv
    """
    rule = Rule("log_exp", is_op("log", is_op("exp", wildcard("x"))).has_dtype("float32"), lambda v, m: m["x"])
    check_pass(FunctionPass(lambda mod: apply_rules(mod, [rule]), name="rules"), before, expected)


def _bias_add_to_linear(m: PatternMatch) -> Expr:
    weight_t = make_call("permute_dims", [m["w"]], axes=None)
    return make_call("linear", [m["x"], weight_t, m["b"]])


BIAS_ADD = is_op("add", is_op("matmul", wildcard("x"), wildcard("w")), wildcard("b").has_rank(1))


def test_rewrite_subgraphs_replaces_the_root_and_drops_what_only_it_read() -> None:
    before = """
    @graph
    def main(x: Tensor((n, 16), "float32"), w: Tensor((16, 8), "float32"), b: Tensor((8,), "float32")):
        n = sym(lo=1)
        with dataflow():
            mm = matmul(x, w)
            y = add(mm, b)
            gv = relu(y)
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n, 16), "float32"), w: Tensor((16, 8), "float32"), b: Tensor((8,), "float32")):
        n = sym(lo=1)
        with dataflow():
            wt = permute_dims(w, axes=None)
            y = linear(x, wt, b)
            gv = relu(y)
            output(gv)
        return gv
    """
    check_pass(FunctionPass(lambda mod: rewrite_subgraphs(mod, [(BIAS_ADD, _bias_add_to_linear)]), name="bias"), before, expected)


def test_rewrite_subgraphs_keeps_interior_bindings_read_elsewhere() -> None:
    expected = """
    @graph
    def main(x: Tensor((n, 16), "float32"), w: Tensor((16, 8), "float32"), b: Tensor((8,), "float32")):
        n = sym(lo=1, hi=4096)
        with dataflow():
            mm = matmul(x, w)
            wt = permute_dims(w, axes=None)
            y = linear(x, wt, b)
            r = relu(y)
            gv = multiply(r, mm)
            output(gv)
        return gv
    """
    check_pass(FunctionPass(lambda mod: rewrite_subgraphs(mod, [(BIAS_ADD, _bias_add_to_linear)]), name="bias"), MLP, expected)


def test_earlier_rules_win_and_declined_matches_change_nothing() -> None:
    mod = ir(MLP)
    seen: list[str] = []

    def decline(m: PatternMatch) -> None:
        seen.append(m.root_binding.var.name)
        return None

    out = rewrite_subgraphs(mod, [(op_call("relu"), decline)])
    assert seen == ["r"] and out is mod
    out = rewrite_subgraphs(mod, [(op_call("relu"), lambda m: make_call("sigmoid", [m.root_call.args[0]])), (op_call("relu"), decline)])  # type: ignore[union-attr]
    assert seen == ["r"]
    assert "sigmoid" in str(out) and "relu" not in str(out)


def test_more_rounds_rewrite_results_again() -> None:
    mod = ir(MLP)
    rules = [(op_call("relu"), lambda m: make_call("sigmoid", [m.root_call.args[0]])), (op_call("sigmoid"), lambda m: make_call("tanh", [m.root_call.args[0]]))]  # type: ignore[union-attr]
    assert "sigmoid" in str(rewrite_subgraphs(mod, rules))
    assert "tanh" in str(rewrite_subgraphs(mod, rules, max_rounds=3))


def test_rewrite_blocks_reorders_around_a_replaced_set() -> None:
    before = ir(
        """
        @graph
        def main(x: Tensor((n,), "float32")):
            n = sym()
            with dataflow():
                a = exp(x)
                side = neg(a)
                b = tanh(a)
                c = add(side, b)
                output(c)
            return c
        """
    )
    g = graphs_of("main", before["main"])[0]  # type: ignore[arg-type]
    a, b = g.bindings[0].var, g.bindings[2].var

    def both(remap: Callable[[Expr], Expr], bb: BlockBuilder) -> Expr:
        e = bb.emit(make_call("exp", [remap(g.bindings[0].value.args[0])]))  # type: ignore[attr-defined]
        return Tuple((e, make_call("tanh", [e])))

    # {a, b} becomes one value providing both; `side` reads a, so it must now come after it
    out = rewrite_blocks(before, lambda graph: [Replacement((0, 2), (a, b), both, "ab")])
    verify(out)
    names = [bb.var.name for bb in out["main"].body.blocks[0].bindings]  # type: ignore[union-attr]
    assert names.index("side") > names.index("a") and names[-1] == "c"


def test_rewrite_blocks_refuses_cycles_and_dangling_outputs() -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n,), "float32")):
            n = sym()
            with dataflow():
                a = exp(x)
                b = neg(a)
                c = add(a, b)
                output(c)
            return c
        """
    )
    g = graphs_of("main", mod["main"])[0]  # type: ignore[arg-type]
    a, c = g.bindings[0].var, g.bindings[2].var
    # {a, c} is not convex: a -> b -> c leaves and re-enters it
    cyclic = Replacement((0, 2), (a, c), lambda remap, bb: remap(g.bindings[2].value), "ac")
    with pytest.raises(WellFormedError, match="cycle"):
        rewrite_blocks(mod, lambda graph: [cyclic])
    dangling = Replacement((0,), (), lambda remap, bb: remap(g.bindings[0].value), "a")
    with pytest.raises(WellFormedError, match="list it among the outputs"):
        rewrite_blocks(mod, lambda graph: [dangling])


def test_match_at_only_roots_plain_bindings() -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor(ndim=1, dtype="float32")):
            m = sym()
            with dataflow():
                y = match_cast(x, Tensor((m,), "float32"))
                z = relu(y)
                output(z)
            return z
        """
    )
    g = graphs_of("main", mod["main"])[0]  # type: ignore[arg-type]
    assert match_at(wildcard(), g, 0) is None
    m = match_at(is_op("relu", wildcard("v")), g, 1)
    assert m is not None and m.indices == (1,) and m["v"].name == "y"  # type: ignore[attr-defined]
