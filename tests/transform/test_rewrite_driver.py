"""The rewrite driver: rules as data, patterns that look through bindings, results that
compose, aliases inlined, loops bounded; and the before/after helper itself."""

from __future__ import annotations

import pytest

from tests.transform.util import check_pass, ir
from tilework.ir.graph import Call, Expr
from tilework.op import make_call
from tilework.transform.pipeline import FunctionPass
from tilework.pattern import AnyOf, Match, is_const, is_op, op_call, wildcard
from tilework.transform.rewrite_driver import Rule, apply_rules

LOG_EXP = Rule("log_exp", is_op("log", is_op("exp", wildcard("x"))), lambda v, m: m["x"])
SQUARE = Rule("square", is_op("square", wildcard("x")), lambda v, m: make_call("multiply", [make_call("log", [make_call("exp", [m["x"]])]), m["x"]]))


def rules_pass(*rules: Rule) -> FunctionPass:
    return FunctionPass(lambda mod: apply_rules(mod, rules), name="rules")


def test_patterns_look_through_bindings_and_aliases_are_inlined() -> None:
    before = """
    @graph
    def main(x: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym(lo=1)
        with dataflow():
            a = exp(x)
            b = log(a)
            gv = add(b, x)
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym(lo=1)
        with dataflow():
            a = exp(x)
            gv = add(x, x)
            output(gv)
        return gv
    """
    check_pass(rules_pass(LOG_EXP), before, expected)


def test_nested_results_are_bound_and_rewritten_in_turn() -> None:
    before = """
    @graph
    def main(x: Tensor((n,), "float32")):
        n = sym()
        with dataflow():
            gv = square(x)
            output(gv)
        return gv
    """
    # square -> multiply(log(exp(x)), x); exp(x) is bound first, then log(exp(x)) is x
    expected = """
    @graph
    def main(x: Tensor((n,), "float32")):
        n = sym()
        with dataflow():
            lv = exp(x)
            gv = multiply(x, x)
            output(gv)
        return gv
    """
    check_pass(rules_pass(SQUARE, LOG_EXP), before, expected)


def test_captures_must_agree_and_alternatives_are_tried_in_order() -> None:
    def to_square(value: Expr, m: Match) -> Expr:
        return make_call("square", [m["x"]])

    same_args = Rule("mul_self", is_op("multiply", wildcard("x"), wildcard("x")), to_square)
    const_first = Rule("const_first", is_op("add", is_const("c"), wildcard("y")) | is_op("add", wildcard("y"), is_const("c")), lambda v, m: make_call("subtract", [m["y"], m["c"]]))
    assert isinstance(const_first.pattern, AnyOf)
    before = """
    @graph
    def main(x: Tensor((2,), "float32"), y: Tensor((2,), "float32")):
        with dataflow():
            a = multiply(x, x)
            b = multiply(x, y)
            c = const([1.0, 2.0], "float32")
            d = add(c, y)
            e = add(x, c)
            gv = (a, b, d, e)
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((2,), "float32"), y: Tensor((2,), "float32")):
        with dataflow():
            a = square(x)
            b = multiply(x, y)
            c = const([1.0, 2.0], "float32")
            d = subtract(y, c)
            e = subtract(x, c)
            gv = (a, b, d, e)
            output(gv)
        return gv
    """
    check_pass(rules_pass(same_args, const_first), before, expected)


def test_a_rule_that_never_settles_stops_after_max_steps() -> None:
    calls: list[int] = []

    def swap(value: Expr, m: Match) -> Expr:
        calls.append(1)
        assert isinstance(value, Call)
        return make_call("add", [value.args[1], value.args[0]])

    mod = ir(
        """
        @graph
        def main(x: Tensor((2,), "float32"), y: Tensor((2,), "float32")):
            a = add(x, y)
            return a
        """
    )
    apply_rules(mod, [Rule("swap", op_call("add"), swap)], max_steps=5)
    assert len(calls) == 5


def test_check_pass_reports_a_difference() -> None:
    text = """
    @graph
    def main(x: Tensor((n,), "float32")):
        n = sym()
        a = exp(x)
        return a
    """
    with pytest.raises(AssertionError, match="diff of the printed IR"):
        check_pass(rules_pass(), text, text.replace("exp(x)", "log(x)"))
