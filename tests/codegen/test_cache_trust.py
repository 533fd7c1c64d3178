"""The kernel cache trusts nothing (tilework.codegen.cache): a truncated, swapped, planted or
garbage object is set aside with a warning and rebuilt, never loaded; the directory is private
and refused when others can write it; a warm cache needs no compiler; a read-only cache is used
read-only."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import tilework as tw
from tilework import op, te
from tilework.codegen import build_library, cache
from tilework.codegen.c import toolchain
from tilework.codegen.cache import CacheWarning
from tilework.errors import BuildError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.ir.loop import TensorFunc


def _axpy(scale: float) -> TensorFunc:
    n = tw.dim("n")
    x = te.placeholder((n,), "float32", "x")
    y = te.placeholder((n,), "float32", "y")
    out = te.compute((n,), lambda i: x[i] * scale + y[i], "out")
    return te.create_func([x, y, out])


def _check(lib: object, scale: float) -> None:
    x, y, out = np.arange(5, dtype=np.float32), np.ones(5, np.float32), np.zeros(5, np.float32)
    lib["axpy"].run([x, y, out])  # type: ignore[index]
    np.testing.assert_allclose(out, x * scale + 1)


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(d))
    return d


def _object(lib: object) -> Path:
    path = lib.path  # type: ignore[attr-defined]
    assert path is not None and path.exists()
    return Path(path)


def _rebuilt(scale: float, what: str) -> object:
    with pytest.warns(CacheWarning, match=what):
        lib = build_library({"axpy": _axpy(scale)})
    assert not lib.cache_hit  # type: ignore[attr-defined]
    _check(lib, scale)
    return lib


def test_directory_is_created_private(cache_root: Path) -> None:
    build_library({"axpy": _axpy(2.0)})
    assert stat.S_IMODE(cache_root.stat().st_mode) == 0o700


def test_truncated_object_is_set_aside_and_rebuilt(cache_root: Path) -> None:
    so = _object(build_library({"axpy": _axpy(2.0)}))
    so.write_bytes(so.read_bytes()[:1000])
    _rebuilt(2.0, "do not have the recorded SHA-256")
    assert list((cache_root / "bad").glob(so.name + ".*"))


def test_object_of_another_model_swapped_in_is_not_loaded(cache_root: Path) -> None:
    a = _object(build_library({"axpy": _axpy(2.0)}))
    b = _object(build_library({"axpy": _axpy(3.0)}))
    a.write_bytes(b.read_bytes())  # same symbols, other numbers
    _rebuilt(2.0, "recorded SHA-256")
    # a record pointing at the other model's object is not followed either
    rec = next(p for p in cache_root.glob("k-*.json") if json.loads(p.read_text()).get("object") == b.name)
    mine = next(p for p in cache_root.glob("k-*.json") if "object" in json.loads(p.read_text()) and p != rec)
    mine.write_text(rec.read_text())
    lib = build_library({"axpy": _axpy(2.0)})
    _check(lib, 2.0)
    _check(build_library({"axpy": _axpy(3.0)}), 3.0)  # and the other model's entry is intact


def test_planted_object_without_record_is_not_loaded(cache_root: Path) -> None:
    so = _object(build_library({"axpy": _axpy(2.0)}))
    other = _object(build_library({"axpy": _axpy(5.0)}))
    cache.record_path(so).unlink()
    so.write_bytes(other.read_bytes())
    _rebuilt(2.0, "no valid record")


def test_garbage_object_with_a_matching_record_is_rebuilt(cache_root: Path) -> None:
    so = _object(build_library({"axpy": _axpy(2.0)}))
    key = json.loads(cache.record_path(so).read_text())["key"]
    garbage = b"\x7fELF" + os.urandom(3000)
    so.write_bytes(garbage)
    cache.write_record(so, key, garbage)  # verifies, but does not load
    _rebuilt(2.0, "does not load")


def test_executable_load_survives_a_damaged_cache(cache_root: Path, tmp_path: Path) -> None:
    n = tw.dim("n")
    x = Var("x", TensorInfo((n,), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit_output(op.exp(x))
        bb.emit_func_output(r)
    exe = tw.build(bb.get())
    exe.save(str(tmp_path / "m.tw"))
    so = _object(exe.modules[0])
    so.write_bytes(so.read_bytes()[: len(so.read_bytes()) // 2])
    with pytest.warns(CacheWarning):
        loaded = tw.load(str(tmp_path / "m.tw"))
    v = np.linspace(0, 1, 7, dtype=np.float32)
    np.testing.assert_allclose(tw.VM(loaded)["main"](v), np.exp(v), rtol=1e-6)


def test_directory_writable_by_others_is_refused(cache_root: Path) -> None:
    cache_root.mkdir(mode=0o700)
    cache_root.chmod(0o777)
    with pytest.raises(BuildError, match="writable by other users.*chmod 700"):
        build_library({"axpy": _axpy(2.0)})
    cache_root.chmod(0o775)  # group-writable
    with pytest.raises(BuildError, match="refusing the cache directory"):
        cache.cache_dir()
    assert toolchain.lookup_loop_ir("0" * 64) is None  # a lookup finds nothing there


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_directory_of_another_user_is_refused(cache_root: Path) -> None:
    cache_root.mkdir(mode=0o700)
    os.chown(cache_root, 65534, 65534)
    with pytest.raises(BuildError, match="owned by another user"):
        build_library({"axpy": _axpy(2.0)})


def test_warm_cache_needs_no_compiler(cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_library({"axpy": _axpy(2.0)})
    n = tw.dim("n")
    x = Var("x", TensorInfo((n,), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit_output(op.tanh(x))
        bb.emit_func_output(r)
    tw.build(bb.get()).save(str(tmp_path / "m.tw"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    lib = build_library({"axpy": _axpy(2.0)})
    assert lib.cache_hit
    _check(lib, 2.0)
    v = np.linspace(-1, 1, 5, dtype=np.float32)
    np.testing.assert_allclose(tw.VM(tw.load(str(tmp_path / "m.tw")))["main"](v), np.tanh(v), rtol=1e-6)
    with pytest.raises(BuildError, match="no C compiler found"):
        build_library({"axpy": _axpy(7.0)})  # never built: needs the compiler


def test_read_only_cache_is_used_read_only(cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n = tw.dim("n")
    x = Var("x", TensorInfo((n,), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit_output(op.sigmoid(x))
        bb.emit_func_output(r)
    tw.build(bb.get()).save(str(tmp_path / "m.tw"))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in cache_root.iterdir())
    cache_root.chmod(0o500)
    if os.access(cache_root, os.W_OK):  # root writes anywhere: make the cache look read-only
        monkeypatch.setattr(cache, "writable", lambda root: False)
    try:
        v = np.linspace(-1, 1, 5, dtype=np.float32)
        np.testing.assert_allclose(tw.VM(tw.load(str(tmp_path / "m.tw")))["main"](v), 1 / (1 + np.exp(-v)), rtol=1e-6)
        with pytest.warns(CacheWarning, match="read-only"):
            lib = build_library({"axpy": _axpy(9.0)})  # new: built in a private scratch directory
        _check(lib, 9.0)
        assert _object(lib).parent != cache_root
        assert sorted((p.name, p.stat().st_mtime_ns) for p in cache_root.iterdir()) == before
    finally:
        cache_root.chmod(0o700)


DEAD_PID = 4194304 + 1  # above Linux's PID_MAX_LIMIT: no process has it


def test_scratch_directories_of_dead_processes_are_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process killed before its exit handlers ran leaves its scratch directory (the private
    copies of the objects it loaded, a read-only cache's builds). The next process that makes
    one removes those whose process is gone: of this user, this machine and PID namespace only;
    never a live process's, another user's, a link, a file, or one of the older name (no PID)."""
    tag = cache._host_tag()
    if tag is None:
        pytest.skip("no /proc here to tell this machine's processes from others'")

    def made(name: str) -> Path:
        d = tmp_path / name
        d.mkdir(mode=0o700)
        (d / "0123.so").write_bytes(b"\x7fELF")
        return d

    gone = made(f"tilework-scratch-{DEAD_PID}-{tag}-k1l2m3n4")
    kept = [
        made(f"tilework-scratch-{os.getppid()}-{tag}-a1b2c3d4"),  # a live process's (our parent)
        made(f"tilework-scratch-{os.getpid()}-{tag}-a1b2c3d4"),  # ours
        made(f"tilework-scratch-{DEAD_PID}-{'0' * 12 if tag != '0' * 12 else '1' * 12}-a1b2c3d4"),  # another machine's or namespace's
        made("tilework-scratch-q8w7e6r5"),  # the older name: whose, nobody can tell
        made(f"tilework-scratch-{DEAD_PID}-{tag}"),  # not a name mkdtemp makes
        made(f"tilework-scratch-{10 ** 30}-{tag}-a1b2c3d4"),  # not a PID os.kill takes
    ]
    link = tmp_path / f"tilework-scratch-{DEAD_PID}-{tag}-linklink"
    link.symlink_to(kept[0])
    file = tmp_path / f"tilework-scratch-{DEAD_PID}-{tag}-filefile"
    file.write_text("not a directory")
    if os.geteuid() == 0:
        kept.append(made(f"tilework-scratch-{DEAD_PID}-{tag}-otheruser"))
        os.chown(kept[-1], 65534, 65534)
    assert cache.sweep_scratch(tmp_path) == [gone]
    assert not gone.exists() and all((d / "0123.so").exists() for d in kept) and link.is_symlink() and file.is_file()

    # a process sweeps when it makes its own scratch directory, named with its PID and tag
    made(gone.name)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cache._scratch.cache_clear()
    try:
        mine = cache._scratch()
        assert mine.parent == tmp_path and mine.name.startswith(f"tilework-scratch-{os.getpid()}-{tag}-") and stat.S_IMODE(mine.stat().st_mode) == 0o700
        assert not gone.exists() and all(d.exists() for d in kept)
    finally:
        cache._scratch.cache_clear()  # the next use makes one in the real temporary directory again


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_has_a_scratch_directory_of_its_own(tmp_path: Path) -> None:
    """A forked child that exits normally runs the exit handlers it inherited: it removes its
    own scratch directory, never its parent's, which the parent still uses."""
    code = """
import os, sys
from tilework.codegen import cache
parent = cache._scratch()
pid = os.fork()
if pid == 0:
    print(cache._scratch(), flush=True)
    sys.exit(0)
os.waitpid(pid, 0)
print(parent, parent.is_dir(), flush=True)
"""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True).stdout.split()
    child, parent, parent_there = Path(out[0]), Path(out[1]), out[2]
    assert child != parent and child.parent == parent.parent == tmp_path
    assert parent_there == "True" and not child.exists() and not parent.exists()  # each removed its own at exit


