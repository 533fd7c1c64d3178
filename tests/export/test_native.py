"""Native graph code in process (``tilework.export.native``): the VM's bytecode as C, calling
the kernels the VM has loaded, gives the VM's outputs bit for bit at every shape (0, 1, odd,
the bound), refuses bad inputs with the VM's messages, holds no copy of the weights, and
refuses what it cannot run (a BLAS library call) so callers fall back to the VM."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
from tilework.errors import RuntimeCheckError
from tilework.export import ExportError
from tilework.export.native import NativeModel


def _module() -> Any:
    """``tests.export.test_export``'s module from n = 0, its second function returning a
    tuple."""
    from tests.export.test_export import _module as exported_module

    return exported_module(lo=0, pair=True)


W = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def built() -> tuple[Any, NativeModel]:
    exe = tw.build(_module())
    return exe, NativeModel(exe, bind={"main": [W], "pair": []})


@pytest.mark.parametrize("n", [0, 1, 7, 64])
def test_outputs_equal_the_vms_bit_for_bit(built: tuple[Any, NativeModel], n: int) -> None:
    exe, native = built
    vm = tw.VM(exe)
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal((n, 16)).astype(np.float32), rng.standard_normal((n, 8)).astype(np.float32)
    np.testing.assert_array_equal(native.bind("main")(x, y), vm["main"](x, y, W))
    z = rng.standard_normal((2 * n + 1, 8)).astype(np.float32)
    got, want = native.bind("pair")(z), vm["pair"](z)
    assert isinstance(got, tuple) and len(got) == 2
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_graph_functions_compile_in_units_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """With two compile jobs the two graph functions go to two C units, compiled side by side
    (what they share declared hidden, the import slots defined in the first): the outputs of
    the one-unit build and the VM's, bit for bit."""
    from tilework.export.aot import arrays_of, model_units
    from tilework.export.native import _kernel_sources

    exe = tw.build(_module())
    kernels, _ = _kernel_sources(exe)
    arrays, bound = arrays_of(exe, {"main": [W], "pair": []})
    texts, _ = model_units(exe, kernels, arrays, bound, imported=True, parts=4)
    assert len(texts) == 2 and sum("int tw_native_set_import" in t for t in texts) == 1
    assert all("TW_PRIVATE int twf_0(" in t and "TW_PRIVATE int twf_1(" in t for t in texts)  # declared in both, defined in one
    one, _ = model_units(exe, kernels, arrays, bound, imported=True, parts=1)
    assert len(one) == 1 and "TW_PRIVATE" not in one[0]
    builds = []
    for jobs in ("1", "2"):
        monkeypatch.setenv("TILEWORK_COMPILE_JOBS", jobs)
        builds.append(NativeModel(exe, bind={"main": [W], "pair": []}))
    vm = tw.VM(exe)
    x, y = np.ones((5, 16), np.float32), np.full((5, 8), 0.5, np.float32)
    for native in builds:
        np.testing.assert_array_equal(native.bind("main")(x, y), vm["main"](x, y, W))
        for g, w in zip(native.bind("pair")(y), vm["pair"](y)):
            np.testing.assert_array_equal(g, w)


def test_bad_inputs_give_the_vms_messages(built: tuple[Any, NativeModel]) -> None:
    exe, native = built
    for x, y in [(np.zeros((3, 15), np.float32), np.zeros((3, 8), np.float32)), (np.zeros((65, 16), np.float32), np.zeros((65, 8), np.float32))]:
        with pytest.raises(RuntimeCheckError) as vm_err:
            tw.VM(exe)["main"](x, y, W)
        with pytest.raises(RuntimeCheckError) as native_err:
            native.bind("main")(x, y)
        assert str(native_err.value) == str(vm_err.value)
    with pytest.raises(ExportError, match="no function 'nope'"):
        native.bind("nope")


def test_weights_are_used_in_place() -> None:
    """The model reads the bound array where it is: no copy is made (a change shows)."""
    exe = tw.build(_module())
    w = W.copy()
    native = NativeModel(exe, bind={"main": [w]})
    x, y = np.ones((2, 16), np.float32), np.zeros((2, 8), np.float32)
    before = native.bind("main")(x, y)
    w *= 2
    after = native.bind("main")(x, y)
    np.testing.assert_array_equal(after, tw.VM(exe)["main"](x, y, w))
    assert not np.array_equal(before, after)


