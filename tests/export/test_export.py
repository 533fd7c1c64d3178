"""The ahead-of-time C export on a small model with symbolic dims: built through make and
through CMake with the system compiler, it gives the Python VM's outputs bit for bit at every
shape (its kernels are the VM's C text with the VM's flags), refuses bad inputs with the VM's
messages, and refuses library calls that have no C implementation at export."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tilework as tw
from tilework import op
from tilework.errors import RuntimeCheckError, TileworkError
from tilework.export import ExportError, build_export, export_c
from tilework.export.runner import ExportedModel
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.ir.sym import SymVar


def _module(lo: int = 1, pair: bool = False) -> Any:
    """``main(x [n, 16], y [n, 8], w [16, 8])`` with lo <= n <= 64 (static pools) and
    ``free(z [m, 8])`` with m >= lo unbounded (the pooled arena); with ``pair`` that function is
    ``pair`` and returns a tuple (the sums and ``-z``)."""
    n, m = SymVar("n", lo, 64), SymVar("m", lo, None)
    x, y, w = Var("x", TensorInfo((n, 16), "float32")), Var("y", TensorInfo((n, 8), "float32")), Var("w", TensorInfo((16, 8), "float32"))
    z = Var("z", TensorInfo((m, 8), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, y, w]):
        with bb.dataflow():
            h = bb.emit(op.add(op.gelu(op.matmul(op.multiply(x, x), w)), y))
            out = bb.emit_output(op.softmax(op.tanh(h), -1))
        bb.emit_func_output(out)
    with bb.function("pair" if pair else "free", [z]):
        with bb.dataflow():
            out2 = bb.emit_output(op.sum(op.exp(op.add(z, z)), axis=[1]))
            neg = bb.emit_output(op.neg(z)) if pair else None
        bb.emit_func_output((out2, neg) if neg is not None else out2)
    return bb.get()


W = np.random.default_rng(7).standard_normal((16, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    exe = tw.build(_module())
    out = tmp_path_factory.mktemp("export")
    export_c(exe, out, bind={"main": [W], "free": []})
    return exe, out


def _inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    return rng.standard_normal((n, 16)).astype(np.float32), rng.standard_normal((n, 8)).astype(np.float32)


def test_make_build_runs_the_c_program_bit_for_bit(exported: tuple[Any, Path], tmp_path: Path) -> None:
    exe, out = exported
    where = build_export(out, "make")
    vm = tw.VM(exe)
    for n in (1, 5, 64):
        x, y = _inputs(n)
        np.save(tmp_path / "x.npy", x)
        np.save(tmp_path / "y.npy", y)
        proc = subprocess.run([str(where / "tw_run"), str(out / "model.twb"), "main", "-o", str(tmp_path), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        np.testing.assert_array_equal(np.load(tmp_path / "output0.npy"), vm["main"](x, y, W))
    x, y = _inputs(3)
    np.save(tmp_path / "x.npy", x[:, :15].copy())
    proc = subprocess.run([str(where / "tw_run"), str(out / "model.twb"), "main", str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], capture_output=True, text=True)
    assert proc.returncode == 1 and "main: argument x: x.shape[1] = 15 but it must be 16" in proc.stderr


@pytest.fixture(scope="module")
def cmake_model(exported: tuple[Any, Path]) -> ExportedModel:
    _, out = exported
    return ExportedModel(build_export(out, "cmake"), out / "model.twb")


def test_cmake_build_through_ctypes_bit_for_bit(exported: tuple[Any, Path], cmake_model: ExportedModel) -> None:
    exe, _ = exported
    vm = tw.VM(exe)
    for n in (2, 33, 64):
        x, y = _inputs(n)
        (got,) = cmake_model.run("main", x, y)
        np.testing.assert_array_equal(got, vm["main"](x, y, W))
    for m in (1, 7, 1000):  # unbounded: the pooled arena, reused across calls
        z = np.random.default_rng(m).standard_normal((m, 8)).astype(np.float32)
        (got,) = cmake_model.run("free", z)
        np.testing.assert_array_equal(got, vm["free"](z))


def _vm_message(fn: Any, *args: Any) -> str:
    with pytest.raises(RuntimeCheckError) as info:
        fn(*args)
    return str(info.value)


@pytest.mark.parametrize(
    "case",
    ["inner dim", "above the bound", "n disagrees", "dtype", "rank"],
)
def test_bad_inputs_give_the_vms_messages(exported: tuple[Any, Path], cmake_model: ExportedModel, case: str) -> None:
    exe, _ = exported
    x, y = _inputs(4)
    x, y = {
        "inner dim": (x[:, :15].copy(), y),
        "above the bound": (np.zeros((65, 16), np.float32), np.zeros((65, 8), np.float32)),
        "n disagrees": (x, np.zeros((5, 8), np.float32)),
        "dtype": (x.astype(np.float64), y),
        "rank": (x[None], y),
    }[case]
    want = _vm_message(tw.VM(exe)["main"], x, y, W)
    got = _vm_message(cmake_model.run, "main", x, y)
    assert got == want
    assert "main: argument" in got


def test_argument_count_and_function_name(cmake_model: ExportedModel) -> None:
    x, _ = _inputs(2)
    with pytest.raises(RuntimeCheckError, match=r"main takes 2 argument\(s\) \(x, y\), got 1"):
        cmake_model.run("main", x)
    with pytest.raises(RuntimeCheckError, match="no function 'nope'"):
        cmake_model.run("nope", x)
    lib = cmake_model._lib  # the function table of tw_model.h
    lib.tw_model_function_name.restype = ctypes.c_char_p
    names = [lib.tw_model_function_name(i).decode() for i in range(lib.tw_model_num_functions())]
    assert names == ["main", "free"]
    assert [lib.tw_model_num_inputs(n.encode()) for n in names] == [2, 1] and lib.tw_model_num_inputs(b"nope") == -1


def test_weights_file_of_another_export_is_refused(exported: tuple[Any, Path], tmp_path: Path) -> None:
    exe, out = exported
    other = tmp_path / "other"
    export_c(exe, other, bind={"main": [W * 2], "free": []})  # same code, other weights: the same id
    ExportedModel(out / "build", other / "model.twb").close()
    mod = _module()
    exe2 = tw.build(mod, pipeline="O0")
    export_c(exe2, other, bind={"main": [W], "free": []})
    with pytest.raises(RuntimeCheckError, match="written for another export"):
        ExportedModel(out / "build", other / "model.twb")
    with pytest.raises(RuntimeCheckError, match="cannot open the weights file"):
        ExportedModel(out / "build", tmp_path / "missing.twb")


def _matmul_module() -> Any:
    n = SymVar("n", 1, 64)
    x, w = Var("x", TensorInfo((n, 32), "float32")), Var("w", TensorInfo((32, 16), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(op.relu(op.matmul(x, w)))
        bb.emit_func_output(out)
    return bb.get()


def test_torch_region_is_refused_at_export_naming_op_and_backend(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    exe = tw.build(_matmul_module(), backends="torch,codegen")
    with pytest.raises(ExportError, match=r"'torch\.matmul' \(op matmul, backend torch\).*--backends codegen,blas"):
        export_c(exe, tmp_path)


def test_onnxruntime_region_is_refused_naming_the_call_not_its_model(tmp_path: Path) -> None:
    """The region's serialized ONNX graph (an immediate of ~1 KB) is not the message: the call
    is refused before its arguments are translated, and a long immediate is cut where one is
    refused; ``explain`` of the model, which runs on the VM for that reason, says so briefly."""
    pytest.importorskip("onnxruntime")
    exe = tw.build(_matmul_module(), backends="onnxruntime,codegen")
    with pytest.raises(ExportError, match=r"'onnxruntime\.run' \(a region of ONNX MatMul, Relu, backend onnxruntime\).*--backends codegen,blas") as err:
        export_c(exe, tmp_path)
    assert len(str(err.value)) < 400
    from tilework.export.graph_c import ModuleText

    with pytest.raises(ExportError, match=r"the immediate 'AAAA.*\.\.\. \(1002 characters\) cannot be a value"):
        ModuleText().static_val("A" * 1000)
    cm = tw.compile(_matmul_module(), backends="onnxruntime,codegen")
    (line,) = [ln for ln in cm.explain().splitlines() if "runtime:" in ln]
    assert "the Python VM" in line and "onnxruntime.run" in line and len(line) < 400


def test_blas_region_exports_as_portable_c(tmp_path: Path) -> None:
    """The blas backend's calls become tilework's own C loops: a different summation order from
    OpenBLAS, so within float32 rounding (1e-6 relative to the largest output), not bitwise."""
    exe = tw.build(_matmul_module(), backends="blas,codegen")
    assert any(ins[2][0] == "extern" for ins in exe.functions["main"].code if ins[0] == "call")
    w = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)
    export_c(exe, tmp_path, bind={"main": [w]})
    model = ExportedModel(build_export(tmp_path, "make"), tmp_path / "model.twb")
    for n in (1, 9):
        x = np.random.default_rng(n).standard_normal((n, 32)).astype(np.float32)
        (got,) = model.run("main", x)
        want = tw.VM(exe)["main"](x, w)
        assert np.max(np.abs(got - want)) <= 1e-6 * np.max(np.abs(want))


def test_cli_export_writes_the_library(tmp_path: Path) -> None:
    from tilework.cli import main

    src = tmp_path / "m.txt"
    src.write_text(str(_matmul_module()))
    out = tmp_path / "lib"
    assert main(["export", str(src), "-o", str(out)]) == 0
    for name in ("model.c", "kernels.c", "tw_runtime.c", "tw_model.h", "model.twb", "CMakeLists.txt", "Makefile", "tw_run.c"):
        assert (out / name).exists(), name
    from tilework.codegen.c.toolchain import compiler_flags

    flags = [f for f in compiler_flags() if f != "-shared"]  # the VM's flags: the same bits
    assert f"TW_CFLAGS ?= {' '.join(flags)}" in (out / "Makefile").read_text()
    assert main(["export", str(tmp_path / "missing.txt"), "-o", str(out)]) == 2
    with pytest.raises(TileworkError):
        export_c(tw.build(_matmul_module()), out, bind={"nope": []})


def test_compiled_model_exports_with_its_weights_bound_and_from_its_file(tmp_path: Path) -> None:
    """``cm.export_c`` binds the weights the CompiledModel passes itself; ``tilework export`` of
    the saved file writes the same library."""
    from tilework import nn
    from tilework.cli import main

    class Net(nn.Module):
        def __init__(self) -> None:
            self.fc = nn.Linear(8, 4)

        def forward(self, x: Any) -> Any:
            return nn.ops.relu(self.fc(x))

    cm = tw.compile(Net().init_random(seed=1), {"x": nn.spec.Tensor([tw.dim("n", max=32), 8])})
    result = cm.export_c(str(tmp_path / "a"))
    assert result.functions == {"main": ("x",)}
    assert result.weights.stat().st_size >= sum(w.nbytes for w in cm.weights)
    cm.save(str(tmp_path / "m.tw"))
    assert main(["export", str(tmp_path / "m.tw"), "-o", str(tmp_path / "b")]) == 0
    for name in ("model.c", "kernels.c", "model.twb"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_one_model_per_thread_runs_concurrently(exported: tuple[Any, Path], cmake_model: ExportedModel) -> None:
    """The library keeps no mutable global state: models on two threads (ctypes lets go of the
    GIL during a call) give the single-threaded results."""
    import threading

    exe, out = exported
    models = [ExportedModel(out / "build", out / "model.twb") for _ in range(2)]
    vm = tw.VM(exe)["main"]
    shapes = [(n % 64) + 1 for n in range(0, 400, 7)]
    want = {n: vm(*_inputs(n), W) for n in shapes}
    bad: list[int] = []

    def work(model: ExportedModel, order: list[int]) -> None:
        for n in order:
            if not np.array_equal(model.run("main", *_inputs(n))[0], want[n]):
                bad.append(n)

    threads = [threading.Thread(target=work, args=(m, shapes[::step])) for m, step in zip(models, (1, -1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


def test_cli_export_of_an_llm_passes_precision_and_kv_dtype(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tilework export x.gguf --precision bf16 --kv-dtype float32`` exports the decoder in those
    formats (the export itself is covered by the long LLM export tests)."""
    import tilework.export.llm as export_llm
    from tilework.cli import main
    from tilework.export.aot import ExportResult

    seen: dict[str, object] = {}

    def fake_export(path: str, out_dir: str, **kw: object) -> ExportResult:
        seen.update(kw, path=path)
        return ExportResult(Path(out_dir), Path(out_dir) / "model.twb", {"decode": ("tokens",)}, ("model.c",), 0)

    monkeypatch.setattr(export_llm, "export_gguf", fake_export)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    assert main(["export", str(model), "-o", str(tmp_path / "out"), "--precision", "bf16", "--kv-dtype", "float32"]) == 0
    assert (seen["path"], seen["precision"], seen["kv_dtype"]) == (str(model), "bf16", "float32")
    with pytest.raises(SystemExit):
        main(["export", str(model), "-o", str(tmp_path / "out"), "--kv-dtype", "int4"])


