"""The quant backend's library as a whole: refusals of bad arguments (the Python wrapper, the
extern, the C entry points, the VM's checks) with clear errors, the build in the background and
its priority, and builds holding only the paths a model's formats need (``families``). The
kernels' numerics are ``test_quant.py``'s."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import tilework
from tests.backend.helpers import module
from tests.backend.test_quant import blocks
from tilework import op
from tilework.backend import quant as Q
from tilework.errors import RuntimeCheckError, TileworkError
from tilework.ir.sym import SymVar

pytest.importorskip("gguf")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(11)


# -- refusals ------------------------------------------------------------------------------------


def test_bad_arguments_raise_clear_errors(rng: np.random.Generator) -> None:
    b, _ = blocks(rng, "q4_1", 4, 64)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    with pytest.raises(RuntimeCheckError, match="unknown format"):
        Q.qlinear(x, b, "iq2_xxs")
    with pytest.raises(RuntimeCheckError, match="float32"):
        Q.qlinear(x.astype(np.float64), b, "q4_1")
    with pytest.raises(RuntimeCheckError, match="row_bytes|take 40 bytes"):
        Q.qlinear(x, b[:, :20], "q4_1")
    with pytest.raises(RuntimeCheckError, match="not a multiple"):
        Q.qlinear(rng.standard_normal((2, 48)).astype(np.float32), b, "q4_1")
    with pytest.raises(RuntimeCheckError, match="out must be"):
        Q.qlinear(x, b, "q4_1", out=np.empty((2, 5), np.float32))
    # the extern reports the library's refusal instead of crashing
    extern = tilework.runtime.extern.lookup_extern("quant.linear.q4_1")
    assert extern is not None
    with pytest.raises(RuntimeCheckError, match="not a multiple of the format's block"):
        extern(x, b, (2, 4, 63), np.empty((2, 4), np.float32))
    # the C entry points check their arguments
    fn = Q.library().entries["q4_1"]
    y = np.empty((2, 4), np.float32)
    assert fn(None, b.ctypes.data, y.ctypes.data, 2, 4, 64) == 1
    assert fn(x.ctypes.data, b.ctypes.data, y.ctypes.data, 2, 4, 48) == 2
    assert fn(x.ctypes.data, b.ctypes.data, y.ctypes.data, -1, 4, 64) == 2
    block = (ctypes.c_int64 * 9)(99, id(x), id(b), id(y), 2, 4, 64, 0, 0)
    assert Q.library().packed(ctypes.addressof(block)) == 3


def test_the_vm_checks_arguments_before_the_library_runs(rng: np.random.Generator) -> None:
    b, _ = blocks(rng, "q8_0", 4, 64)
    mod = module([("x", (SymVar("n", 1), 64), "float32"), ("w", b.shape, "uint8")], lambda x, w: op.quant_linear(x, w, "q8_0", 64))
    main = tilework.VM(tilework.build(mod, backends=["quant", "codegen"]))["main"]
    with pytest.raises(RuntimeCheckError):
        main(rng.standard_normal((2, 32)).astype(np.float32), b)
    with pytest.raises(RuntimeCheckError):
        main(rng.standard_normal((2, 64)), b)
    with pytest.raises(RuntimeCheckError):
        main(rng.standard_normal((2, 64)).astype(np.float32), b[:3])


def _join_background() -> None:
    for t in list(Q._BACKGROUND.values()):
        t.join()


def test_library_in_background_is_the_library_later_calls_get(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Q, "_LIBS", {})
    monkeypatch.setattr(Q, "_BACKGROUND", {})
    Q.library_in_background()
    _join_background()
    built = Q._LIBS[(False, True, True, Q.FAMILIES)]
    assert Q.library() is built
    Q.library_in_background()  # once per process: nothing more starts
    assert Q.library() is built


def test_a_failed_background_build_is_reported_by_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    from tilework.errors import BuildError

    calls = []

    def failing(*key: bool) -> None:
        calls.append(key)
        raise BuildError("C compilation failed: no compiler here")

    monkeypatch.setattr(Q, "_LIBS", {})
    monkeypatch.setattr(Q, "_BACKGROUND", {})
    monkeypatch.setattr(Q, "_load", failing)
    Q.library_in_background()
    _join_background()
    assert calls == [(False, True, True, Q.FAMILIES)]  # tried, and nothing raised in the thread
    with pytest.raises(BuildError, match="no compiler here"):
        Q.library()  # the caller's own call tries again and reports it
    assert len(calls) == 2


def test_library_if_built_neither_compiles_nor_waits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``library_if_built`` is the library where it is loaded or the kernel cache has it, and
    None where it would have to be compiled (a first start's loaders decode in NumPy meanwhile),
    with nothing compiled for the asking."""
    built = Q.library()  # in the kernel cache now
    monkeypatch.setattr(Q, "_LIBS", {})
    loaded = Q.library_if_built()
    assert loaded is not None and loaded.path == built.path
    monkeypatch.setattr(Q, "_LIBS", {})
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(tmp_path / "empty"))

    def compiling(*key: bool) -> None:
        raise AssertionError("library_if_built compiled the library")

    monkeypatch.setattr(Q, "_load", compiling)
    assert Q.library_if_built() is None
    # asked again (a loader asks once a tensor: 121 times for SmolLM2), no source is hashed again
    from tilework.codegen.c import toolchain

    keys: list[str] = []
    real = toolchain.cache_key
    def counted(source: str, *rest: object) -> str:
        keys.append(source)
        return real(source, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(toolchain, "cache_key", counted)
    Q.library_if_built()
    keys.clear()
    Q.library_if_built()
    assert keys == []


def test_a_path_asked_for_while_the_models_build_is_on_its_way_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model's first start builds its formats' paths in the background and then asks for
    each format's (``library_for``): those calls wait for that build and get it, nothing is
    compiled twice; a path it does not hold is built on its own."""
    import threading
    import time

    built = Q.library()
    started, release, loads = threading.Event(), threading.Event(), []

    def loading(portable: bool, vnni: bool, bf16dot: bool, families: tuple[str, ...]) -> Q.QuantLibrary:
        loads.append(families)
        if len(loads) == 1:
            started.set()
            release.wait(10)
        return built

    monkeypatch.setattr(Q, "_LIBS", {})
    monkeypatch.setattr(Q, "_BUILDING", {})
    monkeypatch.setattr(Q, "_BACKGROUND", {})
    monkeypatch.setattr(Q, "_load", loading)
    Q.library_in_background(("q4_1", "q8_0"))
    assert started.wait(10)
    threading.Timer(0.2, release.set).start()
    t = time.perf_counter()
    assert Q.library_for("q8_0x16") is built and Q.library_for("q4_1") is built
    assert time.perf_counter() - t >= 0.15  # it waited for the build on its way
    assert loads == [("q4_1", "q8_0")]
    assert Q.library_for("q6_k") is built and loads == [("q4_1", "q8_0"), ("q6_k",)]
    _join_background()


def test_library_ready_says_whether_a_call_would_wait(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``library_ready``: True where a build holding the paths is loaded or in the kernel cache,
    False where ``library`` would compile (or wait for a build), with nothing compiled for the
    asking; an unknown path is a named error."""
    Q.library()  # in the kernel cache now
    assert Q.library_ready() and Q.library_ready(("q4_1",))
    monkeypatch.setattr(Q, "_LIBS", {})
    assert Q.library_ready(("q4_1",))  # the cache's build with every path serves one
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(tmp_path / "empty"))

    def compiling(*key: bool) -> None:
        raise AssertionError("library_ready compiled the library")

    monkeypatch.setattr(Q, "_load", compiling)
    assert not Q.library_ready(("q4_1",)) and not Q.library_ready()
    with pytest.raises(TileworkError, match="unknown quant library path"):
        Q.library_ready(("int4",))


