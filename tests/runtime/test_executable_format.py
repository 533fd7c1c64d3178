"""The data-only executable format: what a file holds, bit-exact reloads, and files that try to
smuggle code or are damaged. Loading runs nothing from a file unless the user opts in.

The long tier (``TILEWORK_LONG_TESTS=1``) adds the encoder to the loop-IR rebuild test (the
transformer block runs by default)."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
from tilework import op
from tilework.codegen.c import emit_function
from tilework.codegen.interp import source as interp_source
from tilework.errors import BuildError, TileworkError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import GraphFunc, Var
from tilework.ir.info import TensorInfo
from tilework.ir.loop import Block, Buffer, For, IterVar, Load, Store, TensorFunc
from tilework.runtime.archive import Archive, ArchiveWriter, FormatError
from tilework.runtime.executable import load_file
from tests.long import long_param

ROOT = str(Path(__file__).resolve().parents[2])


def _module() -> tw.IRModule:
    n = tw.dim("n", max=64)
    x = Var("x", TensorInfo((n, 8), "float32"))
    w = Var("w", TensorInfo((8, 8), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(op.matmul(x, w))
            z = bb.emit(op.add(op.exp(y), bb.emit(op.reshape(x, (n, 8)))))
            out = bb.emit_output(op.gelu(z))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    exe = tw.build(_module())
    path = str(tmp_path_factory.mktemp("fmt") / "m.tw")
    exe.save(path)
    return path, exe


def _inputs(n: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)


def _rewrite(src: str, dst: str, edit: Callable[[dict[str, Any], list[bytes]], None]) -> None:
    """Copy the file at ``src`` to ``dst`` with ``edit(meta, sections)`` applied, as a forger
    would: the digest in the header is recomputed, so only the content checks can object."""
    ar = Archive(src)
    meta = {k: v for k, v in ar.meta.items() if k != "sections"}
    sections = [bytes(ar.section(i)) for i in range(len(ar.meta["sections"]))]
    edit(meta, sections)
    w = ArchiveWriter()
    for i, data in enumerate(sections):
        w.add_bytes(ar.meta["sections"][i]["name"] if i < len(ar.meta["sections"]) else f"s{i}", data)
    w.write(dst, meta)


def test_the_file_is_data_sections_and_reloads_bit_for_bit(saved: tuple[str, Any]) -> None:
    path, exe = saved
    with open(path, "rb") as f:
        head = f.read(8)
    assert head == b"\x89TWEXE\r\n"
    ar = Archive(path)
    assert ar.meta["kind"] == "tilework.executable"
    assert all(isinstance(ins, list) for f in ar.meta["functions"] for ins in f["code"])  # bytecode as data
    loop_ir = ar.text(ar.meta["kernels"]["loop_ir"])
    assert "@tensor" in loop_ir  # loop-level functions as text IR
    back = tw.load(path)
    x, w = _inputs()
    np.testing.assert_array_equal(tw.VM(back)["main"](x, w), tw.VM(exe)["main"](x, w))
    assert [c.tobytes() for c in back.constants] == [c.tobytes() for c in exe.constants]


def test_loading_needs_no_compiler_with_a_warm_cache_and_says_what_to_do_without_one(saved: tuple[str, Any], tmp_path: Path) -> None:
    path, exe = saved
    x, w = _inputs(3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", w)
    script = (
        "import sys, numpy as np, tilework as tw\n"
        "from tilework.errors import BuildError\n"
        f"d = {str(tmp_path)!r}\n"
        "try:\n"
        f"    exe = tw.load({path!r}, trust_native=sys.argv[1] == 'trust')\n"
        "except BuildError as e:\n"
        "    print('BUILD-ERROR', e); sys.exit(3)\n"
        "np.save(d + '/out.npy', tw.VM(exe)['main'](np.load(d + '/x.npy'), np.load(d + '/w.npy')))\n"
    )
    want = tw.VM(exe)["main"](x, w)
    warm = dict(os.environ, CC="/nonexistent/cc", PYTHONPATH=ROOT)
    subprocess.run([sys.executable, "-c", script, "plain"], check=True, env=warm)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), want)
    cold = dict(warm, TILEWORK_CACHE_DIR=str(tmp_path / "empty-cache"))
    proc = subprocess.run([sys.executable, "-c", script, "plain"], env=cold, capture_output=True, text=True)
    assert proc.returncode == 3 and "trust_native=True" in proc.stdout and "no C compiler" in proc.stdout
    subprocess.run([sys.executable, "-c", script, "trust"], check=True, env=cold)  # the explicit opt-in
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), want)


_MARKER_SO = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE* f = fopen(getenv("TW_MARKER"), "w");
    if (f) { fputs("ran", f); fclose(f); }
}
"""


