"""End to end: build once, run every shape; run-time checks; save/load; torch tensors; If."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import tilework as tw
from tilework import op
from tilework.errors import RuntimeCheckError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import GraphFunc, Var
from tilework.ir.info import TensorInfo
from tilework.models.numpy_ref import transformer_block_ref
from tilework.models.reference import TransformerConfig, random_weights, transformer_block

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def block() -> tuple:
    cfg = TransformerConfig(layers=2, hidden=32, heads=4, ffn=64)
    mod = transformer_block(cfg)
    return cfg, mod


def test_transformer_block_one_compile_every_shape(block: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    import tilework.codegen.c as c_target
    import tilework.driver as build_mod

    cfg, mod = block
    calls = []
    real = c_target.CpuTarget.build

    def counting(self: Any, funcs: Any) -> Any:  # the target's build: compiled, or from the cache
        calls.append(len(funcs))
        return real(self, funcs)

    monkeypatch.setattr(c_target.CpuTarget, "build", counting)
    exe = build_mod.build(mod)
    vm = tw.VM(exe)
    weights = random_weights(list(mod["main"].params[1:]))
    rng = np.random.default_rng(0)
    for batch, seq in [(1, 1), (1, 7), (2, 128), (4, 513)]:
        x = rng.standard_normal((batch, seq, cfg.hidden)).astype(np.float32)
        out = vm["main"](x, *weights)
        assert out.shape == (batch, seq, cfg.hidden)
        np.testing.assert_allclose(out, transformer_block_ref(x, weights, cfg), rtol=1e-4, atol=1e-4)
    assert len(calls) == 1, "exactly one compilation must serve every shape"


def _two_input_module() -> tw.IRModule:
    n = tw.dim("n", max=64)
    m = tw.dim("m")
    x = Var("x", TensorInfo((n, m), "float32"))
    y = Var("y", TensorInfo((m, n), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            t = bb.emit(op.permute_dims(y))
            r = bb.emit_output(op.add(x, t))
        bb.emit_func_output(r)
    return bb.get()


@pytest.fixture(scope="module")
def two_input_vm() -> object:
    return tw.VM(tw.build(_two_input_module()))


def test_two_input_numerics(two_input_vm: Any) -> None:
    vm = two_input_vm
    x = np.random.rand(3, 5).astype(np.float32)
    y = np.random.rand(5, 3).astype(np.float32)
    np.testing.assert_allclose(vm["main"](x, y), x + y.T)


@pytest.mark.parametrize(
    "args, message",
    [
        ((np.zeros((3, 5, 1), np.float32), np.zeros((5, 3), np.float32)), r"main: argument x expects a tensor of rank 2, got rank 3 \(shape \(3, 5, 1\)\)"),
        ((np.zeros((3, 5), np.int64), np.zeros((5, 3), np.float32)), r"main: argument x expects dtype float32, got int64"),
        ((np.zeros((3, 5), np.float32), np.zeros((5, 4), np.float32)), r"main: argument y: y.shape\[1\] = 4 but n = 3, bound by x.shape\[0\]"),
        ((np.zeros((3, 5), np.float32), np.zeros((6, 3), np.float32)), r"main: argument y: y.shape\[0\] = 6 but m = 5, bound by x.shape\[1\]"),
        ((np.zeros((65, 2), np.float32), np.zeros((2, 65), np.float32)), r"main: argument x: x.shape\[0\] = 65 but n <= 64"),
        ((np.zeros((0, 2), np.float32), np.zeros((2, 0), np.float32)), r"main: argument x: x.shape\[0\] = 0 but n >= 1"),
        ((np.zeros((3, 5), np.float32),), r"main takes 2 argument\(s\) \(x, y\), got 1"),
        (("not a tensor", np.zeros((5, 3), np.float32)), r"main: argument x expects a tensor, got str"),
    ],
)
def test_bad_input_messages(two_input_vm: object, args: tuple, message: str) -> None:
    with pytest.raises(RuntimeCheckError, match=message):
        two_input_vm["main"](*args)  # type: ignore[index]


def test_broadcast_check_at_run_time() -> None:
    n = tw.dim("n")
    x = Var("x", TensorInfo((2, 3), "float32"))
    y = Var("y", TensorInfo((2, n), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, y]):
        r = bb.emit(op.add(x, y))
        bb.emit_func_output(r)
    mod = bb.get()
    main = mod["main"]
    assert isinstance(main, GraphFunc) and main.ret_info == TensorInfo((2, 3), "float32")
    vm = tw.VM(tw.build(mod))
    a = np.random.rand(2, 3).astype(np.float32)
    for k in (1, 3):
        b = np.random.rand(2, k).astype(np.float32)
        np.testing.assert_allclose(vm["main"](a, b), a + b)
    with pytest.raises(RuntimeCheckError, match="add: dims 3 and n .* must be equal or 1"):
        vm["main"](a, np.zeros((2, 2), np.float32))


def test_data_dependent_if() -> None:
    n = tw.dim("n")
    c = Var("c", TensorInfo((), "bool"))
    x = Var("x", TensorInfo((n,), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [c, x]):
        r = bb.emit_if(c, lambda: op.exp(x), lambda: op.neg(x))
        bb.emit_func_output(r)
    vm = tw.VM(tw.build(bb.get()))
    x_ = np.random.rand(4).astype(np.float32)
    np.testing.assert_allclose(vm["main"](np.array(True), x_), np.exp(x_), rtol=1e-6)
    np.testing.assert_allclose(vm["main"](np.array(False), x_), -x_)


def test_torch_tensors_in_and_out(two_input_vm: object) -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional dependency")
    x = torch.rand(3, 5)
    y = torch.rand(5, 3)
    out = two_input_vm["main"](x, y)  # type: ignore[index]
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, x + y.T)


def test_save_load_in_fresh_process(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "m.tw")
    exe = tw.build(_two_input_module())
    exe.save(path)
    x = np.random.rand(4, 6).astype(np.float32)
    y = np.random.rand(6, 4).astype(np.float32)
    np.save(os.path.join(str(tmp_path), "x.npy"), x)
    np.save(os.path.join(str(tmp_path), "y.npy"), y)
    expected = tw.VM(exe)["main"](x, y)
    script = (
        "import numpy as np, tilework as tw, sys\n"
        f"d = {str(tmp_path)!r}\n"
        "vm = tw.VM(tw.load(d + '/m.tw'))\n"
        "out = vm['main'](np.load(d + '/x.npy'), np.load(d + '/y.npy'))\n"
        "np.save(d + '/out.npy', out)\n"
    )
    env = dict(os.environ, CC="/nonexistent/cc", PYTHONPATH=ROOT)  # loading must not compile
    subprocess.run([sys.executable, "-c", script], check=True, env=env)
    np.testing.assert_array_equal(np.load(os.path.join(str(tmp_path), "out.npy")), expected)


def test_cli_build_and_run(tmp_path: object) -> None:
    d = str(tmp_path)
    with open(os.path.join(d, "m.txt"), "w") as fh:
        fh.write(str(_two_input_module()))
    x = np.random.rand(2, 3).astype(np.float32)
    y = np.random.rand(3, 2).astype(np.float32)
    np.save(os.path.join(d, "x.npy"), x)
    np.save(os.path.join(d, "y.npy"), y)
    env = dict(os.environ, PYTHONPATH=ROOT)
    cli = [sys.executable, "-m", "tilework.cli"]
    r = subprocess.run([*cli, "build", os.path.join(d, "m.txt"), "-o", os.path.join(d, "m.tw")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [*cli, "run", os.path.join(d, "m.tw"), "--input", f"x={d}/x.npy", "--input", f"y={d}/y.npy", "--output", os.path.join(d, "out")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(os.path.join(d, "out", "output0.npy")), x + y.T)


def test_cli_mistakes_are_one_line_errors(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    """A user mistake is one line on stderr and exit status 2, no traceback (through
    ``tilework.cli.main`` in this process; test_cli_build_and_run runs the command itself)."""
    from tilework.cli import main

    d = str(tmp_path)
    tw.build(_two_input_module()).save(os.path.join(d, "m.tw"))
    np.save(os.path.join(d, "x.npy"), np.random.rand(2, 3).astype(np.float32))
    np.save(os.path.join(d, "y.npy"), np.random.rand(3, 2).astype(np.float32))

    def cli(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's --version and usage errors
            code = e.code if isinstance(e.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    code, _, err = cli("run", os.path.join(d, "m.tw"), "--input", f"x={d}/x.npy")
    assert code == 2 and "missing --input for parameter(s) y" in err and "Traceback" not in err
    code, _, err = cli("run", os.path.join(d, "m.tw"), "--input", f"x={d}/y.npy", "--input", f"y={d}/y.npy")
    assert code == 2 and "error: main: argument" in err and "Traceback" not in err
    code, _, err = cli("build", os.path.join(d, "missing.txt"), "-o", os.path.join(d, "x.tw"))
    assert code == 2 and "Traceback" not in err
    code, out, _ = cli("--version")
    assert code == 0 and out.startswith("tilework ")


def test_cli_runs_a_saved_compiled_model(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    """``tilework run`` on what ``CompiledModel.save`` wrote binds the stored weights: only the
    model's own inputs are asked for (it asked for an --input per weight)."""
    from tilework import nn
    from tilework.cli import main

    class Net(nn.Module):
        def __init__(self) -> None:
            self.fc = nn.Linear(8, 5)

        def forward(self, x: Any) -> Any:
            return nn.ops.gelu(self.fc(x))

    d = str(tmp_path)
    cm = tw.compile(Net().init_random(seed=4), {"x": nn.spec.Tensor([tw.dim("n", min=0, max=16), 8])}, runtime="vm")
    assert len(cm.weights) == 2
    cm.save(os.path.join(d, "model.tw"))
    for n in (0, 1, 7):
        x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
        np.save(os.path.join(d, "x.npy"), x)
        code = main(["run", os.path.join(d, "model.tw"), "--input", f"x={d}/x.npy", "--output", os.path.join(d, "out")])
        assert code == 0
        np.testing.assert_array_equal(np.load(os.path.join(d, "out", "output0.npy")), cm(x))
    capsys.readouterr()
    assert main(["run", os.path.join(d, "model.tw")]) == 2
    err = capsys.readouterr().err
    assert "missing --input for parameter(s) x of main" in err and "fc" not in err