def _error_of(lib: Any, handle: Any) -> str:
    return str(lib.tw_model_error(handle).decode())


def test_null_pointers_are_refused_naming_the_argument(exported: tuple[Any, Path], cmake_model: ExportedModel) -> None:
    """Every pointer of the C API may be NULL: the call returns -1 (or NULL) and the message
    names the argument (tw_model_error(NULL) for a call without a model), never a crash."""
    lib, handle = cmake_model._lib, cmake_model._handle
    lib.tw_model_num_inputs.argtypes = [ctypes.c_char_p]
    assert lib.tw_model_num_inputs(None) == -1 and _error_of(lib, None) == "tw_model_num_inputs: function is NULL"
    assert lib.tw_model_num_inputs(b"nope") == -1 and _error_of(lib, None) == "no function 'nope' in the model"
    x, y = _inputs(2)
    _, tensors, _ = cmake_model.prepare("main", x, y)
    outs = cmake_model._outputs
    assert lib.tw_model_run(None, b"main", tensors, 2, outs, 4) == -1
    assert _error_of(lib, None) == "tw_model_run: model is NULL" and lib.tw_model_error_kind(None) == 1
    calls = {
        "tw_model_run: function is NULL": (None, tensors, 2, outs, 4),
        "tw_model_run: inputs is NULL but num_inputs is 2": (b"main", None, 2, outs, 4),
        "tw_model_run: outputs is NULL but max_outputs is 4": (b"main", tensors, 2, None, 4),
    }
    for want, args in calls.items():
        assert lib.tw_model_run(handle, *args) == -1
        assert _error_of(lib, handle) == want
    assert lib.tw_model_run(handle, b"main", tensors, 2, None, 0) == 1  # no outputs asked for
    data = tensors[0].data
    tensors[0].data = None
    assert lib.tw_model_run(handle, b"main", tensors, 2, outs, 4) == -1
    assert _error_of(lib, handle) == "main: input 0 (x): data is NULL but its shape (2, 16) has 32 element(s)"
    big = (ctypes.c_int64 * 2)(2**62, 2**62)
    tensors[0].shape = ctypes.cast(big, ctypes.POINTER(ctypes.c_int64))
    assert lib.tw_model_run(handle, b"main", tensors, 2, outs, 4) == -1
    assert _error_of(lib, handle).endswith("data is NULL but its shape (4611686018427387904, 4611686018427387904) has more than 2^63 - 1 elements")
    empty = (ctypes.c_int64 * 2)(0, 16)  # no elements: NULL data is fine, the shape check speaks
    tensors[0].shape = ctypes.cast(empty, ctypes.POINTER(ctypes.c_int64))
    assert lib.tw_model_run(handle, b"main", tensors, 2, outs, 4) == -1
    assert _error_of(lib, handle) == "main: argument x: x.shape[0] = 0 but n >= 1"
    tensors[0].data, tensors[0].shape = data, None
    assert lib.tw_model_run(handle, b"main", tensors, 2, outs, 4) == -1
    assert _error_of(lib, handle) == "main: input 0 (x): shape is NULL but ndim is 2"
    tensors[0].shape = ctypes.cast(cmake_model._inputs.shapes[0], ctypes.POINTER(ctypes.c_int64))
    (got,) = cmake_model.run("main", x, y)  # the model runs on after the refusals
    np.testing.assert_array_equal(got, tw.VM(exported[0])["main"](x, y, W))
    assert lib.tw_model_create(None) is None and _error_of(lib, None) == "tw_model_create: weights_path is NULL"
    assert lib.tw_model_create_from_arrays(None, 1) is None
    assert _error_of(lib, None) == "tw_model_create_from_arrays: arrays is NULL but num_arrays is 1"


