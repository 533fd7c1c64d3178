"""Acceptance: the MLP, the MiniLM-shaped encoder and the Llama-shaped graph (small configs)
give the same results under each single backend (+ codegen for the rest) as under codegen
alone, at several sequence lengths including 1, from one compilation each."""

from __future__ import annotations

import importlib.util
from typing import Any, Callable

import numpy as np
import pytest

import tilework
from tilework.ir.graph import GraphFunc
from tilework.ir.module import IRModule
from tilework.models import reference as R
from tilework.backend.offload import OffloadByRules, offload_calls


def _missing(*mods: str) -> str | None:
    gone = [m for m in mods if importlib.util.find_spec(m) is None]
    return f"{', '.join(gone)} not installed" if gone else None


BACKENDS = [
    pytest.param(["blas", "codegen"], id="blas"),
    pytest.param(["torch", "codegen"], id="torch", marks=pytest.mark.skipif(_missing("torch") is not None, reason=f"torch backend: {_missing('torch')}")),
    pytest.param(
        ["onnxruntime", "codegen"],
        id="onnxruntime",
        marks=pytest.mark.skipif(_missing("onnx", "onnxruntime") is not None, reason=f"onnxruntime backend: {_missing('onnx', 'onnxruntime')}"),
    ),
]


def _mlp() -> tuple[IRModule, Callable[[np.random.Generator, int], list[np.ndarray]]]:
    return R.mlp(R.MLPConfig(hidden=32, ffn=96)), lambda rng, n: [rng.standard_normal((n, 32)).astype("float32")]


def _encoder() -> tuple[IRModule, Callable[[np.random.Generator, int], list[np.ndarray]]]:
    def inputs(rng: np.random.Generator, n: int) -> list[np.ndarray]:
        mask = np.zeros((1, 1, 1, n), "float32")
        mask[..., n - 1 :] = -1e4 if n > 1 else 0.0  # the last token padded out
        return [rng.standard_normal((1, n, 32)).astype("float32"), mask]

    return R.encoder(R.EncoderConfig(layers=2, hidden=32, heads=4, ffn=64)), inputs


def _llama() -> tuple[IRModule, Callable[[np.random.Generator, int], list[np.ndarray]]]:
    cfg = R.LlamaConfig(layers=2, hidden=32, heads=4, kv_heads=2, ffn=64)
    return R.llama_graph(cfg), lambda rng, n: [rng.standard_normal((1, n, 32)).astype("float32")]


MODELS = {"mlp": _mlp, "encoder": _encoder, "llama": _llama}
_REFERENCE: dict[str, Any] = {}


def _setup(name: str) -> tuple[IRModule, list[list[np.ndarray]], list[np.ndarray]]:
    """The model, its inputs at n = 1, 2, 5 (weights appended) and codegen's results."""
    if name not in _REFERENCE:
        mod, make = MODELS[name]()
        main = mod["main"]
        assert isinstance(main, GraphFunc)
        weights = R.random_weights(list(main.params[int(main.attrs["num_inputs"]) :]), seed=3)
        rng = np.random.default_rng(9)
        args = [make(rng, n) + weights for n in (1, 2, 5)]
        vm = tilework.VM(tilework.build(mod))
        _REFERENCE[name] = (mod, args, [vm["main"](*a) for a in args])
    return _REFERENCE[name]  # type: ignore[no-any-return]


@pytest.mark.parametrize("backends", BACKENDS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_single_backend_matches_codegen(model: str, backends: list[str]) -> None:
    mod, args, want = _setup(model)
    calls = offload_calls(OffloadByRules(tuple(backends))(mod))
    assert calls, f"{backends[0]} took nothing of {model}"
    vm = tilework.VM(tilework.build(mod, backends=backends))
    for a, w in zip(args, want):
        got = vm["main"](*a)
        np.testing.assert_allclose(got, w, rtol=2e-4, atol=2e-4)