def test_load_of_a_saved_compiled_model_points_to_compiled_model_load(tmp_path: object) -> None:
    """``tw.load`` of what ``CompiledModel.save`` wrote is the bare executable (the API stays);
    calling its ``main`` without the weights says to use ``CompiledModel.load``, which gives
    the callable model."""
    from tilework import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            self.fc = nn.Linear(4, 3)

        def forward(self, x: Any) -> Any:
            return self.fc(x)

    path = os.path.join(str(tmp_path), "model.tw")
    cm = tw.compile(Net().init_random(seed=5), {"x": nn.spec.Tensor([tw.dim("n"), 4])}, runtime="vm")
    cm.save(path)
    x = np.ones((3, 4), np.float32)
    exe = tw.load(path)
    assert isinstance(exe, tw.Executable)
    with pytest.raises(RuntimeCheckError, match=r"got 1; .*written by CompiledModel.save: tilework.CompiledModel.load"):
        tw.VM(exe)["main"](x)
    np.testing.assert_array_equal(tw.VM(exe)["main"](x, *cm.weights), cm(x))
    np.testing.assert_array_equal(tw.CompiledModel.load(path)(x), cm(x))
    plain = os.path.join(str(tmp_path), "m.tw")
    tw.build(_two_input_module()).save(plain)
    with pytest.raises(RuntimeCheckError) as err:
        tw.VM(tw.load(plain))["main"](x)
    assert "CompiledModel" not in str(err.value)