def test_key_covers_the_tilework_version(monkeypatch: pytest.MonkeyPatch) -> None:
    cmd, flags = toolchain.compiler_command(), toolchain.compiler_flags()
    before = toolchain.cache_key("int x;", cmd, flags)
    monkeypatch.setattr(toolchain, "_tilework_version", lambda: "99.0")
    toolchain._emitter_identity.cache_clear()
    try:
        assert toolchain.cache_key("int x;", cmd, flags) != before
    finally:
        monkeypatch.undo()
        toolchain._emitter_identity.cache_clear()
    assert toolchain.cache_key("int x;", cmd, flags) == before


def test_concurrent_cold_builds_agree(cache_root: Path) -> None:
    import threading
    import warnings

    libs: list[object] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def build() -> None:
        start.wait()
        try:
            libs.append(build_library({"axpy": _axpy(4.0)}))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # no builder sees another's half-written entry
        threads = [threading.Thread(target=build) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for lib in libs:
            _check(lib, 4.0)
        again = build_library({"axpy": _axpy(4.0)})
    assert again.cache_hit
    _check(again, 4.0)


def test_target_finds_a_module_by_its_loop_ir_without_writing_c(cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tilework.codegen.c import CPU
    from tilework.codegen.c import module as c_module

    first = CPU.build({"axpy": _axpy(2.0)})
    assert not first.cache_hit
    _check(first, 2.0)

    def no_c(funcs: object) -> None:
        raise AssertionError("C was written for kernels the cache holds")

    with monkeypatch.context() as m:
        m.setattr(c_module, "emit_module", no_c)
        again = CPU.build({"axpy": _axpy(2.0)})
        assert again.cache_hit and again.key == first.key  # type: ignore[attr-defined]
        _check(again, 2.0)
        assert again["axpy"].func is not None  # type: ignore[attr-defined]  # the checked run has its TensorFunc
        with pytest.raises(AssertionError, match="C was written"):
            CPU.build({"axpy": _axpy(3.0)})  # other loop IR: not found by the digest
    so = _object(again)
    so.write_bytes(so.read_bytes()[:100])  # damaged behind its record: set aside, rebuilt
    with pytest.warns(CacheWarning):
        rebuilt = CPU.build({"axpy": _axpy(2.0)})
    _check(rebuilt, 2.0)


@pytest.mark.parametrize("changed", [("ir", "sym.py"), ("c", "hoist.py"), ("schedule", "reduction_primitives.py")])
def test_identity_covers_what_shapes_the_c(changed: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed simplification rule or emitter helper is a new identity: records keyed by loop
    IR (which every compile now looks up) then no longer apply."""
    before = toolchain._emitter_identity()
    real = Path.read_bytes

    def edited(self: Path) -> bytes:
        data = real(self)
        return data + b"\n# edited" if (self.parent.name, self.name) == changed else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    toolchain._emitter_identity.cache_clear()
    try:
        assert toolchain._emitter_identity() != before
    finally:
        monkeypatch.undo()
        toolchain._emitter_identity.cache_clear()
    assert toolchain._emitter_identity() == before