def test_a_second_build_comes_from_the_cache(built: tuple[Any, NativeModel]) -> None:
    exe, _ = built
    assert NativeModel(exe, bind={"main": [W], "pair": []}).cache_hit


def test_models_with_the_same_graph_code_keep_their_own_kernels() -> None:
    """Two models whose graph code is the same text (so the same library bytes) but whose
    kernels differ (an rms_norm's eps is in its kernel): each runs its own kernels. Their
    import tables are globals of the library, so each model loads a copy of its own; the
    loader handed both the first copy once, and the first model ran the second's kernels."""
    from tilework.ir.builder import BlockBuilder
    from tilework.ir.graph import Var
    from tilework.ir.info import TensorInfo
    from tilework.ir.sym import SymVar

    def module(eps: float) -> Any:
        n = SymVar("n", 0, 64)
        x, w = Var("x", TensorInfo((n, 8), "float32")), Var("w", TensorInfo((8,), "float32"))
        bb = BlockBuilder()
        with bb.function("main", [x, w]):
            with bb.dataflow():
                out = bb.emit_output(tw.op.rms_norm(x, w, eps=eps))
            bb.emit_func_output(out)
        return bb.get()

    exes = [tw.build(module(eps)) for eps in (1e-6, 100.0)]
    natives = [NativeModel(exe) for exe in exes]
    x, w = np.ones((3, 8), np.float32), np.ones(8, np.float32)
    got = [native.run("main", x, w)[0] for native in natives]
    for exe, g in zip(exes, got):
        np.testing.assert_array_equal(g, tw.VM(exe)["main"](x, w))
    assert not np.array_equal(got[0], got[1])


def test_blas_library_call_is_refused() -> None:
    """The VM calls OpenBLAS for the blas backend's regions; native code has no such call."""
    from tests.export.test_export import _matmul_module

    exe = tw.build(_matmul_module(), backends="blas,codegen")
    with pytest.raises(ExportError, match=r"'blas\.f32\.\w+' cannot run in process"):
        NativeModel(exe)


def test_compiled_model_runs_natively_and_switches_back() -> None:
    """``tw.compile(..., runtime="native")`` gives the VM's bits at n = 0, 1 and odd n, a
    0-d input included; ``cm.runtime`` switches; a bad name is refused naming the choices."""
    from tilework import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            self.fc = nn.Linear(8, 5)

        def forward(self, x: Any, s: Any) -> Any:
            return nn.ops.gelu(self.fc(x)) * s

    spec = {"x": nn.spec.Tensor([tw.dim("n", min=0, max=32), 8]), "s": nn.spec.Tensor([])}
    cm = tw.compile(Net().init_random(seed=2), spec, runtime="native")
    assert cm.runtime == "native" and "runtime: native graph code" in cm.explain()
    vm = tw.compile(Net().init_random(seed=2), spec, runtime="vm")
    assert vm.runtime == "vm" and "runtime: the Python VM" in vm.explain()
    for n in (0, 1, 9, 32):
        x, s = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32), np.float32(1.5)
        np.testing.assert_array_equal(cm(x, np.asarray(s)), vm(x, np.asarray(s)))
    cm.runtime = "vm"
    np.testing.assert_array_equal(cm(x, np.asarray(s)), vm(x, np.asarray(s)))
    with pytest.raises(tw.errors.UnsupportedError, match="runtime must be one of auto, vm, native"):
        cm.runtime = "jit"



def _net_and_spec() -> tuple[Any, Any]:
    from tilework import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            self.fc = nn.Linear(8, 5)

        def forward(self, x: Any) -> Any:
            return nn.ops.gelu(self.fc(x))

    return Net().init_random(seed=3), {"x": nn.spec.Tensor([tw.dim("n", min=0, max=16), 8])}


