"""Properties of the generated C text: the entry signature, names, literals, line ranges."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tilework import te
from tilework.codegen import interp
from tilework.codegen.c import c_symbols, emit_module
from tilework.errors import WellFormedError
from tilework.ir.loop import Buffer, For, Load, Store, TensorFunc, const
from tilework.ir.sym import SymVar


def _neg() -> TensorFunc:
    n = tw.dim("n")
    A = te.placeholder((n,), "float32", "A")
    return te.create_func([A, te.compute((n,), lambda i: -A[i] * 0.1 + float("inf"), "int")])


def test_entry_signature_qualifiers_and_literals() -> None:
    mod = emit_module({"neg.v2": _neg()})
    assert mod.symbols == {"neg.v2": "tw_neg_v2"}
    text = mod.text
    assert "int32_t tw_neg_v2(void* const* restrict tw_data, const int64_t* restrict tw_syms) {" in text
    assert "const float* restrict A = (const float*)tw_data[0];" in text
    assert "float* restrict v_int = (float*)tw_data[1];" in text  # a C keyword is renamed
    assert "const int64_t n = tw_syms[0];" in text
    assert "0.10000000149011612f" in text and "INFINITY" in text


def test_line_ranges_cover_each_kernel() -> None:
    mod = emit_module({"a": _neg(), "b": _neg()})
    lines = mod.text.splitlines()
    for name, (lo, hi) in mod.lines.items():
        assert lines[lo - 1] == f"/* kernel {name} */"
        assert lines[lo].startswith(f"int32_t {mod.symbols[name]}(")
        assert lines[hi - 1] == "}"


def test_symbols_avoid_prelude_helpers_and_each_other() -> None:
    syms = c_symbols(["floordiv", "a-b", "a_b", "alloc"])
    assert syms == {"floordiv": "tw_floordiv_1", "a-b": "tw_a_b", "a_b": "tw_a_b_1", "alloc": "tw_alloc_1"}


def test_unbound_var_is_reported() -> None:
    out = Buffer("out", (4,), "float32")
    i, stray = SymVar("i", 0), SymVar("stray", 0)
    f = TensorFunc((out,), For(i, 4, Store(out, (stray,), const(1.0, "float32"))), 1)
    with pytest.raises(WellFormedError, match="sym var stray is used outside"):
        emit_module({"f": f})
    with pytest.raises(WellFormedError, match="sym var stray is used outside"):
        interp.run(f, [np.zeros(4, np.float32)])


def test_interp_rejects_negative_index() -> None:
    n = tw.dim("n")
    A = te.placeholder((n,), "float32", "A")
    f = te.create_func([A, te.compute((n,), lambda i: A[i - 1], "B")])
    with pytest.raises(IndexError, match="index -1 is out of range"):
        interp.run(f, [np.zeros(3, np.float32), np.zeros(3, np.float32)])


def test_load_of_unknown_buffer_is_reported() -> None:
    out, ghost = Buffer("out", (4,), "float32"), Buffer("ghost", (4,), "float32")
    i = SymVar("i", 0)
    f = TensorFunc((out,), For(i, 4, Store(out, (i,), Load(ghost, (i,)))), 1)
    with pytest.raises(WellFormedError, match="ghost, which is neither a param nor allocated"):
        emit_module({"f": f})