def _limits_module() -> Any:
    """``pool(x [1, 2, h, w])``: a 2x2 max pool, whose output dims h // 2 and w // 2 are checked
    at run time; ``big(s [2])`` and ``flat(s [2])``: zeros of shape (s[0], s[1]) and (s[0] * s[1],),
    dims read from a tensor (their byte size, or the dim itself, may overflow int64)."""
    from tilework.ir.info import ShapeInfo
    from tilework.op.shape import tensor_to_shape

    h, w, a, b = SymVar("h", 1, None), SymVar("w", 1, None), SymVar("a", 0, None), SymVar("b", 0, None)
    x = Var("x", TensorInfo((1, 2, h, w), "float32"))
    bb = BlockBuilder()
    with bb.function("pool", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.max_pool2d(x, 2))
        bb.emit_func_output(out)
    for name in ("big", "flat"):
        s = Var("s", TensorInfo((2,), "int64"))
        with bb.function(name, [s]):
            with bb.dataflow():
                bb.match_cast(bb.emit(tensor_to_shape(s)), ShapeInfo((a, b)))
                out = bb.emit_output(op.zeros((a, b) if name == "big" else (a * b,), "float32"))
            bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def limits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ExportedModel]:
    exe = tw.build(_limits_module())
    out = tmp_path_factory.mktemp("limits")
    export_c(exe, out)
    return exe, ExportedModel(build_export(out, "make"), out / "model.twb")