def test_native_code_in_a_file_runs_only_with_trust_native(saved: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = saved
    src = tmp_path / "planted.c"
    src.write_text("#include <stdlib.h>\n" + _MARKER_SO)
    so = tmp_path / "planted.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    forged = str(tmp_path / "forged.tw")

    def plant(meta: dict[str, Any], sections: list[bytes]) -> None:
        sections[meta["kernels"]["modules"][0]["native"]] = so.read_bytes()

    _rewrite(path, forged, plant)
    marker = tmp_path / "marker"
    monkeypatch.setenv("TW_MARKER", str(marker))
    exe = tw.load(forged)  # kernels rebuilt from the loop IR: the planted object is never loaded
    x, w = _inputs()
    tw.VM(exe)["main"](x, w)
    assert not marker.exists()
    with pytest.raises(TileworkError):  # opting in loads it (and it lacks the kernels)
        tw.load(forged, trust_native=True)
    assert marker.read_text() == "ran"


def test_a_pickle_is_never_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "pickled"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(marker), "w"))

    old = tmp_path / "old.tw"  # the former format: a zip of pickles
    with zipfile.ZipFile(old, "w") as zf:
        zf.writestr("manifest.json", json.dumps({"format": 1}))
        zf.writestr("bytecode.pkl", pickle.dumps(Payload()))
    with pytest.raises(FormatError, match="format 1.*never loads pickles"):
        tw.load(str(old))
    assert not marker.exists()


def test_other_zip_archives_are_named_not_called_old_executables(tmp_path: Path) -> None:
    """Only a zip with format 1's manifest and pickles is an old executable: a torch.export
    program is named as one (build it first), an .npz as one, any other zip as not a tilework
    executable (each used to be "an executable of format 1 ... written by an older tilework")."""
    npz = tmp_path / "a.npz"
    np.savez(npz, a=np.ones(3))
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("readme.txt", "hello")
        zf.writestr("manifest.json", "{}")
    for path, message in [(npz, "is a NumPy .npz archive, not a tilework executable"), (other, "is a zip archive, not a tilework executable")]:
        with pytest.raises(FormatError, match=message) as err:
            tw.load(str(path))
        assert "format 1" not in str(err.value)
    torch = pytest.importorskip("torch")
    pt2 = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(3, 2), (torch.ones(1, 3),)), str(pt2))
    with pytest.raises(FormatError, match=r"'.*mlp.pt2' is a torch.export program \(.pt2\), not a tilework executable: compile it first \(tilework build "):
        tw.load(str(pt2))


@pytest.mark.parametrize(
    "case, edit, message",
    [
        ("unknown library", lambda m, s: m["functions"][0]["code"].insert(0, ["call", 0, "extern", "os.system", [["i", "echo hi"]]]), "library function 'os.system', which is not registered here"),
        ("unknown builtin", lambda m, s: m["functions"][0]["code"].insert(0, ["call", 0, "builtin", "__import__", [["i", "os"]]]), "VM builtin '__import__', which does not exist"),
        ("unknown target", lambda m, s: m["kernels"]["modules"][0].update(target="../../evil"), "no kernel target '../../evil'"),
        ("register out of range", lambda m, s: m["functions"][0]["code"].insert(0, ["ret", 10**6]), "register 1000000 is not an int"),
        ("backward jump", lambda m, s: m["functions"][0]["code"].insert(0, ["goto", 0]), "jump target"),
        ("section outside the file", lambda m, s: m["constants"].append({"section": 10**6, "dtype": "float32", "shape": [1]}), "missing section"),
        ("wrong array size", lambda m, s: m["constants"].append({"section": 0, "dtype": "float32", "shape": [10**9]}), "needs 4000000000 bytes"),
        ("code in metadata", lambda m, s: m.update(meta={"__reduce__": "os.system"}), None),
    ],
)
def test_a_forged_file_runs_nothing_and_says_why(saved: tuple[str, Any], tmp_path: Path, case: str, edit: Callable[..., None], message: str | None) -> None:
    path, _ = saved
    forged = str(tmp_path / "forged.tw")
    _rewrite(path, forged, edit)
    if message is None:  # metadata is data: a key that looks like code is just a key
        assert tw.load(forged).meta["__reduce__"] == "os.system"
        return
    with pytest.raises(TileworkError) as info:
        tw.load(forged)
    assert message in str(info.value) and "forged.tw" in str(info.value), str(info.value)


