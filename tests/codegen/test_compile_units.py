"""A large kernel library is compiled in translation units (``CModule.units``), in parallel, and
linked: the kernels are the same as from one translation unit (bit for bit), each unit's object
is cached on its own (a kernel compiled for one library is not compiled again for another) and
trusted no more than a library (a damaged object is set aside and rebuilt); a compile error
still names the kernel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilework as tw
from tests.transform.util import ir
from tilework import te
from tilework.codegen import build_library
from tilework.codegen.c import emit, toolchain
from tilework.codegen.cache import CacheWarning
from tilework.errors import BuildError
from tilework.ir.loop import TensorFunc

# a linear layer with a gelu epilogue (the matmul schedule's row-count branches), a layer norm
# and a softmax: symbolic rows, several kernels
MLP = """
@graph
def main(x: Tensor((b, s, 48), "float32"), w: Tensor((48, 40), "float32"), g: Tensor((40,), "float32")):
    b = sym(lo=0, hi=8)
    s = sym(lo=0, hi=64)
    with dataflow():
        h = matmul(x, w)
        a = gelu(h)
        n = layer_norm(a, g, g, axes=[-1])
        p = softmax(n, axis=2)
        output(p)
    return p
"""


def _scaled(scale: float, name: str = "x") -> TensorFunc:
    n = tw.dim("n")
    x = te.placeholder((n,), "float32", name)
    out = te.compute((n,), lambda i: x[i] * scale + 1.0, "out")
    return te.create_func([x, out])


def _units(cc_log: Path) -> list[str]:
    lines = cc_log.read_text().splitlines() if cc_log.exists() else []
    return [ln for ln in lines if " -c " in f" {ln} "]


def test_units_link_the_same_kernels_as_one_translation_unit(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emit, "UNIT_CHARS", 10**9)
    whole = tw.build(ir(MLP))
    assert len(emit.emit_module(whole.kernel_funcs).units) == 0
    monkeypatch.setattr(emit, "UNIT_CHARS", 1)  # every kernel a unit of its own
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(cache.parent / "other"))  # not the library above
    parts = tw.build(ir(MLP))
    mod = emit.emit_module(parts.kernel_funcs)
    assert len(mod.units) == len(parts.kernel_funcs) + 1 >= 3  # the prelude's unit holds the trampoline
    assert parts.modules[0].path != whole.modules[0].path  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    w, g = rng.standard_normal((48, 40), np.float32), rng.standard_normal(40).astype(np.float32)
    f, h = tw.VM(whole)["main"], tw.VM(parts)["main"]
    for b, s in [(1, 1), (1, 3), (2, 7), (3, 8), (2, 37)]:
        x = rng.standard_normal((b, s, 48)).astype(np.float32)
        want, got = np.asarray(f(x, w, g)), np.asarray(h(x, w, g))
        assert np.array_equal(want, got), (b, s)


def test_a_unit_compiled_for_one_library_serves_another(cache: Path, cc_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emit, "UNIT_CHARS", 1)
    monkeypatch.setenv("TILEWORK_COMPILE_JOBS", "2")
    first = build_library({"a": _scaled(2.0), "b": _scaled(3.0)})
    assert not first.cache_hit and len(_units(cc_log)) == 3  # the prelude's unit and two kernels
    second = build_library({"a": _scaled(2.0), "c": _scaled(5.0)})  # "a" as before, "c" new
    assert not second.cache_hit
    assert len(_units(cc_log)) == 3 + 1  # only "c" compiled
    for lib, name, scale in [(first, "b", 3.0), (second, "a", 2.0), (second, "c", 5.0)]:
        x, out = np.arange(6, dtype=np.float32), np.zeros(6, np.float32)
        lib[name].run([x, out])
        np.testing.assert_array_equal(out, x * np.float32(scale) + 1)
    assert len(list(cache.glob("o-*.o"))) == 4
    assert build_library({"a": _scaled(2.0), "c": _scaled(5.0)}).cache_hit


def test_a_damaged_unit_object_is_set_aside_and_rebuilt(cache: Path, cc_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emit, "UNIT_CHARS", 1)
    build_library({"a": _scaled(2.0), "b": _scaled(3.0)})
    for obj in cache.glob("o-*.o"):
        obj.write_bytes(obj.read_bytes()[:100])  # truncated
    with pytest.warns(CacheWarning, match="SHA-256"):
        lib = build_library({"a": _scaled(2.0), "d": _scaled(7.0)})
    x, out = np.arange(6, dtype=np.float32), np.zeros(6, np.float32)
    lib["a"].run([x, out])
    np.testing.assert_array_equal(out, x * np.float32(2.0) + 1)
    assert len(_units(cc_log)) == 3 + 3
    assert list((cache / "bad").iterdir())


def test_a_compile_error_in_a_unit_names_the_kernel(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emit, "UNIT_CHARS", 1)
    real = emit.emit_function

    def broken(func: TensorFunc, symbol: str, name: str | None = None) -> str:
        text = real(func, symbol, name)
        return text.replace("return tw_err;", "return undeclared_thing;") if name == "bad" else text

    monkeypatch.setattr(emit, "emit_function", broken)
    with pytest.raises(BuildError, match=r"(?s)undeclared_thing.*in kernel bad"):
        build_library({"good": _scaled(2.0), "bad": _scaled(3.0)})


def test_compile_jobs_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TILEWORK_COMPILE_JOBS", "3")
    assert toolchain.compile_jobs() == 3
    monkeypatch.setenv("TILEWORK_COMPILE_JOBS", "0")
    with pytest.raises(BuildError, match="TILEWORK_COMPILE_JOBS"):
        toolchain.compile_jobs()
    monkeypatch.delenv("TILEWORK_COMPILE_JOBS")
    assert toolchain.compile_jobs() >= 1


def test_only_units_whose_kernels_use_intrinsics_parse_them(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``TW_NO_INTRINSICS`` (immintrin.h left out: most of a unit's parse time) heads every unit
    and library none of whose kernels tests ``TW_DOT_BF16``; a unit with a ``dot_bf16x2``
    loop keeps the intrinsics, and its kernel computes what it does in one translation unit."""
    from tests.codegen.test_handbuilt import _dot_func
    from tilework.ir.dtype import np_dtype

    flag = "#define TW_NO_INTRINSICS 1\n"
    assert flag in emit.emit_module({"a": _scaled(2.0), "b": _scaled(3.0)}).text
    funcs = {"a": _scaled(2.0), "dot": _dot_func(form="rows")}
    assert flag not in emit.emit_module(funcs).text
    monkeypatch.setattr(emit, "UNIT_CHARS", 1)
    mod = emit.emit_module(funcs)
    prelude, a, dot = mod.units
    assert flag in prelude.text and flag in a.text and flag not in dot.text and "TW_DOT_BF16" in dot.text
    rng = np.random.default_rng(3)
    given = rng.standard_normal((3, 5, 2, 32)).astype(np.float32).astype(np_dtype("bfloat16"))
    b = rng.standard_normal((5, 2)).astype(np_dtype("bfloat16"))
    start = rng.standard_normal((3, 32)).astype(np.float32)
    outs = []
    for chars in (1, 10**9):
        monkeypatch.setattr(emit, "UNIT_CHARS", chars)
        out = start.copy()
        build_library(funcs)["dot"].run([given, b, out])
        outs.append(out)
    assert np.array_equal(outs[0], outs[1])


def test_a_unit_adds_its_own_flags_after_the_librarys(cache: Path, cc_log: Path) -> None:
    """``CUnit.flags`` follow the library's flags on that unit's command alone (the native graph
    code's ``-O1``) and are part of its object's key: the same text with other flags compiles
    again, and with the same flags is found in the cache."""
    one = "int tw_unit_one(void) { return 1; }\n"
    two = "int tw_unit_two(void) { return 2; }\n"

    def build(flags: tuple[str, ...]) -> None:
        toolchain.compile_source(one + two + str(flags), units=[emit.CUnit(one, {}), emit.CUnit(two, {}, flags)])

    build(("-O1",))
    first = _units(cc_log)
    assert len(first) == 2 and sum(" -O1 " in f" {ln} " for ln in first) == 1
    flagged = next(ln.split() for ln in first if " -O1 " in f" {ln} ")
    assert flagged[flagged.index("-c") - 1] == "-O1"  # after every flag of the library's
    build(("-O2",))
    assert len(_units(cc_log)) == 3  # only the unit whose flags changed
    build(("-O1",))
    assert len(_units(cc_log)) == 3