# -- builds with the paths a model needs ---------------------------------------------------------


def test_a_build_with_one_path_runs_its_formats_as_the_full_one_and_refuses_the_others(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rng: np.random.Generator) -> None:
    """An LLM's first start compiles the paths its formats take (``families_of``): q4_1's
    alone gives the full library's bits and refuses another format (integer or float) with a
    named error.
    It is built as on a machine with cores to spare: GCC optimizes the one large unit in
    partitions (``toolchain._parallel_lto``), which under ``pytest -n`` no other build does
    (conftest: one compiler process a build), so these bits are also the parallel build's
    against the plain one's."""
    from tilework.codegen.c import toolchain

    full = Q.library()
    b, _ = blocks(rng, "q4_1", 32, 64)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    expected = Q.qlinear(x, b, "q4_1")
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(tmp_path))  # the full build is not in this cache
    monkeypatch.setenv("TILEWORK_COMPILE_JOBS", "2")
    monkeypatch.setattr(Q, "_LIBS", {})
    monkeypatch.setattr(Q, "_BUILDING", {})
    argvs: list[list[str]] = []
    real = toolchain._run_compiler

    def logged(argv: list[str], *rest: object) -> None:
        argvs.append(argv)
        real(argv, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(toolchain, "_run_compiler", logged)
    lib = Q.library(families=["q4_1"])
    assert lib.families == ("q4_1",) and lib.path != full.path and not lib.cache_hit
    assert [any(a.startswith("-flto=") for a in argv) for argv in argvs] == [toolchain._is_gcc(tuple(toolchain.compiler_command()))]
    assert set(lib.entries) == {"q4_1", "q4_1x16"}
    assert Q.library_for("q4_1x16") is lib
    y = np.empty((3, 32), np.float32)
    assert lib.entries["q4_1"](x.ctypes.data, b.ctypes.data, y.ctypes.data, 3, 32, 64) == 0
    np.testing.assert_array_equal(y, expected)
    block = (ctypes.c_int64 * 9)(Q.FORMATS.index("bf16"), id(x), id(b), id(y), 3, 32, 64, Q._DATA_OFFSET or 0, 0)
    assert lib.packed(ctypes.addressof(block)) == 6
    assert "not in this build" in str(Q._failure(6, "bf16", (3, 32, 64)))
    for other in ("q8_0", "q4_0x16", "q4_k"):  # every integer format's path is a path of its own
        block = (ctypes.c_int64 * 9)(Q.FORMATS.index(other), id(x), id(b), id(y), 3, 32, 64, Q._DATA_OFFSET or 0, 0)
        assert lib.packed(ctypes.addressof(block)) == 6, other
    # a build of every path, once loaded, serves any of them
    monkeypatch.setattr(Q, "_LIBS", {(False, True, True, Q.FAMILIES): full})
    assert Q.library(families=("f16",)) is full and Q.library_for("q4_1") is full


def test_the_helpers_alone_decode_and_refuse_every_linear(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rng: np.random.Generator) -> None:
    """``families=()``: what the fp32 loaders decode with (a tenth of the compile)."""
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(Q, "_LIBS", {})
    monkeypatch.setattr(Q, "_BUILDING", {})
    lib = Q.library(families=())
    assert lib.families == () and lib.entries == {}
    b, wf = blocks(rng, "q4_1", 16, 64)
    np.testing.assert_array_equal(lib.dequantize(b, "q4_1"), wf)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    y = np.empty((1, 16), np.float32)
    for fmt in ("q4_1", "bf16"):
        block = (ctypes.c_int64 * 9)(Q.FORMATS.index(fmt), id(x), id(b), id(y), 1, 16, 64, Q._DATA_OFFSET or 0, 0)
        assert lib.packed(ctypes.addressof(block)) == 6
    assert Q.library_if_built() is lib


def test_families_of_formats_and_bad_paths() -> None:
    assert Q.families_of(["q4_1x16", "q8_0x16", "f32"]) == ("q4_1", "q8_0")
    assert Q.families_of(["bf16x16", "f16", "q3_k"]) == ("q3_k", "bf16", "f16")
    assert Q.families_of(["q4_kx16", "q6_k", "iq4_xs", "q8_0", "q4_k"]) == ("q8_0", "q4_k", "q6_k", "iq4_xs")
    assert Q.families_of(["bf16", "f16"]) == ("bf16", "f16")
    assert Q.families_of(["f32"]) == ()
    one = Q.source(families=("q4_1", "q8_0"))
    assert one.startswith("#define TWQ_WITH_F16 0\n#define TWQ_WITH_BF16 0\n") and not Q.source().startswith("#define TWQ_WITH_")
    assert "#define TWQ_WITH_Q4_0 0\n" in one and "TWQ_WITH_Q4_1 0" not in one and "TWQ_WITH_Q8_0 0" not in one
    with pytest.raises(TileworkError, match="unknown quant library path.*simd"):
        Q.library(families=["simd"])


def test_bf16dot_is_known_without_building_the_library() -> None:
    assert Q.bf16dot_available() == Q.library().bf16dot


def test_entry_address_is_the_entry_point_of_the_build_holding_the_format() -> None:
    lib = Q.library_for("q4_1x16")
    assert Q.entry_address("tw_qlinear_add_q4_1x16") == ctypes.cast(lib.handle.tw_qlinear_add_q4_1x16, ctypes.c_void_p).value
    assert Q.entry_address("tw_qexperts_q4_1x16") == ctypes.cast(lib.handle.tw_qexperts_q4_1x16, ctypes.c_void_p).value
    assert Q.entry_address("tw_qlinear_iq2_xxs") is None and Q.entry_address("tw_qexperts_f32") is None and Q.entry_address("twk_matmul") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_the_background_build_steps_back_for_the_foreground(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its thread (and the compilers it starts, which inherit it) runs at a lower priority; the
    caller's thread keeps its own."""
    import threading

    from tilework.codegen.c import toolchain

    seen = []
    built = Q.library()
    monkeypatch.setenv("TILEWORK_COMPILE_JOBS", "3")
    idle = toolchain.idle_jobs()

    def loading(*key: object) -> Q.QuantLibrary:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        assert toolchain.idle_jobs() == idle - 1  # a foreground build meanwhile splits its C in fewer units
        return built

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    monkeypatch.setattr(Q, "_LIBS", {})
    monkeypatch.setattr(Q, "_BACKGROUND", {})
    monkeypatch.setattr(Q, "_load", loading)
    Q.library_in_background(("q4_1",))
    _join_background()
    assert seen == [min(before + toolchain.BACKGROUND_NICE, 19)]  # lowering one's own priority needs no privilege
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    assert toolchain.idle_jobs() == idle == 3
