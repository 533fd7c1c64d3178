"""Compiling, caching and loading kernel libraries; errors when compiling is impossible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tilework as tw
from tilework import te
from tilework.codegen import CKernelModule, build_library
from tilework.codegen.c import toolchain
from tilework.errors import BuildError, RuntimeCheckError
from tilework.ir.loop import TensorFunc

ROOT = Path(__file__).resolve().parents[2]


def _axpy(scale: float = 2.0) -> TensorFunc:
    n = tw.dim("n")
    x = te.placeholder((n,), "float32", "x")
    y = te.placeholder((n,), "float32", "y")
    out = te.compute((n,), lambda i: x[i] * scale + y[i], "out")
    return te.create_func([x, y, out])


def test_second_build_is_a_cache_hit(cache: Path, cc_log: Path) -> None:
    funcs = {"axpy": _axpy(), "axpy3": _axpy(3.0)}
    first = build_library(funcs)
    second = build_library({"axpy": _axpy(), "axpy3": _axpy(3.0)})  # equal source, new objects
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert len(cc_log.read_text().splitlines()) == 1  # one invocation for both kernels, none after
    assert first.path == second.path and first.path is not None and first.path.parent == cache
    x, y, out = np.arange(5, dtype=np.float32), np.ones(5, np.float32), np.zeros(5, np.float32)
    second["axpy3"].run([x, y, out])
    np.testing.assert_allclose(out, x * 3 + 1)


def test_flags_change_the_cache_key(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_library({"axpy": _axpy()})
    monkeypatch.setenv("TILEWORK_CFLAGS", "-O1 -shared -fPIC")
    lib = build_library({"axpy": _axpy()})
    assert not lib.cache_hit
    assert len(list(cache.glob("k-*.so"))) == 2


def test_hosts_prefer_the_vector_width_the_tiles_are_sized_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The register tiles are sized for 32 zmm registers with AVX-512 (gcc's Intel tuning would
    use ymm) and 16 ymm with AVX2 (gcc's first-Zen tuning would use xmm)."""
    monkeypatch.delenv("TILEWORK_CFLAGS", raising=False)
    monkeypatch.setattr(toolchain.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(toolchain, "_machine_identity", lambda: "x86_64 Linux flags : fpu avx avx2 avx512f fma")
    assert toolchain.compiler_flags()[-1] == "-mprefer-vector-width=512"
    monkeypatch.setattr(toolchain, "_machine_identity", lambda: "x86_64 Linux flags : fpu avx avx2 fma")
    assert toolchain.compiler_flags()[-1] == "-mprefer-vector-width=256"
    monkeypatch.setattr(toolchain, "_machine_identity", lambda: "x86_64 Linux flags : fpu sse2")
    assert not any(f.startswith("-mprefer-vector-width") for f in toolchain.compiler_flags())
    monkeypatch.setattr(toolchain.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(toolchain, "_machine_identity", lambda: "aarch64 Linux Features : fp asimd")
    assert not any(f.startswith("-mprefer-vector-width") for f in toolchain.compiler_flags())
    monkeypatch.setenv("TILEWORK_CFLAGS", "-O2")
    assert toolchain.compiler_flags() == ["-O2"]


def test_missing_compiler(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/bin/cc")
    with pytest.raises(BuildError, match="apt-get install gcc") as e:
        build_library({"axpy": _axpy()})
    assert "CC='/nonexistent/bin/cc'" in str(e.value)


def test_compile_error_shows_message_and_lines(cache: Path) -> None:
    src = "int ok(void) { return 0; }\nint broken(void) {\n    return undefined_name + 1;\n}\n"
    with pytest.raises(BuildError) as e:
        toolchain.compile_source(src)
    msg = str(e.value)
    assert "undefined_name" in msg and "C compilation failed" in msg
    assert ">>    3 |     return undefined_name + 1;" in msg


def test_compile_error_names_the_kernel(cache: Path) -> None:
    src = "int a(void) { return 0; }\nint b(void) {\n    return oops;\n}\n"
    with pytest.raises(BuildError, match=r"in kernel b:[\s\S]*>>    3 \|     return oops;"):
        toolchain.compile_source(src, {"a": (1, 1), "b": (2, 4)})


def test_kernel_run_checks_arguments(cache: Path) -> None:
    lib = build_library({"axpy": _axpy()})
    k = lib["axpy"]
    x = np.zeros(4, np.float32)
    with pytest.raises(RuntimeCheckError, match=r"argument 1 \(y\) shape\[0\] = 5 but n = 4 \(n = 4, bound by argument 0 \(x\) shape\[0\]\)"):
        k.run([x, np.zeros(5, np.float32), np.zeros(4, np.float32)])
    with pytest.raises(RuntimeCheckError, match="dtype float64, expected float32"):
        k.run([x, np.zeros(4), np.zeros(4, np.float32)])
    with pytest.raises(RuntimeCheckError, match="not C-contiguous"):
        k.run([x, np.zeros(8, np.float32)[::2], np.zeros(4, np.float32)])
    with pytest.raises(TypeError, match="expects 3 arrays and 1 sym values"):
        k([x], [4])


def test_sym_var_range_is_checked(cache: Path) -> None:
    n = tw.dim("n", max=8)
    x = te.placeholder((n,), "float32", "x")
    f = te.create_func([x, te.compute((n,), lambda i: x[i] + 1, "y")])
    with pytest.raises(RuntimeCheckError, match=r"n = 9 \(from argument 0 \(x\) shape\[0\]\) is outside its range \(>= 1, <= 8\)"):
        build_library({"f": f})["f"].run([np.zeros(9, np.float32), np.zeros(9, np.float32)])


def test_empty_library() -> None:
    lib = build_library({})
    assert len(lib) == 0 and lib.to_bytes() == b""
    assert len(CKernelModule.from_native(b"", lib.functions)) == 0


_CHILD = """
import json, sys
import numpy as np
import tilework
from tilework.codegen import CKernelModule
from tilework.runtime.kernels import KernelInfo
data = open(sys.argv[1], "rb").read()
table = {d["name"]: KernelInfo.from_dict(d) for d in json.load(open(sys.argv[2]))}
funcs = dict(tilework.parse(open(sys.argv[3]).read()).tensor_funcs()) if sys.argv[3] != "-" else None
lib = CKernelModule.from_native(data, table, funcs)
x, y, out = np.arange(6, dtype=np.float32), np.ones(6, np.float32), np.zeros(6, np.float32)
if funcs is None:
    lib["axpy"]([x, y, out], [6])
else:
    lib["axpy"].run([x, y, out])
print(json.dumps(out.tolist()))
"""


@pytest.mark.parametrize("form", ["table", "loop_ir"])
def test_library_reloads_from_native_bytes_in_a_fresh_process(cache: Path, tmp_path: Path, form: str) -> None:
    funcs = {"axpy": _axpy()}
    lib = build_library(funcs)
    so = tmp_path / "lib.so"
    so.write_bytes(lib.to_bytes())
    table = tmp_path / "table.json"
    table.write_text(json.dumps([info.to_dict() for info in lib.functions.values()]))
    loop_ir = "-"
    if form == "loop_ir":
        (tmp_path / "funcs.tir").write_text(str(tw.IRModule(funcs)))
        loop_ir = str(tmp_path / "funcs.tir")
    env = {**os.environ, "CC": "/nonexistent/cc", "TILEWORK_CACHE_DIR": str(tmp_path / "other-cache"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(so), str(table), loop_ir], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [float(v) * 2 + 1 for v in range(6)]
    assert list((tmp_path / "other-cache").glob("lib-*.so"))


def test_compile_error_in_generated_module_points_at_the_kernel(cache: Path) -> None:
    from tilework.codegen.c import emit_module

    mod = emit_module({"first": _axpy(), "second": _axpy(3.0)})
    lines = mod.text.splitlines()
    lo, hi = mod.lines["second"]
    assert lines[hi - 2].strip() == "return tw_err;"
    lines[hi - 2] = "    return tw_err +;"
    with pytest.raises(BuildError, match=rf"in kernel second:[\s\S]*>>{hi - 1:5d} \|     return tw_err \+;"):
        toolchain.compile_source("\n".join(lines) + "\n", mod.lines)


def test_unwritable_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(BuildError, match="set TILEWORK_CACHE_DIR to a writable directory"):
        build_library({"axpy": _axpy()})


_BUILD_AXPY = """
import numpy as np, tilework as tw
from tilework import te
from tilework.codegen import build_library
n = tw.dim("n")
x = te.placeholder((n,), "float32", "x"); y = te.placeholder((n,), "float32", "y")
out = te.compute((n,), lambda i: x[i] * 5.0 + y[i], "out")
lib = build_library({"axpy": te.create_func([x, y, out])})
a = np.zeros(3, np.float32); lib["axpy"].run([np.arange(3, dtype=np.float32), np.ones(3, np.float32), a])
print(a.tolist())
"""


def test_processes_building_the_same_kernels_at_once_compile_them_once(cache: Path, cc_log: Path, tmp_path: Path) -> None:
    slow = tmp_path / "slow-cc"  # the compiler takes a second: both processes want the library while it builds
    slow.write_text(f'#!/bin/sh\nsleep 1\nexec "{os.environ["CC"]}" "$@"\n')
    slow.chmod(0o700)
    env = {**os.environ, "CC": str(slow), "TILEWORK_HOLD_TEAM": "0"}  # (no team library built beside the kernels: tilework.runtime.team)
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD_AXPY], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    assert [o.strip() for o, _ in outs] == ["[1.0, 6.0, 11.0]"] * 2
    assert len(cc_log.read_text().splitlines()) == 1  # the second waited for the first's build and loaded it


def test_large_single_unit_is_optimized_in_parallel_only_where_gcc_can(monkeypatch: pytest.MonkeyPatch) -> None:
    cmd, flags, big = toolchain.compiler_command(), toolchain.compiler_flags(), "x" * toolchain.LTO_MIN_CHARS
    monkeypatch.setenv("TILEWORK_COMPILE_JOBS", "3")
    monkeypatch.setattr(toolchain, "_is_gcc", lambda cmd: True)
    assert toolchain._parallel_lto(cmd, flags, big) == ["-flto=3", "-flto-partition=balanced"]
    assert toolchain._parallel_lto(cmd, flags, big[:-1]) == []  # small: one process
    assert toolchain._parallel_lto(cmd, [*flags, "-fno-lto"], big) == []  # the user's flags decide
    monkeypatch.setenv("TILEWORK_COMPILE_JOBS", "1")
    assert toolchain._parallel_lto(cmd, flags, big) == []
    monkeypatch.setenv("TILEWORK_COMPILE_JOBS", "2")
    monkeypatch.setattr(toolchain, "_is_gcc", lambda cmd: False)  # clang's -flto means another thing
    assert toolchain._parallel_lto(cmd, flags, big) == []


def test_a_failing_parallel_build_falls_back_to_the_plain_one(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    real = toolchain._run_compiler

    def logged(argv: list[str], *rest: object) -> None:
        calls.append(argv)
        real(argv, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(toolchain, "_parallel_lto", lambda cmd, flags, source: ["-fno-such-option-for-lto"])
    monkeypatch.setattr(toolchain, "_run_compiler", logged)
    lib = build_library({"axpy": _axpy(5.0)})
    assert [("-fno-such-option-for-lto" in a) for a in calls] == [True, False]
    x, y, out = np.arange(5, dtype=np.float32), np.ones(5, np.float32), np.zeros(5, np.float32)
    lib["axpy"].run([x, y, out])
    np.testing.assert_allclose(out, x * 5 + 1)


def test_gcc_is_told_from_clang() -> None:
    import shutil

    gcc, clang = shutil.which("gcc"), shutil.which("clang")
    if gcc is None and clang is None:
        pytest.skip("neither gcc nor clang on PATH")
    if gcc is not None:
        assert toolchain._is_gcc((gcc,))
    if clang is not None:
        assert not toolchain._is_gcc((clang,))
    assert not toolchain._is_gcc(("/nonexistent/cc",))