def test_damaged_files_are_named_with_the_problem(saved: tuple[str, Any], tmp_path: Path) -> None:
    path, _ = saved
    data = Path(path).read_bytes()
    cases = {
        "empty": (b"", "is empty"),
        "truncated": (data[: len(data) // 2], "truncated"),
        "corrupt": (data[:200] + bytes([data[200] ^ 0xFF]) + data[201:], "corrupt"),
        "text": (b"hello, not an executable at all" * 4, "not a tilework executable"),
        "newer": (data[:8] + (99).to_bytes(4, "little") + data[12:], "version 99, written by a newer tilework"),
    }
    for name, (content, message) in cases.items():
        p = tmp_path / f"{name}.tw"
        p.write_bytes(content)
        with pytest.raises(FormatError, match=message) as info:
            tw.load(str(p))
        assert f"{name}.tw" in str(info.value)
    with pytest.raises(TileworkError, match="cannot read"):
        tw.load(str(tmp_path / "missing.tw"))


def test_compiled_model_metadata_is_checked(tmp_path: Path) -> None:
    cm = tw.compile(tw.IRModule({"main": _plain_main()}))
    path = str(tmp_path / "cm.tw")
    cm.save(path)
    back = tw.CompiledModel.load(path)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(back(x), cm(x))
    assert load_file(path).extra["kind"] == "tilework.compiled_model"
    with pytest.raises(TileworkError, match="plain executable"):
        tw.CompiledModel.load(_plain_exe(tmp_path))


def _plain_main() -> Any:
    n = tw.dim("n")
    x = Var("x", TensorInfo((n, 4), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.exp(x))
        bb.emit_func_output(out)
    return bb.get()["main"]


def _plain_exe(tmp_path: Path) -> str:
    path = str(tmp_path / "plain.tw")
    tw.build(_module()).save(path)
    return path


def test_names_in_the_ir_never_become_code() -> None:
    """A block or buffer name is data (it may come from a file): generated C and Python hold it
    only in sanitized comments."""
    a = Buffer("a", (4,), "float32")
    b = Buffer("b", (4,), "float32")
    i = tw.dim("i")
    vi = tw.dim("vi")
    evil = 'x */ system("rm -rf /"); /* \n import os; os.system("x") #'
    body = For(i, 4, Block(evil, (IterVar(vi, 4, "spatial", i),), (a,), (b,), Store(b, (vi,), Load(a, (vi,)))))
    func = TensorFunc((a, b), body, 1)
    c_code = re.sub(r"/\*.*?\*/", "", emit_function(func, "tw_k", evil), flags=re.S)
    py_code = re.sub(r"#[^\n]*", "", interp_source(func))
    for code in (c_code, py_code):
        assert "system" not in code and "import" not in code and "rm -rf" not in code
    out = np.zeros(4, np.float32)
    tw.codegen.interp.run(func, [np.arange(4, dtype=np.float32), out])
    np.testing.assert_array_equal(out, np.arange(4))


def test_saving_is_atomic_and_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "m.tw"
    path.write_bytes(b"old")
    exe = tw.build(_module())
    exe.save(str(path))
    assert Archive(str(path)).meta["kind"] == "tilework.executable"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_a_build_error_names_the_file(saved: tuple[str, Any], tmp_path: Path) -> None:
    path, _ = saved
    forged = str(tmp_path / "badir.tw")

    def break_ir(meta: dict[str, Any], sections: list[bytes]) -> None:
        sections[meta["kernels"]["loop_ir"]] = b"@tensor\ndef (((\n"

    _rewrite(path, forged, break_ir)
    with pytest.raises(TileworkError, match="badir.tw.*loop IR does not parse"):
        tw.load(forged)
    assert issubclass(FormatError, TileworkError) and not issubclass(BuildError, FormatError)


@pytest.mark.parametrize("model", ["transformer", long_param("encoder", why="a second model (the transformer block runs by default)")])
def test_loop_ir_from_the_file_rebuilds_the_same_kernels(model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the cache's shortcut the loaded file's loop IR is parsed and compiled again:
    the C is the same text and the outputs are bit-identical. (encoder: long tier only.)"""
    from tilework.codegen.c import toolchain
    from tilework.models.reference import EncoderConfig, TransformerConfig, encoder, random_weights, transformer_block

    if model == "transformer":
        mod = transformer_block(TransformerConfig(layers=2, hidden=32, heads=4, ffn=64))
    else:
        mod = encoder(EncoderConfig(layers=2, hidden=32, heads=4, ffn=64))
    exe = tw.build(mod)
    path = str(tmp_path / "m.tw")
    exe.save(path)
    monkeypatch.setattr(toolchain, "lookup_loop_ir", lambda digest: None)
    back = tw.load(path)
    assert back.modules[0].source() == exe.modules[0].source()
    main = mod["main"]
    assert isinstance(main, GraphFunc)
    params = main.params
    rng = np.random.default_rng(3)
    n_in = 1 if model == "transformer" else 2
    weights = random_weights(list(params[n_in:]))
    args = [rng.standard_normal((2, 7, 32)).astype(np.float32)]
    if model == "encoder":
        args.append(np.zeros((2, 1, 1, 7), np.float32))
    want = tw.VM(exe)["main"](*args, *weights)
    got = tw.VM(back)["main"](*args, *weights)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert a.tobytes() == b.tobytes()
