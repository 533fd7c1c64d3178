"""The generated forms of ``vm_shape_func`` and ``vm_make_shape`` (``builtins.BIND``: one
Python function of the heap per instruction) compute what the generic builtins compute, for
every dim operation, at heap values including 1 and odd sizes; a zero divisor raises."""

from __future__ import annotations

import itertools

import pytest

from tilework.errors import RuntimeCheckError
from tilework.runtime import builtins as B
from tilework.runtime.memory import Memory

PROGRAMS = (
    ("mul", ("const", 1536), ("slot", 0), ("slot", 1)),
    ("add", ("mul", ("const", 1536), ("slot", 0), ("slot", 1)), ("mul", ("const", 64), ("floordiv", ("add", ("mul", ("const", 8), ("slot", 1)), ("const", 63)), ("const", 64)))),
    ("floormod", ("add", ("slot", 1), ("const", -3)), ("slot", 0)),
    ("min", ("slot", 0), ("max", ("slot", 1), ("const", 5))),
    ("slot", 2),
    ("const", -7),
)


@pytest.mark.parametrize("a, b", list(itertools.product([1, 7, 33], [1, 8, 9, 512])))
def test_generated_shape_func_and_make_shape_agree_with_the_builtins(a: int, b: int) -> None:
    slots = (2, 3, 4, 5, 6, 7)
    want = [a, b, 0, 0, 0, 0, 0, 0]
    B.shape_func(want, slots, tuple(B.compile_dim_program(p) for p in PROGRAMS))
    fn, args = B.BIND["vm_shape_func"](Memory(), [("r", 0), ("i", slots), ("i", PROGRAMS)])
    assert args == [("r", 0)]
    got = [a, b, 0, 0, 0, 0, 0, 0]
    fn(got)
    assert got == want
    codes = (1, 0, 0, 384, 1, 3, 0, 1, 1, 7)
    make, margs = B.BIND["vm_make_shape"](Memory(), [("r", 0), ("i", codes)])
    assert margs == [("r", 0)] and make(got) == B.make_shape(got, codes)


def test_a_zero_divisor_raises() -> None:
    fn, _ = B.BIND["vm_shape_func"](Memory(), [("r", 0), ("i", (1,)), ("i", (("floordiv", ("const", 8), ("slot", 0)),))])
    with pytest.raises(RuntimeCheckError, match="divides by zero"):
        fn([0, 0])


def test_malformed_codes_keep_the_generic_builtin() -> None:
    make, args = B.BIND["vm_make_shape"](Memory(), [("r", 0), ("i", (1, 0, 2, 3))])
    assert make is B.make_shape and args[1] == ("i", (1, 0, 2, 3))
    with pytest.raises(RuntimeCheckError):
        B.BIND["vm_shape_func"](Memory(), [("r", 0), ("i", (1,)), ("i", (("pow", ("slot", 0)),))])