def test_dim_check_names_the_value_of_its_expression_as_the_vm_does(limits: tuple[Any, ExportedModel]) -> None:
    exe, model = limits
    vm = tw.VM(exe)
    for shape, want in (((1, 2, 1, 5), "h // 2 = 0"), ((1, 2, 3, 1), "w // 2 = 0")):
        x = np.ones(shape, np.float32)
        got = _vm_message(model.run, "pool", x)
        assert got == _vm_message(vm["pool"], x) == f"pool: max_pool2d: output spatial shape (h // 2, w // 2) must be positive: {want}"
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 5)).astype(np.float32)
    np.testing.assert_array_equal(model.run("pool", x)[0], vm["pool"](x))
    np.testing.assert_array_equal(vm["pool"](x), x[:, :, :2, :4].reshape(1, 2, 1, 2, 2, 2).max(axis=(3, 5)))


def test_sizes_that_overflow_int64_are_refused_as_the_vm_refuses_them(limits: tuple[Any, ExportedModel]) -> None:
    """An output of shape (2^32, 2^32) (2^66 bytes) crashed the library (its byte count
    wrapped); now it is refused with the VM's message, as is one too large to allocate."""
    exe, model = limits
    vm = tw.VM(exe)
    cases = {
        (2**32, 2**32): "out of memory: a float32 tensor of shape (4294967296, 4294967296) is too large (its byte size exceeds 2^63 - 1)",
        (2**30, 2**30): "out of memory: a tensor of 4611686018427387904 bytes",
    }
    for dims, want in cases.items():
        s = np.array(dims, np.int64)
        assert _vm_message(model.run, "big", s) == _vm_message(vm["big"], s) == want
    s = np.array((2**32, 2**32), np.int64)  # the derived dim a * b itself overflows int64 in C
    assert _vm_message(model.run, "flat", s) == "a derived dim overflows int64 (its value exceeds 2^63 - 1)"
    assert "is too large" in _vm_message(vm["flat"], s)
    for dims in ((0, 3), (1, 1), (3, 5)):
        s = np.array(dims, np.int64)
        np.testing.assert_array_equal(model.run("big", s)[0], np.zeros(dims, np.float32))
        np.testing.assert_array_equal(model.run("flat", s)[0], np.zeros(dims[0] * dims[1], np.float32))