def test_auto_runs_natively_where_it_can_and_says_why_not_elsewhere(tmp_path: Any) -> None:
    """``runtime="auto"`` (the default): native graph code for a model of tilework's kernels;
    the VM, with the reason in ``runtime_note`` and ``explain``, for a model with a blas region
    (a library call native code does not make) and for a model read from a file (its kernel
    calls are checked on the VM), where ``runtime="native"`` is refused unless the file is
    trusted. The results are the same bits on every runtime."""
    net, spec = _net_and_spec()
    x = np.random.default_rng(0).standard_normal((7, 8)).astype(np.float32)
    auto = tw.compile(net, spec)
    assert auto.runtime == "native" and auto.runtime_note == ""
    vm = tw.compile(net, spec, runtime="vm")
    np.testing.assert_array_equal(auto(x), vm(x))
    blas = tw.compile(net, spec, backends="blas,codegen")
    assert blas.runtime == "vm" and "cannot run in process" in blas.runtime_note
    assert "runtime: the Python VM; " in blas.explain()
    np.testing.assert_allclose(blas(x), vm(x), rtol=1e-5, atol=1e-6)
    path = str(tmp_path / "net.tw")
    auto.save(path)
    loaded = tw.CompiledModel.load(path)
    assert loaded.runtime == "vm" and "trust_native" in loaded.runtime_note
    np.testing.assert_array_equal(loaded(x), vm(x))
    with pytest.raises(tw.errors.UnsupportedError, match="trust_native=True"):
        tw.CompiledModel.load(path, runtime="native")
    with pytest.raises(tw.errors.UnsupportedError, match="trust_native=True"):
        loaded.runtime = "native"


def test_arrays_of_another_shape_are_refused_by_the_library(built: tuple[Any, NativeModel]) -> None:
    """``tw_model_create_from_arrays`` checks each array against the one the library was made
    for (the C API a host calls directly)."""
    from tilework.export.runner import tensors_of

    _, native = built
    arrays = list(native._arrays)
    good, _keep = tensors_of(arrays)
    handle = native._lib.tw_model_create_from_arrays(good, len(arrays))
    assert handle
    native._lib.tw_model_free(handle)
    k = next(i for i, a in enumerate(arrays) if a.ndim == 2)
    arrays[k] = np.zeros((arrays[k].shape[0], arrays[k].shape[1] + 1), arrays[k].dtype)
    bad, _keep = tensors_of(arrays)
    assert not native._lib.tw_model_create_from_arrays(bad, len(arrays))
    assert f"array {k} differs" in native._lib.tw_model_error(None).decode()
    assert not native._lib.tw_model_create_from_arrays(good, len(arrays) - 1)
    assert "arrays given" in native._lib.tw_model_error(None).decode()


def test_an_input_given_as_the_bits_of_its_dtype() -> None:
    """``bind(..., bits={i: dtype})``: a uint16 array at position ``i`` is the bfloat16 (or
    float16) it holds the bits of, as the typed array is; another width is refused, naming the
    input; a typed array there is taken as it is."""
    import ml_dtypes

    from tilework import op
    from tilework.ir.builder import BlockBuilder
    from tilework.ir.graph import Var
    from tilework.ir.info import TensorInfo
    from tilework.ir.sym import SymVar

    n = SymVar("n", 0, 64)
    for name, typed in [("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)]:
        x = Var("x", TensorInfo((n, 5), name))
        bb = BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(op.multiply(op.astype(x, "float32"), op.astype(x, "float32")))
            bb.emit_func_output(out)
        exe = tw.build(bb.get())
        native = NativeModel(exe)
        for rows in (0, 1, 7):
            values = np.random.default_rng(rows).standard_normal((rows, 5)).astype(typed)
            want = tw.VM(exe)["main"](values)
            np.testing.assert_array_equal(native.bind("main", {0: name})(values.view(np.uint16)), want)
            np.testing.assert_array_equal(native.bind("main", {0: name})(values), want)
        with pytest.raises(RuntimeCheckError, match=f"input 0 should hold the bits of {name}"):
            native.bind("main", {0: name})(np.zeros((2, 5), np.uint32))
        with pytest.raises(RuntimeCheckError, match=f"argument x expects dtype {name}, got uint16"):
            native.bind("main")(np.zeros((2, 5), np.uint16))  # without bits=, uint16 is uint16


def test_torch_inputs_are_taken_as_the_vm_takes_them() -> None:
    """Native graph code converts torch tensors as the VM does (``runtime.tensor.host_array``):
    one that requires grad, a transposed one, and n = 0, 1, odd run and match torch; a bf16
    tensor, a meta tensor and None get the VM's messages (they were raw torch/NumPy errors)."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU()).eval()
    args, dims = (torch.randn(4, 6),), ({0: torch.export.Dim("batch", max=64)},)
    native = tw.compile(model, args, dynamic_shapes=dims, runtime="native")
    vm = tw.compile(model, args, dynamic_shapes=dims, runtime="vm")
    assert native.runtime == "native" and vm.runtime == "vm"
    good = [torch.randn(n, 6, requires_grad=True) for n in (0, 1, 7)] + [torch.randn(6, 3).t()]
    for x in good:
        with torch.no_grad():
            want = model(x)
        for cm in (native, vm):
            got = cm(x)
            assert isinstance(got, torch.Tensor) and got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for bad, match in [(torch.randn(3, 6, dtype=torch.bfloat16), "expects dtype float32, got bfloat16"),
                       (torch.empty(3, 6, device="meta"), "tensor on meta given to the CPU runtime"),
                       (None, "expects a tensor, got NoneType None")]:  # fmt: skip
        with pytest.raises(RuntimeCheckError, match=match) as vm_err:
            vm(bad)
        with pytest.raises(RuntimeCheckError, match=match) as native_err:
            native(bad)
        assert str(native_err.value) == str(vm_err.value)


@pytest.mark.parametrize("fmt", __import__("tilework.backend.quant", fromlist=["FORMATS"]).FORMATS)
def test_every_quant_format_runs_natively_as_in_the_vm(fmt: str) -> None:
    """Each of the quant library's formats, alone and with its residual add fused
    (``quant.linear.<fmt>``, ``quant.linear_add.<fmt>``), in native graph code: the VM's bits
    (what an LLM whose file holds that format decodes with by default)."""
    from tests.backend.helpers import K_QUANT_HALVES, k_quant_blocks, module
    from tilework import op
    from tilework.backend import quant as Q
    from tilework.ir.sym import SymVar
    from tilework.op.quant import interleave_rows, quant_format

    rng = np.random.default_rng(7)
    n, k = 32, 256
    base = fmt.removesuffix("x16")
    if base in K_QUANT_HALVES:
        w = k_quant_blocks(rng, base, n, k)
    elif base in ("bf16", "f16"):  # finite weights: random bits below the exponent's top
        w = rng.integers(0, 256, (n, 2 * k), dtype=np.uint8)
        w[:, 1::2] &= 0x3B
    else:  # random blocks with finite fp16 d (and m: q4_1, q5_1)
        w = rng.integers(0, 256, (n, Q.row_bytes(base, k)), dtype=np.uint8)
        blocks = w.reshape(n, -1, quant_format(base).nbytes)
        for at in (0, 2) if base in ("q4_1", "q5_1") else (0,):
            blocks[:, :, at : at + 2] = (rng.standard_normal((n, blocks.shape[1], 1)) * 0.01).astype(np.float16).view(np.uint8)
    if fmt != base:
        w = interleave_rows(w, base)
    rows = SymVar("m", 1)
    for add in (False, True):
        params = [("x", (rows, k), "float32"), ("w", w.shape, "uint8")] + [("r", (rows, n), "float32")] * add
        mod = module(params, lambda x, wv, *r: op.add(op.quant_linear(x, wv, fmt, k), r[0]) if r else op.quant_linear(x, wv, fmt, k))
        exe = tw.build(mod, backends=["quant", "codegen"])
        native = NativeModel(exe)
        for m in (1, 9):
            args = [rng.standard_normal((m, k)).astype(np.float32), w] + [rng.standard_normal((m, n)).astype(np.float32)] * add
            want = tw.VM(exe)["main"](*args)
            assert np.isfinite(want).all()
            np.testing.assert_array_equal(native.bind("main")(*args), want)