def test_tw_run_refuses_a_bad_repeat_and_says_why_it_cannot_write(exported: tuple[Any, Path], tmp_path: Path) -> None:
    _, out = exported
    where = build_export(out, "make")
    x, y = _inputs(3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    run = [str(where / "tw_run"), str(out / "model.twb"), "main"]
    files = [str(tmp_path / "x.npy"), str(tmp_path / "y.npy")]
    for bad in ("abc", "-5", "1.5", "", "99999999999"):
        proc = subprocess.run([*run, "--repeat", bad, *files], capture_output=True, text=True)
        assert proc.returncode == 2 and f"--repeat takes a whole number of runs from 0 to 100000000, got '{bad}'" in proc.stderr
        assert "usage: tw_run" in proc.stderr
    proc = subprocess.run([*run, *files, "--repeat"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--repeat needs a value" in proc.stderr
    proc = subprocess.run([*run, "--repeat", "2", "-o", str(tmp_path), *files], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("median_us ")
    missing = tmp_path / "nodir" / "x"
    proc = subprocess.run([*run, "-o", str(missing), *files], capture_output=True, text=True)
    assert proc.returncode == 2 and f"cannot write {missing}/output0.npy: No such file or directory" in proc.stderr


def test_runtime_sources_compile_without_warnings(exported: tuple[Any, Path], tmp_path: Path) -> None:
    """The C the export writes compiles with its own flags plus -Wall -Wextra -Werror."""
    import re

    _, out = exported
    flags = re.search(r"^TW_CFLAGS \?= (.*)$", (out / "Makefile").read_text(), re.M)
    assert flags is not None
    for name in ("tw_runtime.c", "model.c", "tw_run.c"):
        proc = subprocess.run(["cc", *flags.group(1).split(), "-Wall", "-Wextra", "-Werror", "-fsyntax-only", str(out / name)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{name}:\n{proc.stderr}"
